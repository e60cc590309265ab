"""Status writes: the ledger's truth, written until the object carries it.

One loop per Reservation whose record is not yet confirmed on its object. Right
before each attempt it reads the record again, so what it writes is always the
ledger's truth *now*: a reservation reclaimed while its admission was backing
off gets its Reclaimed status, never a late Admitted one. Each attempt also asks
whether this process may still act (holds the Lease); a deposed leader writes
nothing.

Answers, and what they mean:
- success: the record is confirmed; its Event is posted once.
- 404, or 422 on an object with another uid: the object is gone; forget it.
- 409, 429, 5xx, no answer: try again after a capped, jittered backoff. A write
  that got no answer may have landed, so a decision written that way is never
  rolled back later.
- any other refusal (403, a status the schema refuses): given up now, not
  retried every half second forever. A decision never seen on the object is
  rolled back (the object is undecided again, and the periodic resync queues it);
  a reclaim stays the truth and the resync writes it again.

Fair, and bounded. Writes wait in a :class:`~headroom.control.fairqueue.FairQueue`
(round robin over namespaces, then over nodes) and at most ``limit`` are in
flight, so one tenant's burst of decisions never queues ahead of another
tenant's one without bound, and the decider never waits for writes at all: it
decides in memory and hands each decision over. A tenant's write waits for the
next free slot, not for every write queued before it. A write that failed waits
out its backoff *outside* the limit.

Heartbeats in status (``lastHeartbeat``, informational) go through a lane of
their own, with its own small limit, coalesced per reservation: a decision never
waits behind heartbeats, and a storm of heartbeats costs at most one write per
reservation in flight.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable
from datetime import datetime

from headroom.api.paths import reservation_path
from headroom.api.reasons import Phase
from headroom.control.fairqueue import FairQueue
from headroom.control.state import Record, State
from headroom.control.telemetry import Telemetry
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.transport import ApiError, ApiUnavailableError, Transport
from headroom.objects.status import replace_status, set_heartbeat, status_body

log = logging.getLogger(__name__)
#: Decision writes in flight: the client's connection pool. Fewer cost B1 about a tenth
#: of its throughput (16: 0.52 x B0 against 0.56-0.66), more only lengthen the line
#: at the API server. Whose write goes next is the fair queue's choice either way.
MAX_WRITES_IN_FLIGHT = 64
#: ``lastHeartbeat`` writes in flight: informational, never in the decisions' way.
MAX_BEATS_IN_FLIGHT = 4
_ATTEMPT_TIMEOUT = 30.0
_AGAIN_NOW = 0.0


class StatusWriter:
    def __init__(
        self,
        state: State,
        transport: Transport,
        clock: Clock,
        telemetry: Telemetry,
        *,
        may_act: Callable[[], bool],
        time_left: Callable[[], float],
        on_gone: Callable[[str], None],
        on_confirmed: Callable[[Record], None],
        rng: random.Random,
        limit: int = MAX_WRITES_IN_FLIGHT,
        beat_limit: int = MAX_BEATS_IN_FLIGHT,
    ) -> None:
        self._state, self._transport, self._clock = state, transport, clock
        self._telemetry, self._rng = telemetry, rng
        self._limit, self._beat_limit = limit, beat_limit
        self._may_act, self._time_left = may_act, time_left
        self._on_gone, self._on_confirmed = on_gone, on_confirmed
        self._queued: FairQueue[str] = FairQueue()
        self._writing: dict[str, asyncio.Task[float | None]] = {}
        # Ensured again while its write was in flight: written again when that one ends.
        self._dirty: set[str] = set()
        self._retrying: dict[str, asyncio.TimerHandle] = {}
        self._backoffs: dict[str, Backoff] = {}
        self._beats_queued: FairQueue[str] = FairQueue()
        self._beats_writing: dict[str, asyncio.Task[None]] = {}
        self._beats_again: set[str] = set()  # a newer beat came while one was in flight
        self._maybe_written: set[str] = set()  # uids whose write got no answer once

    def __len__(self) -> int:
        """Decision writes not yet confirmed: queued, in flight or backing off."""
        return len(self._queued) + len(self._writing) + len(self._retrying)

    def ensure(self, uid: str) -> None:
        """Make sure the object of ``uid`` ends up carrying its record's decision."""
        if uid in self._writing:
            # The attempt in flight may have read, or even confirmed, the decision before
            # this change; its end looks again (seen: an admission decided in the moment
            # between a Queued write's answer and the end of its task, written only at
            # the next resync, its gated pod held back meanwhile).
            self._dirty.add(uid)
            return
        if uid in self._queued or uid in self._retrying:
            return  # each attempt reads the record again: it writes the newest truth
        record = self._state.records.get(uid)
        if record is None:
            self._backoffs.pop(uid, None)
            return
        self._queued.push(record.namespace, record.node, uid)
        self._pump()

    def forget(self, uid: str) -> None:
        """The object is gone: nothing more to write for it (a write in flight ends alone)."""
        self._maybe_written.discard(uid)
        self._dirty.discard(uid)
        self._queued.discard(uid)
        self._backoffs.pop(uid, None)
        if (handle := self._retrying.pop(uid, None)) is not None:
            handle.cancel()

    def _pump(self) -> None:
        while len(self._writing) < self._limit:
            uid = self._queued.pop()
            if uid is None:
                return
            task = asyncio.create_task(self._attempt(uid), name=f"status-{uid[:8]}")
            self._writing[uid] = task
            task.add_done_callback(functools.partial(self._attempted, uid))

    def _attempted(self, uid: str, task: asyncio.Task[float | None]) -> None:
        """One attempt ended: done, again now, or again after a backoff (outside the limit)."""
        self._writing.pop(uid, None)
        dirty = uid in self._dirty
        self._dirty.discard(uid)
        again: float | None = None
        if not task.cancelled():
            if (error := task.exception()) is not None:  # a bug: the resync writes it again
                record = self._state.records.get(uid)
                fields = record.about if record is not None else None
                log.error("writing the status of %s failed", uid, exc_info=error, extra=fields)
            else:
                again = task.result()
        if again is None:
            self._backoffs.pop(uid, None)
            record = self._state.records.get(uid)
            if record is None or record.confirmed:
                self._maybe_written.discard(uid)
            if dirty:
                self.ensure(uid)
        elif again == _AGAIN_NOW:
            self.ensure(uid)
        else:
            loop = asyncio.get_running_loop()
            self._retrying[uid] = loop.call_later(again, self._retry, uid)
        self._pump()

    def _retry(self, uid: str) -> None:
        self._retrying.pop(uid, None)
        record = self._state.records.get(uid)
        if record is not None and not record.confirmed:
            self._telemetry.status_write_retried()
        self.ensure(uid)

    async def _attempt(self, uid: str) -> float | None:
        """Write the record's decision once; None when there is nothing more to write,
        else how long to wait before the next attempt."""
        record = self._state.records.get(uid)
        if record is None or record.confirmed or not self._may_act():
            return None
        decision = record.decision
        beat = self._beat_of(record)
        body = status_body(decision, beat)
        path = reservation_path(record.namespace, record.name, "status")
        try:
            # A leader's write may take only as long as it stays leader: past that,
            # a standby may decide, and this write must not land after it.
            async with asyncio.timeout(min(self._time_left(), _ATTEMPT_TIMEOUT)):
                await self._transport.json_patch(path, replace_status(uid, body))
        except TimeoutError:
            self._maybe_written.add(uid)
            failure: Exception = ApiUnavailableError("no answer in time")
        except ApiError as error:
            if error.not_found or (error.invalid and await self._gone(record)):
                self._on_gone(uid)
                return None
            if not (error.retriable or error.conflict):
                self._refused(record, error)
                return None
            if error.status >= 500:  # a server fault after etcd committed is possible
                self._maybe_written.add(uid)
            failure = error
        except ApiUnavailableError as error:
            self._maybe_written.add(uid)
            failure = error
        else:
            if self._state.records.get(uid) is record and record.decision is decision:
                record.confirmed = True
                if beat is not None:
                    record.written_beat = beat
                self._maybe_written.discard(uid)
                self._on_confirmed(record)
                return None
            return _AGAIN_NOW  # the truth moved while we wrote: write the new one at once
        self._telemetry.status_write_failed()
        backoff = self._backoffs.get(uid)
        if backoff is None:
            backoff = self._backoffs[uid] = Backoff(base=0.2, cap=30.0, rng=self._rng)
        delay = backoff.next()
        log.warning(
            "%s: status not confirmed (%s); again in %.1fs",
            record.entry_id,
            failure,
            delay,
            extra=record.about,
        )
        return delay

    def _beat_of(self, record: Record) -> datetime | None:
        if not record.held:
            return None
        entry = self._state.ledger.get(record.entry_id)
        return entry.last_heartbeat if entry is not None else None

    async def _gone(self, record: Record) -> bool:
        """After a 422: is the object gone or another incarnation (or did it refuse us)?"""
        try:
            current = await self._transport.get(reservation_path(record.namespace, record.name))
        except ApiError as error:
            return error.not_found
        except ApiUnavailableError:
            return False
        return bool((current.get("metadata") or {}).get("uid") != record.uid)

    def _refused(self, record: Record, error: ApiError) -> None:
        self._telemetry.status_write_failed()
        never_written = not record.announced and record.uid not in self._maybe_written
        if record.decision.phase != Phase.RECLAIMED and never_written:
            log.error(
                "%s/%s: decision %s refused by the API server (%s); rolled back, "
                "decided again at the next resync",
                record.namespace,
                record.name,
                record.decision.phase,
                error,
                extra=record.about,
            )
            self._state.drop(record.uid)
            return
        log.error(
            "%s/%s: status %s refused by the API server (%s); written again at the next resync",
            record.namespace,
            record.name,
            record.decision.phase,
            error,
            extra=record.about,
        )

    # -- heartbeats in status (informational) ------------------------------------------------

    def write_heartbeat(self, record: Record, at: datetime) -> None:
        """Put ``lastHeartbeat`` in status; best effort, the next beat writes it again.

        Coalesced: while a write for this reservation is queued or in flight, a newer
        beat only moves ``written_beat``, and the one write carries the newest value.
        """
        if not record.confirmed or not self._may_act():
            return
        record.written_beat = at
        if record.uid in self._beats_writing:
            self._beats_again.add(record.uid)
            return
        self._beats_queued.push(record.namespace, record.node, record.uid)
        self._pump_beats()

    def _pump_beats(self) -> None:
        while len(self._beats_writing) < self._beat_limit:
            uid = self._beats_queued.pop()
            if uid is None:
                return
            task = asyncio.create_task(self._write_beat(uid), name=f"beat-{uid[:8]}")
            self._beats_writing[uid] = task
            task.add_done_callback(functools.partial(self._beat_written, uid))

    def _beat_written(self, uid: str, _: asyncio.Task[None]) -> None:
        self._beats_writing.pop(uid, None)
        record = self._state.records.get(uid)
        if uid in self._beats_again:
            self._beats_again.discard(uid)
            if record is not None and record.confirmed:
                self._beats_queued.push(record.namespace, record.node, uid)
        self._pump_beats()

    async def _write_beat(self, uid: str) -> None:
        record = self._state.records.get(uid)
        if record is None or not record.confirmed or record.written_beat is None:
            return
        if not self._may_act():
            return
        path = reservation_path(record.namespace, record.name, "status")
        patch = set_heartbeat(record.uid, record.decision.decision_id, record.written_beat)
        try:
            async with asyncio.timeout(min(self._time_left(), _ATTEMPT_TIMEOUT)):
                await self._transport.json_patch(path, patch)
        except (ApiError, ApiUnavailableError, TimeoutError) as error:
            log.debug("lastHeartbeat not written: %s", error)

    async def stop(self, wait_at_most: float = 3.0) -> None:
        """Stop writing; a decision not yet confirmed is written again after a restart."""
        for handle in self._retrying.values():
            handle.cancel()
        self._retrying.clear()
        self._limit = self._beat_limit = 0  # nothing more starts
        tasks: list[asyncio.Task[object]] = [
            *self._writing.values(),
            *self._beats_writing.values(),
        ]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=wait_at_most)
