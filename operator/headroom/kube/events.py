"""Kubernetes Events for every decision, reclaim and bad input, posted off the hot path.

Decisions must not wait for Events: the recorder queues them and a few workers
post them in the background. The queue is bounded; when a storm overflows it,
Events are dropped and counted rather than slowing admissions or growing memory.

Events are a courtesy, not the record: Kubernetes itself treats them as lossy
(they expire after an hour, and the API server may refuse them under load). The
record of a decision is the Reservation's status and its ``Admitted`` condition,
which the operator rewrites until it lands. So a crash with Events still queued
loses those Events (a SIGKILL in a 3,000-reservation burst once left about 1,000
decisions without one), and no decision, capacity or status is lost with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Literal

from headroom.api.parse import format_time
from headroom.api.reasons import EventReason, Reason
from headroom.api.refs import ObjectRef
from headroom.kube.clock import Clock, SystemClock
from headroom.kube.transport import ApiError, ApiUnavailableError, Transport, resource_path

log = logging.getLogger(__name__)
COMPONENT = "headroom-operator"


class EventRecorder:
    def __init__(
        self,
        transport: Transport,
        *,
        clock: Clock | None = None,
        capacity: int = 10_000,
        workers: int = 4,
        instance: str | None = None,
    ) -> None:
        self._client = transport
        self._clock = clock or SystemClock()
        self._queue: asyncio.Queue[tuple[ObjectRef, str, str, str]] = asyncio.Queue(capacity)
        self._workers = workers
        self._tasks: list[asyncio.Task[None]] = []
        self._instance = instance or socket.gethostname()
        self.dropped = 0
        self.posted = 0

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def record(
        self,
        ref: ObjectRef,
        reason: Reason | EventReason,
        message: str,
        type_: Literal["Normal", "Warning"] = "Normal",
    ) -> None:
        """Queue an Event; never blocks, never raises. Its reason is a member of either
        closed set (each documented in docs/reference/events.md), posted as its word."""
        try:
            self._queue.put_nowait((ref, str(reason), message[:1024], type_))
        except asyncio.QueueFull:
            self.dropped += 1

    def start(self) -> None:
        if self._tasks:
            return  # started already (kopf retries a start-up that failed half-way)
        self._tasks = [
            asyncio.create_task(self._work(), name=f"event-poster-{i}")
            for i in range(self._workers)
        ]

    async def stop(self, drain_timeout: float = 2.0) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), drain_timeout)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            ref, reason, message, type_ = await self._queue.get()
            try:
                await self._post(ref, reason, message, type_)
                self.posted += 1
            except (ApiError, ApiUnavailableError) as error:
                log.warning("event %s on %s/%s not posted: %s", reason, ref.kind, ref.name, error)
            except Exception:  # a worker must survive anything and keep draining
                log.exception("event %s on %s/%s not posted", reason, ref.kind, ref.name)
            finally:
                self._queue.task_done()

    async def _post(self, ref: ObjectRef, reason: str, message: str, type_: str) -> None:
        namespace = ref.namespace or "default"
        now = format_time(self._clock.now())
        involved = {
            "apiVersion": ref.api_version,
            "kind": ref.kind,
            "name": ref.name,
            "uid": ref.uid,
        }
        if ref.namespace:
            involved["namespace"] = ref.namespace
        body = {
            "metadata": {"generateName": f"{ref.name[:200]}.", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": COMPONENT},
            "reportingComponent": f"headroom.dev/{COMPONENT}",
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._client.create(resource_path("", "v1", "events", namespace), body)
