"""NodeHeadroom (one per Node) and the queue positions of waiting reservations, coalesced.

A NodeHeadroom carries its Node's labels, so that placement code that may read
NodeHeadrooms but not Nodes (a tenant) can still select them
(``kubectl headroom fit -l gpu=a100``, ``kubectl get nodeheadrooms -l …``).

Decisions only mark a node dirty; a flusher writes each dirty node's NodeHeadroom
at most once per ``summaryInterval`` and only when its figures changed, so a
burst of 1,000 admissions on one node costs one or two writes, not 1,000. Each
node's summary is built on its own: one that cannot be built (a figure past its
bound) is skipped with a Warning Event on its Node, and the others are written.

A flush sends at most ``MAX_FLUSH_WRITES_IN_FLIGHT`` writes at a time: a flush
after a burst over many nodes is hundreds of writes, and sent all at once they
took the connection pool and the API server in front of the decisions' own
status writes (a tenant's decision waiting behind another tenant's summaries).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any

from headroom.api.config import OperatorConfig
from headroom.api.constants import API_VERSION
from headroom.api.paths import NODE_HEADROOMS, node_headroom_path, reservation_path
from headroom.api.reasons import EventReason
from headroom.api.refs import ObjectRef
from headroom.control.state import Record, State
from headroom.kube.clock import Clock
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport, list_all
from headroom.objects.status import set_position, timestamp
from headroom.objects.summary import headroom_status

log = logging.getLogger(__name__)
MAX_POSITION_WRITES = 200
MAX_FLUSH_WRITES_IN_FLIGHT = 4


async def _bounded(
    writes: list[Coroutine[Any, Any, None]], limit: int
) -> list[BaseException | None]:
    """Run ``writes`` at most ``limit`` at a time, in order; each one's exception or None."""
    gate = asyncio.Semaphore(limit)

    async def one(write: Coroutine[Any, Any, None]) -> None:
        async with gate:
            await write

    return await asyncio.gather(*(one(w) for w in writes), return_exceptions=True)


