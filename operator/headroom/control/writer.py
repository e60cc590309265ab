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

At most ``limit`` decision writes are in flight; the decider waits for room
*between* decisions (:meth:`StatusWriter.room`), never inside one.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from datetime import datetime

from headroom.api.paths import reservation_path
from headroom.api.reasons import Phase
from headroom.control.state import Record, State
from headroom.control.telemetry import Telemetry
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport
from headroom.objects.status import replace_status, set_heartbeat, status_body

log = logging.getLogger(__name__)
MAX_WRITES_IN_FLIGHT = 128  # twice the client's connection pool: it stays saturated
_ATTEMPT_TIMEOUT = 30.0


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
    ) -> None:
        self._state, self._transport, self._clock = state, transport, clock
        self._telemetry, self._rng, self._limit = telemetry, rng, limit
        self._may_act, self._time_left = may_act, time_left
        self._on_gone, self._on_confirmed = on_gone, on_confirmed
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._beats: set[asyncio.Task[None]] = set()
        self._freed = asyncio.Event()
        self._maybe_written: set[str] = set()  # uids whose write got no answer once

    def __len__(self) -> int:
        return len(self._tasks)

    async def room(self) -> None:
        """Return once fewer than ``limit`` writes are in flight."""
        while len(self._tasks) >= self._limit:
            self._freed.clear()
            await self._freed.wait()

    def ensure(self, uid: str) -> None:
        """Make sure the object of ``uid`` ends up carrying its record's decision."""
        if uid not in self._tasks:
            task = asyncio.create_task(self._write(uid), name=f"status-{uid[:8]}")
            self._tasks[uid] = task
            task.add_done_callback(lambda _: self._done(uid))

    def _done(self, uid: str) -> None:
        self._tasks.pop(uid, None)
        record = self._state.records.get(uid)
        if record is None or record.confirmed:
            self._maybe_written.discard(uid)
        self._freed.set()

    def forget(self, uid: str) -> None:
        self._maybe_written.discard(uid)

    async def _write(self, uid: str) -> None:
        backoff = Backoff(base=0.2, cap=30.0, rng=self._rng)
        while True:
            record = self._state.records.get(uid)
            if record is None or record.confirmed or not self._may_act():
                return
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
                    return
                if not (error.retriable or error.conflict):
                    self._refused(record, error)
                    return
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
                    return
                continue  # the truth moved while we wrote: write the new one at once
            self._telemetry.status_write_failed()
            delay = backoff.next()
            log.warning("status of %s not confirmed (%s); again in %.1fs", uid, failure, delay)
            await asyncio.sleep(delay)

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
            )
            self._state.drop(record.uid)
            return
        log.error(
            "%s/%s: status %s refused by the API server (%s); written again at the next resync",
            record.namespace,
            record.name,
            record.decision.phase,
            error,
        )

    # -- heartbeats in status (informational) ------------------------------------------------

    def write_heartbeat(self, record: Record, at: datetime) -> None:
        """Put ``lastHeartbeat`` in status; best effort, the next beat writes it again."""
        if not record.confirmed or not self._may_act():
            return
        record.written_beat = at
        path = reservation_path(record.namespace, record.name, "status")
        patch = set_heartbeat(record.uid, record.decision.decision_id, at)
        task = asyncio.create_task(self._write_quietly(path, patch))
        self._beats.add(task)
        task.add_done_callback(self._beats.discard)

    async def _write_quietly(self, path: str, patch: list[JSON]) -> None:
        if not self._may_act():
            return
        try:
            async with asyncio.timeout(min(self._time_left(), _ATTEMPT_TIMEOUT)):
                await self._transport.json_patch(path, patch)
        except (ApiError, ApiUnavailableError, TimeoutError) as error:
            log.debug("lastHeartbeat not written: %s", error)

    async def stop(self, wait_at_most: float = 3.0) -> None:
        """Stop writing; a decision not yet confirmed is written again after a restart."""
        tasks = [*self._tasks.values(), *self._beats]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=wait_at_most)
