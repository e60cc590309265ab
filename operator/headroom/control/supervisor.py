"""Every long-lived task is watched: if one ends, the process says why and exits.

A watch, the decider, the sweeper or the lease holder that dies silently leaves
an operator that answers its probes and decides nothing — the worst kind of
failure, because nothing restarts it. Instead, the first unexpected end marks
the process unhealthy (``/healthz`` fails), logs the reason, and calls
``on_failure``, which stops the operator with a non-zero exit so that the
Deployment restarts it (the restart rebuilds the ledger from the API).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, on_failure: Callable[[str], None] = lambda reason: None) -> None:
        self._on_failure = on_failure
        self._tasks: dict[asyncio.Task[Any], str] = {}
        self._stopping = False
        self.failure: str | None = None

    @property
    def healthy(self) -> bool:
        return self.failure is None

    def spawn(self, name: str, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a task that must run as long as the operator does."""
        task = asyncio.create_task(coroutine, name=name)
        self._tasks[task] = name
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        name = self._tasks.pop(task, task.get_name())
        if self._stopping:
            return
        if task.cancelled():
            reason = f"task {name} was cancelled"
        elif (error := task.exception()) is not None:
            reason = f"task {name} died: {error!r}"
            log.critical(reason, exc_info=error)
        else:
            reason = f"task {name} ended"
        if self.failure is None:
            self.failure = reason
            log.critical("%s; stopping the operator so that it is restarted", reason)
            self._on_failure(reason)

    async def stop(self, wait_at_most: float = 5.0) -> None:
        """Cancel every task and wait for them, at most ``wait_at_most`` seconds."""
        self._stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=wait_at_most)
            for task in pending:
                log.warning("task %s did not stop within %.0fs", task.get_name(), wait_at_most)