class Summaries:
    def __init__(
        self,
        state: State,
        transport: Transport,
        events: EventRecorder,
        clock: Clock,
        config: OperatorConfig,
        *,
        may_act: Callable[[], bool] = lambda: True,
        time_left: Callable[[], float] = lambda: 30.0,
    ) -> None:
        self._state, self._transport, self._events = state, transport, events
        self._clock, self._config = clock, config
        self._may_act, self._time_left = may_act, time_left
        self._written: dict[str, JSON] = {}
        self._written_labels: dict[str, dict[str, str]] = {}
        self._unbuildable: dict[str, str] = {}  # node -> why its summary could not be built

    async def run(self) -> None:
        """Flush forever (a supervised task)."""
        interval = self._config.summary_interval.total_seconds()
        while True:
            await asyncio.sleep(interval)
            try:
                await self.flush()
            except Exception:
                log.exception("summary flush failed; retrying next interval")

    async def flush(self) -> None:
        """Write every dirty node's NodeHeadroom whose figures changed."""
        state, now = self._state, self._clock.now()
        dirty = state.take_dirty()
        writes = []
        for node in sorted(dirty):  # sorted: the simulation replays the same order
            if node not in state.node_uids:
                continue  # no Node object (yet): nothing to own the summary
            try:
                status = headroom_status(state.ledger, node, now, state.gpu_sources.get(node))
            except Exception as error:
                self._unbuildable_summary(node, error)
                continue
            self._unbuildable.pop(node, None)
            labels = state.node_labels.get(node, {})
            if self._written.get(node) == status and self._written_labels.get(node) == labels:
                continue
            writes.append(self._write(node, status, now))
        writes += self._positions(sorted(dirty))
        results = await _bounded(writes, MAX_FLUSH_WRITES_IN_FLIGHT)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("NodeHeadroom write failed: %s", result)

    def _positions(self, nodes: list[str]) -> list[Coroutine[Any, Any, None]]:
        """Move the ``queuePosition`` of waiting reservations whose place changed.

        At most ``MAX_POSITION_WRITES`` per flush, front of each queue first: when a
        burst moves a long queue, the ones about to be admitted learn it first and the
        rest a flush or two later, instead of one burst of writes competing with the
        decisions themselves.
        """
        state = self._state
        writes: list[Coroutine[Any, Any, None]] = []
        for node in nodes:
            for number, waiting in enumerate(state.ledger.waiting.on(node), 1):
                record = state.waiting_record(waiting.entry.id)
                if record is None or record.decision.position == number:
                    continue
                if not record.confirmed:  # its decision, when written, carries the new place
                    record.decision.position = number
                    continue
                if len(writes) >= MAX_POSITION_WRITES:
                    state.mark_dirty(node)  # the rest at the next flush
                    break
                record.decision.position = number
                writes.append(self._write_position(record, node, number))
        return writes

    async def _write_position(self, record: Record, node: str, number: int) -> None:
        if not self._may_act():
            return
        path = reservation_path(record.namespace, record.name, "status")
        try:
            async with asyncio.timeout(min(self._time_left(), 30.0)):
                await self._transport.json_patch(
                    path, set_position(record.uid, record.decision.decision_id, number)
                )
        except (ApiError, ApiUnavailableError, TimeoutError) as error:
            if record.decision.position == number:
                record.decision.position = None  # written again at a later flush
            self._state.mark_dirty(node)
            log.debug("queuePosition of %s not written: %s", record.entry_id, error)

    def _unbuildable_summary(self, node: str, error: Exception) -> None:
        message = f"NodeHeadroom {node} not updated: {error}"[:1024]
        if self._unbuildable.get(node) != message:  # one Event per distinct problem
            self._unbuildable[node] = message
            log.warning("%s", message)
            self._events.record(
                ObjectRef("v1", "Node", node, self._state.node_uids.get(node, "")),
                EventReason.SUMMARY_NOT_WRITTEN,
                message,
                "Warning",
            )

    async def _write(self, node: str, status: JSON, now: datetime) -> None:
        """Write one summary; only while this process may act (a deposed leader's
        ledger is stale), and only as long as it may."""
        body = {"status": {**status, "updatedAt": timestamp(now)}}
        path = node_headroom_path(node, "status")
        if not self._may_act():
            self._state.mark_dirty(node)
            return
        labels = dict(self._state.node_labels.get(node, {}))
        try:
            async with asyncio.timeout(min(self._time_left(), 30.0)):
                try:
                    await self._transport.merge_patch(path, body)
                except ApiError as error:
                    if not error.not_found:
                        raise
                    if await self._create(node, labels):
                        self._written_labels[node] = labels  # created with them
                    await self._transport.merge_patch(path, body)
                if self._written_labels.get(node) != labels:
                    await self._write_labels(node, labels)
        except (ApiError, ApiUnavailableError, TimeoutError):
            self._state.mark_dirty(node)  # written at the next flush
            raise
        self._written[node] = status
        self._written_labels[node] = labels

    async def _write_labels(self, node: str, labels: dict[str, str]) -> None:
        """Make the NodeHeadroom's labels its Node's (a merge patch: None removes one)."""
        before = self._written_labels.get(node)
        if before is None:  # not known what it carries: read it
            current = await self._transport.get(node_headroom_path(node))
            before = (current.get("metadata") or {}).get("labels") or {}
        patch: dict[str, str | None] = {key: None for key in before if key not in labels}
        patch.update(labels)
        await self._transport.merge_patch(node_headroom_path(node), {"metadata": {"labels": patch}})

    async def _create(self, node: str, labels: dict[str, str]) -> bool:
        """Create the node's NodeHeadroom with ``labels``; False if it exists already."""
        owner = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": node,
            "uid": self._state.node_uids[node],
        }
        body = {
            "apiVersion": API_VERSION,
            "kind": "NodeHeadroom",
            "metadata": {
                "name": node,
                "ownerReferences": [owner],
                "labels": labels,
            },
        }
        try:
            await self._transport.create(NODE_HEADROOMS, body)
        except ApiError as error:
            if not error.conflict:
                raise
            return False
        return True

    async def delete(self, node: str) -> None:
        """A Node went away: its NodeHeadroom goes too (no garbage collector is assumed)."""
        self._written.pop(node, None)
        self._written_labels.pop(node, None)
        try:
            await self._transport.delete(node_headroom_path(node))
        except (ApiError, ApiUnavailableError) as error:
            log.debug("NodeHeadroom %s not deleted now (%s); the resync tries again", node, error)

    async def delete_orphans(self) -> None:
        """Delete NodeHeadrooms whose Node is gone or was replaced (a new uid).

        The DELETED event of a Node removed while the operator was down is never
        seen, and clusters without a garbage collector run (or a slow one) keep its
        NodeHeadroom; this catches them at start-up and at every resync.
        """
        items, _ = await list_all(self._transport, NODE_HEADROOMS)
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
                self._state.mark_dirty(name)  # written again for the Node that is there
            try:
                await self._transport.delete(node_headroom_path(name), uid=uid)
            except ApiError as error:
                if not (error.not_found or error.conflict):
                    raise
