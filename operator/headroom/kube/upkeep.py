"""Background upkeep: reclaim, deletion after retention, NodeHeadroom summaries, resync.

One sweeper task serves every reservation, instead of a kopf timer per object:
kopf timers put a finalizer on each object (so deletion would wait for the
operator) and cost a task each, while the ledger already keeps a time-ordered
index that says when the next entry can go stale or expire. The sweeper sleeps
until then (or one sweep period, whichever is first) and is woken early when an
admission brings a nearer deadline. Reclaim therefore happens at the deadline,
well within "stale window + one sweep period".

Summaries are coalesced: admissions only mark a node dirty; a flusher writes
each dirty node's NodeHeadroom at most once per ``summaryInterval`` and only
when its figures changed, so a burst of 1,000 admissions on one node costs one
or two writes, not 1,000.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

import aiohttp

from headroom.api.config import OperatorConfig
from headroom.api.constants import API_VERSION
from headroom.api.reasons import Reason
from headroom.kube.client import JSON, ApiError, KubeClient, resource_path, retrying
from headroom.kube.events import EventRecorder, ObjectRef
from headroom.kube.headroom import headroom_status
from headroom.kube.metrics import OperatorMetrics
from headroom.kube.state import State, Tracked
from headroom.kube.status import (
    reclaimed_status,
    reservation_path,
    reservation_ref,
    timestamp,
    write_status,
)

log = logging.getLogger(__name__)
GROUP, VERSION = API_VERSION.split("/")
_MIN_SLEEP = 0.05


class Upkeep:
    def __init__(
        self,
        state: State,
        client: KubeClient,
        events: EventRecorder,
        metrics: OperatorMetrics,
        config: OperatorConfig,
    ) -> None:
        self._state, self._client, self._events = state, client, events
        self._metrics, self._config = metrics, config
        self._wake = asyncio.Event()
        self._planned: datetime | None = None
        self._deletions: list[tuple[datetime, str, str, str]] = []  # (when, ns, name, uid)
        self._written: dict[str, JSON] = {}
        self._unbuildable: dict[str, str] = {}  # node -> why its summary could not be built
        self._tasks: list[asyncio.Task[None]] = []
        self._pending_writes: set[asyncio.Task[None]] = set()
        state.on_admitted = self._on_admitted

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._sweep_forever(), name="sweeper"),
            asyncio.create_task(self._flush_forever(), name="summaries"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pending_writes:
            await asyncio.gather(*self._pending_writes, return_exceptions=True)

    # -- reclaim -------------------------------------------------------------------------

    def _on_admitted(self, entry: object) -> None:
        deadline = self._state.ledger.next_deadline()
        if deadline is not None and (self._planned is None or deadline < self._planned):
            self._wake.set()

    def schedule_deletion(
        self, namespace: str, name: str, uid: str, reclaimed_at: datetime
    ) -> None:
        when = reclaimed_at + self._config.reclaimed_retention
        heapq.heappush(self._deletions, (when, namespace, name, uid))

    async def _sweep_forever(self) -> None:
        while True:
            try:
                self.sweep(datetime.now(UTC))
            except Exception:  # the sweeper must outlive any single bad entry
                log.exception("sweep failed; retrying next period")
            now = datetime.now(UTC)
            candidates = [now + self._config.sweep_period]
            if (deadline := self._state.ledger.next_deadline()) is not None:
                candidates.append(deadline)
            if self._deletions:
                candidates.append(self._deletions[0][0])
            self._planned = min(candidates)
            delay = max((self._planned - now).total_seconds(), _MIN_SLEEP)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()

    def sweep(self, now: datetime) -> None:
        """Reclaim what is stale or expired, delete what outlived retention."""
        state = self._state
        for reclaimed in state.ledger.reclaim(now):
            tracked = state.untrack(reclaimed.entry.id)
            if tracked is not None:
                self.reclaim(tracked, reclaimed.reason, reclaimed.message, now)
        while self._deletions and self._deletions[0][0] <= now:
            _, namespace, name, uid = heapq.heappop(self._deletions)
            self._spawn(self._delete(namespace, name, uid))
        state.dirty_nodes.update(state.ledger.nodes())

    def reclaim(self, tracked: Tracked, reason: Reason, message: str, now: datetime) -> None:
        """Record a reclaim whose capacity the ledger already returned."""
        self._metrics.reclaims.labels(str(reason)).inc()
        self._spawn(self._write_reclaimed(tracked, reason, message, now))

    async def _write_reclaimed(
        self, tracked: Tracked, reason: Reason, message: str, now: datetime
    ) -> None:
        status = reclaimed_status(reason, message, now)
        try:
            await retrying(
                lambda: write_status(
                    self._client, tracked.namespace, tracked.name, tracked.uid, status
                )
            )
        except ApiError as error:
            if not (error.not_found or error.status == 422):
                log.warning(
                    "reclaim of %s/%s not written: %s", tracked.namespace, tracked.name, error
                )
            return
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            log.warning("reclaim of %s/%s not written: %s", tracked.namespace, tracked.name, error)
            return
        self._events.record(
            reservation_ref(tracked.namespace, tracked.name, tracked.uid),
            str(reason),
            message,
            "Warning",
        )
        self.schedule_deletion(tracked.namespace, tracked.name, tracked.uid, now)

    async def _delete(self, namespace: str, name: str, uid: str) -> None:
        try:
            await retrying(lambda: self._client.delete(reservation_path(namespace, name), uid=uid))
        except ApiError as error:
            if not (error.not_found or error.conflict):
                log.warning("reclaimed %s/%s not deleted: %s", namespace, name, error)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            log.warning("reclaimed %s/%s not deleted: %s", namespace, name, error)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._pending_writes.add(task)
        task.add_done_callback(self._pending_writes.discard)

    # -- NodeHeadroom summaries -------------------------------------------------------------

    async def _flush_forever(self) -> None:
        interval = self._config.summary_interval.total_seconds()
        while True:
            await asyncio.sleep(interval)
            try:
                await self.flush()
            except Exception:
                log.exception("summary flush failed; retrying next interval")

    async def flush(self) -> None:
        """Write every dirty node's NodeHeadroom whose figures changed.

        Each node's summary is built on its own: one that cannot be built (a figure
        past its bound) is skipped with a Warning Event on its Node, and the others
        are still written.
        """
        state, now = self._state, datetime.now(UTC)
        dirty, state.dirty_nodes = state.dirty_nodes, set()
        writes = []
        for node in dirty:
            if node not in state.node_uids:
                continue  # no Node object (yet): nothing to own the summary
            try:
                status = headroom_status(state.ledger, node, now)
            except Exception as error:
                self._summary_failed(node, error)
                continue
            self._unbuildable.pop(node, None)
            if self._written.get(node) == status:
                continue
            writes.append(self._write_summary(node, status, now))
        results = await asyncio.gather(*writes, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("NodeHeadroom write failed: %s", result)

    def _summary_failed(self, node: str, error: Exception) -> None:
        message = f"NodeHeadroom {node} not updated: {error}"[:1024]
        if self._unbuildable.get(node) != message:  # one Event per distinct problem
            self._unbuildable[node] = message
            log.warning("%s", message)
            self._events.record(
                ObjectRef("v1", "Node", node, self._state.node_uids.get(node, "")),
                "SummaryNotWritten",
                message,
                "Warning",
            )

    async def _write_summary(self, node: str, status: JSON, now: datetime) -> None:
        path = resource_path(GROUP, VERSION, "nodeheadrooms", None, node)
        body = {"status": {**status, "updatedAt": timestamp(now)}}
        try:
            await self._client.merge_patch(f"{path}/status", body)
        except ApiError as error:
            if not error.not_found:
                self._state.dirty_nodes.add(node)
                raise
            await self._create_summary(node)
            await self._client.merge_patch(f"{path}/status", body)
        self._written[node] = status

    async def _create_summary(self, node: str) -> None:
        owner = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": node,
            "uid": self._state.node_uids[node],
        }
        body = {
            "apiVersion": API_VERSION,
            "kind": "NodeHeadroom",
            "metadata": {"name": node, "ownerReferences": [owner]},
        }
        try:
            await self._client.create(resource_path(GROUP, VERSION, "nodeheadrooms"), body)
        except ApiError as error:
            if not error.conflict:
                raise

    async def delete_orphan_summaries(self) -> None:
        """Delete NodeHeadrooms whose Node is gone or was replaced (a new uid).

        The DELETED event of a Node removed while the operator was down is never
        seen, and clusters without a garbage collector run (or a slow one) keep
        its NodeHeadroom; this catches them at start-up and at every resync.
        """
        path = resource_path(GROUP, VERSION, "nodeheadrooms")
        items, _ = await self._client.list_all(path)
        for item in items:
            meta = item.get("metadata") or {}
            name, uid = meta.get("name", ""), meta.get("uid", "")
            node_uid = self._state.node_uids.get(name)
            owners = {o.get("uid") for o in meta.get("ownerReferences") or []}
            if node_uid is not None and node_uid in owners:
                continue
            log.info("NodeHeadroom %s has no Node (or an older one's); deleted", name)
            self._written.pop(name, None)
            if node_uid is not None:
                self._state.dirty_nodes.add(name)  # written again for the Node that is there
            try:
                await self._client.delete(f"{path}/{name}", uid=uid)
            except ApiError as error:
                if not (error.not_found or error.conflict):
                    raise

    async def delete_summary(self, node: str) -> None:
        """A Node went away: its NodeHeadroom goes too (no garbage collector is assumed)."""
        self._written.pop(node, None)
        with contextlib.suppress(ApiError):
            await self._client.delete(resource_path(GROUP, VERSION, "nodeheadrooms", None, node))

    def forget_written(self) -> None:
        self._written.clear()
