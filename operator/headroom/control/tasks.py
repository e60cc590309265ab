"""Short-lived background work a component starts and must cancel when it stops.

asyncio keeps only weak references to tasks, so a task nobody holds can vanish
mid-flight; this set holds them until they end, and ``stop`` cancels what is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

#: How long ``stop`` waits for cancelled tasks to unwind (shutdown stays bounded).
_STOP_WAIT_SECONDS = 2.0


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_WAIT_SECONDS)
