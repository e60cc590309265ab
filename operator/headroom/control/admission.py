"""Admission: one decider, fair across namespaces, in creation order on each node, each
decision in memory before any await.

Reservations waiting for a decision sit in a queue keyed by uid. One task drains
it: each pass takes namespaces in turn, and within a namespace its nodes in turn;
on each node, reservations go in creation order (ties by the order they were
seen, which follows etcd's revision order), whatever their namespace
(:func:`fair_order`).
Each reservation is decided by the pure ledger synchronously, so two
reservations can never both take the same last bit of headroom. Only then is
the decision handed to the status writer, which writes it later, fairly across
namespaces too; the decider never waits for writes.

A reservation waits in the queue (it is not refused) while its Node or owner pod
is being looked up (``headroom.control.lookups``), and while this process may not
act (a leader whose Lease ran out).

Memory stays flat under a burst: the queue keeps only the fields a decision reads.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from headroom.api.constants import OWNER_LABEL
from headroom.api.parse import InvalidValueError, parse_time
from headroom.api.reasons import Phase, Reason
from headroom.control.lookups import Lookups, PodAnswer
from headroom.control.ownclaims import OwnClaims
from headroom.control.provisional import ProvisionalHolds
from headroom.control.state import POD, RESERVATION, Record, State
from headroom.control.telemetry import NoTelemetry, Telemetry
from headroom.control.writer import StatusWriter
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON
from headroom.ledger import Entry
from headroom.logs import about
from headroom.objects.pods import owning_pod_uid
from headroom.objects.reservations import (
    decision_essentials,
    heartbeat_value,
    reservation_entry,
    reservation_id,
    spec_targets,
)
from headroom.objects.status import StatusDecision

log = logging.getLogger(__name__)
_NOT_LEADER_PAUSE = 0.1
_TURN = 128  # decisions between two looks at the event loop (~10-20 ms of work)


@dataclass(slots=True)
class Pending:
    uid: str
    namespace: str
    name: str
    obj: JSON
    order: tuple[str, int]
    seen: float  # monotonic time the operator first saw it


def fair_order(queued: Iterable[Pending]) -> list[tuple[str, Pending]]:
    """The order of one pass, each with its node: namespaces in turn, within a namespace
    its nodes in turn, on a node creation order, whatever the namespace.

    Round robin over namespaces keeps one tenant's burst from being decided, all of
    it, before another tenant's single reservation; over a namespace's nodes, its
    backlog on some nodes from being decided before its own reservation on an idle
    one (decisions on different nodes are independent). Creation order per node is
    the queue's promise (strict FIFO, and which of two claims gets a node's last
    room), so a node whose next reservation of this namespace has an earlier one of
    another namespace in front of it is passed over this turn. That never stalls:
    the earliest of all is first on its node and its namespace has it in a lane.
    """
    flows: dict[str, OrderedDict[str, deque[Pending]]] = {}
    by_node: dict[str, deque[Pending]] = {}
    for pending in sorted(queued, key=lambda p: p.order):
        node = spec_targets(pending.obj)[0] or ""
        flows.setdefault(pending.namespace, OrderedDict()).setdefault(node, deque()).append(pending)
        by_node.setdefault(node, deque()).append(pending)
    order: list[tuple[str, Pending]] = []
    while flows:
        for namespace, lanes in list(flows.items()):
            for node, lane in lanes.items():
                pending = lane[0]
                if by_node[node][0] is pending:
                    break
            else:
                continue  # each of its next ones waits for another namespace's earlier one
            lane.popleft()
            by_node[node].popleft()
            order.append((node, pending))
            if lane:
                lanes.move_to_end(node)
            else:
                del lanes[node]
            if not lanes:
                del flows[namespace]
    return order


class Admission:
    def __init__(
        self,
        state: State,
        writer: StatusWriter,
        lookups: Lookups,
        clock: Clock,
        *,
        run_id: str,
        may_act: Callable[[], bool],
        strict: bool = False,
        telemetry: Telemetry | None = None,
        namespace_ready: Callable[[str], bool] = lambda namespace: True,
        room_on: Callable[[set[str]], None] = lambda nodes: None,
        provisional: ProvisionalHolds | None = None,
    ) -> None:
        """``namespace_ready(namespace)``: whether the namespace's quotas are known.
        ``room_on(nodes)``: told whenever room may have come back on those nodes (the pods
        kube-scheduler left waiting for it are nudged)."""
        self._state, self._writer, self._lookups, self._clock = state, writer, lookups, clock
        self._namespace_ready = namespace_ready
        self._room_on = room_on
        self._provisional = provisional  # room held by a strict create's answer, by uid
        self._own = OwnClaims(state, lookups, clock)
        self._may_act, self._strict = may_act, strict
        self._telemetry = telemetry or NoTelemetry()
        self._queue: dict[str, Pending] = {}
        self._wake = asyncio.Event()
        self._sequence = itertools.count()
        self._arrivals = 0  # reservations queued so far (a pass sees whether more came)
        self._decisions = itertools.count(1)
        self.run_id = run_id

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, uid: str) -> bool:
        return uid in self._queue

    def undecided(self) -> int:
        """Reservations seen that carry no decision yet: queued here, or decided and not
        yet written (a reclaim is not a first decision; waiting for room is one)."""
        unwritten = sum(
            1
            for record in self._state.records.values()
            if not record.announced and record.decision.phase != Phase.RECLAIMED
        )
        return len(self._queue) + unwritten

    def undecided_on(self, node: str, unless: Callable[[str], bool] = lambda uid: False) -> int:
        """How many reservations on ``node`` wait here for their first decision (but those
        whose uid ``unless`` names)."""
        return sum(
            1
            for pending in self._queue.values()
            if spec_targets(pending.obj)[0] == node and not unless(pending.uid)
        )

    def submit(self, obj: JSON) -> None:
        """Queue an undecided reservation (idempotent: a uid is queued once)."""
        obj = decision_essentials(obj)
        metadata = obj["metadata"]
        uid = metadata["uid"]
        if uid in self._queue:
            self._queue[uid].obj = obj  # newest body, e.g. a heartbeat annotation
            return
        order = (metadata.get("creationTimestamp", ""), next(self._sequence))
        self._queue[uid] = Pending(
            uid, metadata["namespace"], metadata["name"], obj, order, self._clock.monotonic()
        )
        self._arrivals += 1
        self._wake.set()

    def withdraw(self, uid: str) -> None:
        self._queue.pop(uid, None)
        if self._provisional is not None:
            self._provisional.give_back(uid)

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Decide forever (a supervised task)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while not self._may_act():  # noqa: ASYNC110 - a Lease runs out by the clock
                await asyncio.sleep(_NOT_LEADER_PAUSE)
            self._settle_waiting()  # the older, waiting ones first
            await self._decide_queued()

    async def _decide_queued(self) -> None:
        """One pass over the queue, in :func:`fair_order`.

        Every ``_TURN`` decisions it lets the event loop run (watch events, writes),
        and if new reservations came meanwhile it ends the pass and is woken for the
        next one, which orders them in: a backlog is never a wall in front of a
        newcomer of another namespace.
        """
        waiting: set[str] = set()  # nodes with an earlier reservation still waiting
        decided: set[str] = set()
        arrivals = self._arrivals
        for count, (node, pending) in enumerate(fair_order(self._queue.values())):
            if count and not count % _TURN:
                await asyncio.sleep(0)  # between decisions: the ledger is consistent
                if self._arrivals != arrivals:
                    self._wake.set()
                    break
            if not self._may_act():  # a leader out of time decides nothing
                self._wake.set()
                break
            if self._queue.get(pending.uid) is not pending:  # withdrawn meanwhile
                continue
            if node in waiting or not self._ready(pending):
                waiting.add(node)  # later ones on its node wait too: creation order
                continue  # a lookup is under way; its answer wakes us
            del self._queue[pending.uid]
            decided.add(node)
            try:
                self._decide(pending)
            except Exception as error:  # one reservation must not stop the others
                log.exception(
                    "deciding %s/%s failed",
                    pending.namespace,
                    pending.name,
                    extra=about(pending.namespace, pending.name, pending.uid, node),
                )
                self._refuse(pending, Reason.INVALID_SPEC, f"could not be decided: {error}")
        if self._state.room_marked(decided):
            self._wake.set()  # waiters held back behind these may go now

    def _ready(self, pending: Pending) -> bool:
        node, pod = spec_targets(pending.obj)
        if node is not None and not self._lookups.node_ready(node, pending.seen):
            return False
        if not self._namespace_ready(pending.namespace):  # its labels decide its quotas
            return False
        if pod is None:
            return True
        if self._lookups.owner_pod(pending.namespace, pod, pending.seen) is None:
            return False
        return self._own.ready(pending.namespace, pending.name, pending.obj, pod, pending.seen)

    def _decide(self, pending: Pending) -> None:
        """Decide one reservation and hand it to the writer. No await in here."""
        state, now = self._state, self._clock.now()
        # The room its create was promised comes back, and is taken again just below.
        promised = self._provisional is not None and self._provisional.give_back(pending.uid)
        try:
            entry = reservation_entry(pending.obj, now)
        except InvalidValueError as error:
            self._refuse(pending, Reason.INVALID_SPEC, str(error))
            return
        if entry.owner.pod is not None:
            answer = self._lookups.owner_pod(pending.namespace, entry.owner.pod, pending.seen)
            if answer is PodAnswer.MISSING:
                self._refuse(
                    pending,
                    Reason.OWNER_POD_NOT_FOUND,
                    f"spec.owner.pod: pod {entry.owner.pod} not found in namespace "
                    f"{pending.namespace}",
                )
                return
            if answer is PodAnswer.UNLABELLED:
                self._refuse(
                    pending,
                    Reason.OWNER_POD_NOT_LABELLED,
                    f"spec.owner.pod: pod {entry.owner.pod} lacks the label "
                    f"{OWNER_LABEL}=true, so its heartbeats and its deletion cannot be followed",
                )
                return
        namesake = state.held_record(entry.id)
        if namesake is not None and namesake.uid != pending.uid:
            held = state.ledger.get(entry.id)
            if held is not None and held.created_at >= entry.created_at:
                # Not newer than the incarnation held: a late event of one it replaced (a
                # watch lagging a resync's list), and names are unique at a time. Left
                # undecided: were it the one that exists after all (created in the same
                # second, the held one's deletion lost), the next resync, not finding the
                # held one, forgets it and decides this one.
                log.info(
                    "%s: an earlier incarnation, not decided",
                    entry.id,
                    extra=about(pending.namespace, pending.name, pending.uid, entry.node),
                )
                return
            # Deleted and created again while its DELETED event was lost: the old one is gone.
            state.forget(namesake.uid, self._clock.monotonic())
        if self._own.is_own(pending.namespace, pending.obj, entry):
            verdict = state.ledger.record(entry, now)  # it runs there already: say so, fit or not
        else:
            # Under strict FIFO a promised one is not sent behind those that began waiting
            # since its answer (its room was taken first: some wait because of it).
            verdict = state.ledger.reserve_or_wait(
                entry, now, entry.wait_until, strict=self._strict and not promised
            )
        if verdict.admitted:
            phase = Phase.ADMITTED
        elif verdict.queued:
            phase = Phase.QUEUED
        else:
            phase = Phase.REJECTED
        record = self._record(pending, phase, verdict.reason, verdict.message, entry)
        record.decision.position = verdict.position
        state.remember(record)
        self._writer.ensure(record.uid)

    def _settle_waiting(self) -> None:
        """Decide what waits: refuse those whose wait ran out, admit those that fit now."""
        state, now = self._state, self._clock.now()
        for verdict in state.ledger.wait_over(now):
            record = state.waiting_record(verdict.entry.id)
            if record is not None:
                state.wait_ended(record)
                self._decide_again(record, Phase.REJECTED, verdict.reason, verdict.message)
        nodes = state.take_room()
        self._room_on(nodes)
        if not nodes or not len(state.ledger.waiting):
            return
        undecided = self._oldest_undecided() if self._strict else {}
        state.mark_room(*(nodes & undecided.keys()))  # settled again once those are decided
        admitted = state.ledger.admit_waiting(now, nodes, strict=self._strict, undecided=undecided)
        for verdict in admitted:
            record = state.waiting_record(verdict.entry.id)
            if record is None:  # cannot happen: every waiting entry has its record
                state.ledger.release(verdict.entry.id)
                continue
            self._decide_again(
                record,
                Phase.ADMITTED,
                verdict.reason,
                verdict.message,
                verdict.entry.devices,
                verdict.entry.given_expiry,
            )
            state.hold(record)
            waited = (now - verdict.entry.created_at).total_seconds()
            self._telemetry.waited(max(waited, 0.0))

    def _oldest_undecided(self) -> dict[str, tuple[datetime, str]]:
        """Per node, the creation key of the oldest reservation still to be decided."""
        oldest: dict[str, tuple[datetime, str]] = {}
        for pending in self._queue.values():
            node, _ = spec_targets(pending.obj)
            try:
                created = parse_time(pending.obj["metadata"].get("creationTimestamp"))
            except InvalidValueError:
                continue  # decided InvalidSpec, in no queue
            key = (created, f"{pending.namespace}/{pending.name}")
            if node is not None and (node not in oldest or key < oldest[node]):
                oldest[node] = key
        return oldest

    def _decide_again(
        self,
        record: Record,
        phase: Phase,
        reason: Reason,
        message: str,
        devices: dict[str, int] | None = None,
        expires_at: datetime | None = None,
    ) -> None:
        """A waiting reservation's final decision: a new decision, written like any other."""
        decision_id = f"{self.run_id}-{next(self._decisions)}"
        decision = StatusDecision(
            phase=phase,
            reason=reason,
            message=message[:1024],
            at=self._clock.now(),
            decision_id=decision_id,
            generation=record.decision.generation,
            devices=dict(devices or {}),
            expires_at=expires_at,
        )
        decision.stamp = self._state.stamper.sign(
            record.uid, decision_id, str(phase), decision.devices, decision.expiry_text
        )
        record.decision = decision
        record.changed_at = self._clock.monotonic()
        record.confirmed = record.announced = False
        self._state.mark_dirty(record.node)
        self._writer.ensure(record.uid)

    def _refuse(self, pending: Pending, reason: Reason, message: str) -> None:
        """Rejected without touching the ledger (the spec or its owner pod is unusable)."""
        state = self._state
        held = state.held_record(reservation_id(pending.namespace, pending.name))
        if held is not None and held.uid == pending.uid:  # reserved, then failed: undo it
            state.drop(pending.uid)
        record = self._record(pending, Phase.REJECTED, reason, message[:1024], None)
        state.remember(record)
        self._writer.ensure(record.uid)

    def _record(
        self, pending: Pending, phase: Phase, reason: Reason, message: str, entry: Entry | None
    ) -> Record:
        decision_id = f"{self.run_id}-{next(self._decisions)}"
        generation = pending.obj["metadata"].get("generation")
        admitted = entry is not None and phase == Phase.ADMITTED
        decision = StatusDecision(
            phase=phase,
            reason=reason,
            message=message,
            at=self._clock.now(),
            decision_id=decision_id,
            generation=generation if isinstance(generation, int) else None,
            devices=dict(entry.devices) if entry is not None and admitted else {},
            expires_at=entry.given_expiry if entry is not None and admitted else None,
        )
        decision.stamp = self._state.stamper.sign(
            pending.uid, decision_id, str(phase), decision.devices, decision.expiry_text
        )
        pod = entry.owner.pod if entry is not None else None
        try:
            beat = heartbeat_value(pending.obj)
        except InvalidValueError:
            beat = None
        beats: dict[str, str | None] = {RESERVATION: beat}
        seen = self._state.owner_pods.get((pending.namespace, pod)) if pod is not None else None
        owner_uid = owning_pod_uid(pending.obj)  # a gated pod's: exactly its incarnation
        if seen is not None and owner_uid is not None and seen.uid != owner_uid:
            seen = None  # an earlier pod of that name, not yet known gone: not its owner
        if pod is not None:
            beats[POD] = seen.beat if seen is not None else None
        now = self._clock.monotonic()
        return Record(
            uid=pending.uid,
            namespace=pending.namespace,
            name=pending.name,
            node=entry.node if entry is not None else "",
            decision=decision,
            pod=pod if phase in (Phase.ADMITTED, Phase.QUEUED) else None,
            pod_uid=owner_uid or (seen.uid if seen is not None else None),
            beats=beats,
            changed_at=now,
            seen_at=now,
            first_seen=pending.seen,
        )
