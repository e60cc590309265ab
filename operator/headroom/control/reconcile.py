"""The one reconcile: a Reservation as the API shows it, against the operator's record of it.

Every path that brings an object — a watch event, the start-up rebuild, the
periodic resync, a relist after ``410 Gone`` — ends in :meth:`Reconciler.reconcile`,
which does what brings the two into agreement:

- no record, no decision on the object: queue it for a decision;
- no record, a trusted decision on the object (after a start): remember it, and hold
  an admission in the ledger again, alive as of now;
- no record, a decision without a valid stamp: say so, and decide it again;
- a record the object does not carry: write it (the status writer);
- a record the object carries: confirm it, and read its heartbeat.

A list is a snapshot from when it was asked for: an object known gone since then
(a tombstone) or a decision confirmed since then is newer than what the list shows,
and is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from headroom.api.config import OperatorConfig
from headroom.api.reasons import EventReason, Phase, Reason
from headroom.control.admission import Admission
from headroom.control.reclaim import Reclaimer
from headroom.control.state import POD, RESERVATION, Record, State
from headroom.control.telemetry import Telemetry
from headroom.control.writer import StatusWriter
from headroom.kube.clock import Clock
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON
from headroom.ledger import Entry
from headroom.logs import about
from headroom.objects.pods import owning_pod_uid
from headroom.objects.reservations import (
    heartbeat_value,
    optional_time,
    reservation_entry,
    spec_targets,
)
from headroom.objects.stamp import StampVerdict
from headroom.objects.status import StatusDecision, decision_of, reservation_ref

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self,
        state: State,
        clock: Clock,
        config: OperatorConfig,
        admission: Admission,
        writer: StatusWriter,
        reclaimer: Reclaimer,
        events: EventRecorder,
        telemetry: Telemetry,
        *,
        check_owner: Callable[[tuple[str, str]], None],
        on_reservation: Callable[[JSON], None] = lambda obj: None,
        on_forgotten: Callable[[str], None] = lambda uid: None,
        on_decided: Callable[[Record], None] = lambda record: None,
        adopt: Callable[[Record], None] | None = None,
    ) -> None:
        """``on_reservation``/``on_forgotten``/``on_decided``: told of every Reservation
        reconciled, forgotten, and every decision its object is seen to carry (pod gates).
        ``adopt``: stamps again a remembered status that an adopted decision key could
        only verify with the key it replaces (``headroom.control.keys``)."""
        self._on_reservation, self._on_forgotten = on_reservation, on_forgotten
        self._on_decided = on_decided
        self._state, self._clock, self._config = state, clock, config
        self._admission, self._writer, self._reclaimer = admission, writer, reclaimer
        self._events, self._telemetry, self._check_owner = events, telemetry, check_owner
        self._distrusted: set[str] = set()
        self._restoring: list[tuple[Entry, Record]] | None = None
        self.adopted: list[Record] = []  # statuses kept under a new decision key
        self._adopt = adopt

    # -- entry points ----------------------------------------------------------------------

    def reconcile(self, obj: JSON, *, listed_at: float | None = None) -> None:
        """Bring one Reservation and the ledger into agreement."""
        meta = obj.get("metadata") or {}
        uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if not (uid and namespace and name):
            return
        if listed_at is not None and self._state.forgotten_since(uid, listed_at):
            return  # known gone since the list was asked for
        self._on_reservation(obj)
        record = self._state.records.get(uid)
        if record is not None:
            self._reconcile_decided(record, obj, listed_at)
        elif uid in self._admission:
            self._admission.submit(obj)  # keep its newest body
        else:
            self._reconcile_undecided(obj, uid)

    def forget(self, uid: str) -> None:
        """The object is gone: withdraw it, release what it held, drop its record."""
        self._admission.withdraw(uid)
        self._distrusted.discard(uid)
        self._writer.forget(uid)
        if self._state.forget(uid, self._clock.monotonic()) is not None:
            self._admission.wake()  # capacity may have come back
        self._on_forgotten(uid)

    def restoring(self) -> None:
        """From now on, trusted admissions are collected and restored in one go (rebuild)."""
        self._restoring = []

    def restore_collected(self) -> None:
        collected, self._restoring = self._restoring or [], None
        self._restore(collected)
        for record in self.adopted:
            if self._adopt is not None and self._state.records.get(record.uid) is record:
                self._adopt(record)

    # -- reconcile ---------------------------------------------------------------------------

    def _reconcile_decided(self, record: Record, obj: JSON, listed_at: float | None) -> None:
        status = obj.get("status") or {}
        if record.decision.matches(status):
            if not record.confirmed:
                record.confirmed = True
                self.confirmed(record)
        elif listed_at is None or record.confirmed_at < listed_at:
            record.confirmed = False  # the object does not carry the truth: write it
            self._writer.ensure(record.uid)
        if record.held:
            self._observe_reservation(record, obj)

    def _reconcile_undecided(self, obj: JSON, uid: str) -> None:
        status = obj.get("status") or {}
        phase = status.get("phase")
        decision = decision_of(status, self._decided_at(status)) if phase else None
        if phase in (Phase.ADMITTED, Phase.REJECTED):
            verdict = self._state.stamper.verdict(obj)
            if verdict is StampVerdict.UNTRUSTED or decision is None:
                self._distrust(obj, uid)
                self._admission.submit(obj)
                return
            record = self._record_of(obj, decision)
            if phase == Phase.ADMITTED:
                self._restore_admitted(obj, record)
            else:
                self._state.remember(record)
            if verdict is StampVerdict.ADOPT:
                self._adopt_later_or_now(record)
        elif phase == Phase.QUEUED:
            verdict = self._state.stamper.verdict(obj)
            if verdict is StampVerdict.UNTRUSTED or decision is None:
                self._distrust(obj, uid)
                self._admission.submit(obj)
                return
            self._wait_again(obj, self._record_of(obj, decision))
        elif phase == Phase.RECLAIMED and decision is not None:
            record = self._record_of(obj, decision)
            self._state.remember(record)
            self._reclaimer.schedule_deletion(record.namespace, record.name, uid, decision.at)
        else:
            self._admission.submit(obj)

    def _adopt_later_or_now(self, record: Record) -> None:
        if self._restoring is not None or self._adopt is None:
            self.adopted.append(record)  # stamped once it is remembered
        elif self._state.records.get(record.uid) is record:
            self._adopt(record)

    def _wait_again(self, obj: JSON, record: Record) -> None:
        """A reservation that was waiting for room before a start: back in its node's queue,
        in creation order, its wait still measured from its creation."""
        try:
            entry = reservation_entry(obj, self._clock.now())
        except ValueError:
            self._admission.submit(obj)  # decided again: InvalidSpec
            return
        if entry.wait_until is None:
            self._admission.submit(obj)
            return
        record.node, record.pod = entry.node, entry.owner.pod
        record.decision.position = self._state.ledger.requeue(entry, entry.wait_until)
        if self._state.remember(record):
            self._state.mark_room(entry.node)
            self._admission.wake()
        else:
            self._state.ledger.stop_waiting(entry.id)

    def _restore_admitted(self, obj: JSON, record: Record) -> None:
        """A trusted admission this process does not hold (after a start): hold it again,
        alive as of now — the grace of one full window since the operator began watching."""
        try:
            entry = reservation_entry(obj, self._clock.now())
        except ValueError as error:  # cannot happen for a spec we admitted
            log.error(
                "%s admitted but unreadable (%s); decided again",
                record.entry_id,
                error,
                extra=record.about,
            )
            self._admission.submit(obj)
            return
        record.node, record.pod = entry.node, entry.owner.pod
        entry.devices = dict(record.decision.devices)  # stamped with the decision
        if entry.expires_at is None and record.decision.expires_at is not None:
            entry.expires_at = entry.given_expiry = record.decision.expires_at  # stamped too
        if record.pod:
            seen = self._state.owner_pods.get((record.namespace, record.pod))
            owner_uid = owning_pod_uid(obj)  # a gated pod's: exactly its incarnation
            if seen is not None and owner_uid is not None and seen.uid != owner_uid:
                seen = None  # an earlier pod of that name, not yet known gone
            record.beats[POD] = seen.beat if seen else None
            record.pod_uid = owner_uid or (seen.uid if seen else None)
        if self._restoring is not None:
            self._restoring.append((entry, record))
        else:
            log.warning(
                "%s: a trusted admission not held here; held again",
                record.entry_id,
                extra=record.about,
            )
            self._restore([(entry, record)])
            self._reclaimer.nearer_deadline()

    def _restore(self, restoring: list[tuple[Entry, Record]]) -> None:
        state = self._state
        # An entry the ledger already holds for another incarnation is not restored over it.
        fresh = [(e, r) for e, r in restoring if state.holders.get(e.id) in (None, r.uid)]
        result = state.ledger.restore([entry for entry, _ in fresh])
        for _, record in fresh:
            state.remember(record)
            if record.pod and (record.namespace, record.pod) not in state.owner_pods:
                self._check_owner((record.namespace, record.pod))
        for entry in result.over_committed:
            over = state.held_record(entry.id)
            if over is not None:
                self._events.record(
                    reservation_ref(over.namespace, over.name, over.uid),
                    Reason.OVER_COMMITTED,
                    f"admitted earlier, but node {entry.node} is now over its limit; "
                    "kept, not evicted",
                    "Warning",
                )

    def _record_of(self, obj: JSON, decision: StatusDecision) -> Record:
        meta = obj["metadata"]
        try:
            beat = heartbeat_value(obj)
        except ValueError:
            beat = None
        spec = obj.get("spec")
        now = self._clock.monotonic()
        return Record(
            uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
            node=str(spec.get("node", "")) if isinstance(spec, dict) else "",
            decision=decision,
            changed_at=now,
            confirmed=True,
            announced=True,
            beats={RESERVATION: beat},
            seen_at=now,
            first_seen=now,
        )

    def _decided_at(self, status: JSON) -> datetime:
        for key in ("reclaimedAt", "admittedAt"):
            if (at := optional_time(status.get(key))) is not None:
                return at
        conditions = status.get("conditions") or []
        for condition in conditions if isinstance(conditions, list) else []:
            if not (isinstance(condition, dict) and condition.get("type") == "Admitted"):
                continue
            if (at := optional_time(condition.get("lastTransitionTime"))) is not None:
                return at
        return self._clock.now()

    def _distrust(self, obj: JSON, uid: str) -> None:
        if uid in self._distrusted:
            return
        self._distrusted.add(uid)
        meta, status = obj["metadata"], obj.get("status") or {}
        log.warning(
            "%s/%s: status %s not written by this operator; deciding it again",
            meta["namespace"],
            meta["name"],
            status.get("phase"),
            extra=about(meta["namespace"], meta["name"], uid, spec_targets(obj)[0]),
        )
        self._events.record(
            reservation_ref(meta["namespace"], meta["name"], uid),
            EventReason.UNTRUSTED_STATUS,
            f"status.phase {status.get('phase')} carries no valid decision stamp; "
            "ignored and decided again",
            "Warning",
        )

    def confirmed(self, record: Record) -> None:
        """The object carries its decision: announce it once (Event, metrics), then tell
        the gates. In that order: a gate may decide again at once (a gated pod that
        ended reclaims what was just admitted), and what is announced and released here
        must be the decision the object carries, not the one still to be written."""
        try:
            self._announce(record)
        finally:
            self._on_decided(record)

    def _announce(self, record: Record) -> None:
        now = self._clock.monotonic()
        record.confirmed_at = now
        if record.announced:
            return
        record.announced = True
        decision = record.decision
        if record.held:  # its owner learns of it only now: its stale clock starts now
            self._state.ledger.heartbeat(record.entry_id, self._clock.now())
        if decision.phase != Phase.RECLAIMED:
            self._telemetry.decision_written(str(decision.phase), now - record.first_seen)
        self._events.record(
            reservation_ref(record.namespace, record.name, record.uid),
            decision.reason,
            decision.message,
            "Normal"
            if decision.phase == Phase.ADMITTED and decision.reason != Reason.OVER_COMMITTED
            else "Warning",
        )
        if decision.phase == Phase.RECLAIMED:
            self._reclaimer.release_reclaimed(record)
            self._admission.wake()  # capacity came back
            self._reclaimer.schedule_deletion(
                record.namespace, record.name, record.uid, decision.at
            )

    # -- heartbeats --------------------------------------------------------------------------

    def _observe_reservation(self, record: Record, obj: JSON) -> None:
        try:
            value = heartbeat_value(obj)
        except ValueError as error:
            if record.bad_beat != str(error):
                record.bad_beat = str(error)
                self._events.record(
                    reservation_ref(record.namespace, record.name, record.uid),
                    EventReason.BAD_HEARTBEAT,
                    f"{error}; ignored",
                    "Warning",
                )
            return
        record.bad_beat = None
        self.observe(record, RESERVATION, value)

    def observe(self, record: Record, source: str, value: str | None) -> None:
        """A heartbeat source shows ``value``: a new one counts as a heartbeat, now."""
        if record.beats.get(source) == value:
            return
        record.beats[source] = value
        if value is None or not record.held or not self._state.holds(record):
            return
        now = self._clock.now()
        entry = self._state.ledger.heartbeat(record.entry_id, now)
        window = self._state.ledger.limits_for(entry.node).heartbeat_stale_window
        step = window * float(self._config.heartbeat_write_fraction)
        if record.written_beat is None or now - record.written_beat >= step:
            self._writer.write_heartbeat(record, now)
