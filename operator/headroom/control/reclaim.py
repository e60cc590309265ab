"""Reclaim: the sweeper, the check before a stale reclaim, and deletion after retention.

One sweeper task serves every reservation, instead of a kopf timer per object:
kopf timers put a finalizer on each object (so deletion would wait for the
operator) and cost a task each, while the ledger already keeps a time-ordered
index that says when the next entry can go stale or expire. The sweeper sleeps
until then (or one sweep period, whichever is first) and is woken early when a
decision brings a nearer deadline.

Liveness is timed by the operator's own observations (the rule is in
docs/concepts/heartbeats-and-reclaim.md): a reservation's stale clock starts at its
admission, a heartbeat counts when the operator sees a new annotation value, and
after a start every restored reservation counts as seen alive at that moment — so
nothing is reclaimed as stale before one full window has passed since the operator began watching.

Expiry is exact and reclaimed at once. Staleness is *checked* first: the sweeper
reads the Reservation and its owner pod from the API, and a heartbeat value it
had not seen (a watch event it missed or has not received yet) spares the
reservation. Only a silence confirmed by the API server costs a reservation; if
the API cannot be asked, the reservation is kept and asked about again shortly.
At most ``MAX_CHECKS_IN_FLIGHT`` such reads run at once: a thousand reservations
going silent together must not put a thousand GETs in front of other tenants'
decision writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from headroom.api.config import OperatorConfig
from headroom.api.parse import InvalidValueError
from headroom.api.paths import pod_path, reservation_path
from headroom.api.reasons import Phase, Reason
from headroom.control.state import POD, RESERVATION, Record, State
from headroom.control.tasks import BackgroundTasks
from headroom.control.telemetry import Telemetry
from headroom.control.writer import StatusWriter
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.retry import retry_call, transient
from headroom.kube.transport import ApiError, ApiUnavailableError, Transport
from headroom.logs import about
from headroom.objects.reservations import heartbeat_value
from headroom.objects.status import StatusDecision

log = logging.getLogger(__name__)
_MIN_SLEEP = 0.05
_RECHECK = timedelta(seconds=2)  # a stale reservation the API could not confirm: asked again
MAX_CHECKS_IN_FLIGHT = 8


class Reclaimer:
    def __init__(
        self,
        state: State,
        transport: Transport,
        writer: StatusWriter,
        clock: Clock,
        telemetry: Telemetry,
        config: OperatorConfig,
        *,
        may_act: Callable[[], bool],
        observe: Callable[[Record, str, str | None], None],
        on_gone: Callable[[str], None],
        rng: random.Random,
        wake_admission: Callable[[], None] = lambda: None,
    ) -> None:
        self._state, self._transport, self._writer = state, transport, writer
        self._clock, self._telemetry, self._config, self._rng = clock, telemetry, config, rng
        self._may_act, self._observe, self._on_gone = may_act, observe, on_gone
        self._wake_admission = wake_admission
        self._wake = asyncio.Event()
        self._planned: datetime | None = None
        self._deletions: list[tuple[datetime, str, str, str]] = []  # (when, ns, name, uid)
        self._checking: set[str] = set()
        self._check_room = asyncio.Semaphore(MAX_CHECKS_IN_FLIGHT)
        self._tasks = BackgroundTasks()

    # -- the sweeper -------------------------------------------------------------------------

    def nearer_deadline(self) -> None:
        """A decision or a heartbeat may have brought the next deadline nearer."""
        deadline = self._state.ledger.next_deadline()
        if deadline is not None and (self._planned is None or deadline < self._planned):
            self._wake.set()

    async def run(self) -> None:
        """Sweep forever (a supervised task)."""
        while True:
            try:
                self.sweep(self._clock.now())
            except Exception:  # the sweeper must outlive any single bad entry
                log.exception("sweep failed; retrying next period")
            now = self._clock.now()
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
        """Reclaim what expired, check what went stale, delete what outlived retention."""
        state = self._state
        for due in state.ledger.due(now):
            record = state.held_record(due.entry.id)
            if record is None:  # cannot happen: every ledger entry has its record
                namespace, name = due.entry.id.split("/", 1)
                log.error(
                    "ledger entry %s has no record; released",
                    due.entry.id,
                    extra=about(namespace, name, node=due.entry.node),
                )
                state.ledger.release(due.entry.id)
            elif not self._may_act():
                state.ledger.postpone(due.entry.id, now + _RECHECK)
            elif due.reason == Reason.EXPIRED:
                self.reclaim(record, Reason.EXPIRED, due.message)
            elif not record.announced:  # its owner does not know yet: its clock has not started
                state.ledger.postpone(due.entry.id, now + _RECHECK)
            elif record.uid not in self._checking:
                self._checking.add(record.uid)
                self._tasks.spawn(self._confirm_silence(record, due.message))
        deadline = state.ledger.waiting.next_deadline()
        if deadline is not None and deadline <= now:
            self._wake_admission()  # a wait ran out: the decider refuses it
        while self._deletions and self._deletions[0][0] <= now:
            _, namespace, name, uid = heapq.heappop(self._deletions)
            self._tasks.spawn(self._delete(namespace, name, uid))
        state.mark_dirty(*state.ledger.nodes())  # stale counts change with time

    async def _confirm_silence(self, record: Record, message: str) -> None:
        """Reclaim as stale only if the API shows no heartbeat the operator has not seen."""
        try:
            async with self._check_room:
                alive = await self._heard_from(record)
        finally:
            self._checking.discard(record.uid)
        state = self._state
        if state.records.get(record.uid) is not record or not record.held:
            return  # deleted, or reclaimed another way, while we asked
        entry = state.ledger.get(record.entry_id)
        if entry is None:
            return
        now = self._clock.now()
        if not entry.is_stale(now, state.ledger.limits_for(entry.node).heartbeat_stale_window):
            return  # a heartbeat (found just now, or seen meanwhile) spared it
        if alive is None or not self._may_act():  # not confirmed: keep it, ask again soon
            state.ledger.postpone(record.entry_id, now + _RECHECK)
            return
        self.reclaim(record, Reason.HEARTBEAT_STALE, message)

    async def _heard_from(self, record: Record) -> bool | None:
        """True if the Reservation or its owner pod shows a heartbeat value not yet seen
        (it is counted now); False if neither does; None if the API could not be asked."""
        try:
            obj = await self._transport.get(reservation_path(record.namespace, record.name))
        except ApiError as error:
            if error.not_found:
                self._on_gone(record.uid)
                return False
            return None
        except ApiUnavailableError:
            return None
        if (obj.get("metadata") or {}).get("uid") != record.uid:
            self._on_gone(record.uid)
            return False
        if self._new_value(record, RESERVATION, obj):
            return True
        if record.pod is None:
            return False
        try:
            pod = await self._transport.get(pod_path(record.namespace, record.pod))
        except ApiError as error:
            if error.not_found:  # the owner is gone, whether or not a watch said so
                self._owner_gone(record, f"owner pod {record.pod} is gone")
                return False
            return None
        except ApiUnavailableError:
            return None
        uid = (pod.get("metadata") or {}).get("uid")
        if record.pod_uid is not None and uid != record.pod_uid:
            self._owner_gone(record, f"owner pod {record.pod} was replaced")
            return False
        return self._new_value(record, POD, pod)

    def _owner_gone(self, record: Record, message: str) -> None:
        if self._state.records.get(record.uid) is record and record.held:
            self.reclaim(record, Reason.OWNER_POD_DELETED, message)

    def _new_value(self, record: Record, source: str, obj: dict[str, Any]) -> bool:
        try:
            value = heartbeat_value(obj)
        except InvalidValueError:
            return False
        if value is None or value == record.beats.get(source):
            return False
        self._observe(record, source, value)
        return True

    def reclaim(self, record: Record, reason: Reason, message: str) -> None:
        """Take an admitted reservation back: its status says Reclaimed and why.

        The ledger keeps its capacity until the object shows Reclaimed
        (:meth:`release_reclaimed`): until then its owner, and anyone reading the
        API, still sees Admitted, so giving the capacity to another reservation
        first would put two Admitted claims on the same memory.
        """
        if not record.held or not self._state.holds(record):
            return
        record.decision = StatusDecision(Phase.RECLAIMED, reason, message, self._clock.now())
        record.changed_at = self._clock.monotonic()
        record.confirmed = False
        record.announced = False
        self._telemetry.reclaimed(str(reason))
        self._writer.ensure(record.uid)

    def release_reclaimed(self, record: Record) -> None:
        """The object shows Reclaimed: now its capacity goes back to the ledger."""
        if self._state.holds(record):
            self._state.ledger.reclaim_entry(record.entry_id)
            self._state.unhold(record)

    # -- deletion after retention --------------------------------------------------------------

    def schedule_deletion(
        self, namespace: str, name: str, uid: str, reclaimed_at: datetime
    ) -> None:
        when = reclaimed_at + self._config.reclaimed_retention
        heapq.heappush(self._deletions, (when, namespace, name, uid))
        if self._planned is None or when < self._planned:
            self._wake.set()

    async def _delete(self, namespace: str, name: str, uid: str) -> None:
        async def delete() -> None:
            try:
                await self._transport.delete(reservation_path(namespace, name), uid=uid)
            except ApiError as error:
                if not (error.not_found or error.conflict):  # 404/409: gone, or a namesake now
                    raise

        backoff = Backoff(base=0.2, cap=10.0, rng=self._rng)
        try:
            await retry_call(delete, backoff=backoff, retry_on=transient, attempts=5)
            self._on_gone(uid)  # not left to its DELETED event, which a relist may skip
            return
        except ApiError as error:
            if not transient(error):
                log.warning(
                    "reclaimed %s/%s not deleted: %s",
                    namespace,
                    name,
                    error,
                    extra=about(namespace, name, uid),
                )
                return
        except ApiUnavailableError:
            pass
        # Five attempts failed. The last one waits out its delay too, as the loop this
        # replaced did: the simulation's random draws and times stay what they were.
        await asyncio.sleep(backoff.next())
        log.warning(
            "reclaimed %s/%s not deleted; the next start tries again",
            namespace,
            name,
            extra=about(namespace, name, uid),
        )

    async def stop(self) -> None:
        await self._tasks.stop()
