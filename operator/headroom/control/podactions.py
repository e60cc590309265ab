"""What a gated pod needs next: one pure decision from what is known of it.

The pod reconciler (:mod:`headroom.control.gates`) reads, for one pod key, the pod as
last seen and what is remembered of it (``ClaimPod``), the reservation it is known to
have (``Known``), that reservation's decision (``Record``) and the node facts, and asks
:func:`decide` for the one thing to do; then it does it. Kept apart and pure (no I/O,
no asyncio, ``now`` a parameter) so that every branch is a row of a table test, and
the plumbing that runs it (the keyed work queue) has no say in what is done.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from headroom.api.claims import PodClaim, is_claim_pod, pod_claim
from headroom.api.constants import RESERVATION_ANNOTATION
from headroom.api.parse import InvalidValueError
from headroom.api.reasons import EventReason, Phase, Reason
from headroom.control.state import Record
from headroom.objects.nodeconstraints import NodeFacts, may_run_on
from headroom.objects.podreservations import Booked, differences, for_another_claim
from headroom.objects.pods import (
    JSON,
    bound_node,
    condition_reason,
    is_finished,
    is_gated,
    pinned_to,
    unschedulable,
)

Kind = Literal["Normal", "Warning"]


@dataclass(frozen=True, slots=True)
class Known:
    """A pod-owned Reservation named as a pod: its uid, its owner's uid, what it books."""

    uid: str
    pod_uid: str
    book: Booked


@dataclass(slots=True)
class ClaimPod:
    """An opted-in pod as last seen, and what is remembered of it."""

    obj: JSON
    uid: str
    gated_at: float | None = None  # monotonic, when first seen gated
    said: str = ""  # the last Event posted about it (one per state)
    retry_after: float = 0.0  # monotonic; no new reservation before
    retries: int = 0
    refused: str = ""  # the uid of its last reservation seen finally refused
    sent: tuple[str, ...] = ()  # the condition last written, and the pod version it saw
    seen_at: float = 0.0  # monotonic: when a watch (or the list asked then) showed it
    # Facts that never go back for one incarnation, kept once seen: a watch event that
    # lags a newer list may show the pod as it was (unbound, running) a moment later.
    node: str | None = None  # the node it was bound to
    ended: bool = False  # Succeeded or Failed
    expired: bool = False  # ran, and its reservation was reclaimed Expired: no other one
    nudged: str = ""  # the uid of the reservation it was last nudged for (scheduler path)


# -- the actions ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Say:
    """Post an Event (once per state) and make the pod's condition say it."""

    reason: Reason | EventReason
    message: str
    kind: Kind = "Normal"


@dataclass(frozen=True, slots=True)
class Nothing:
    """Nothing to do until something changes."""


@dataclass(frozen=True, slots=True)
class Condition:
    """Make the pod's condition say this (no Event): an admitted pod's, kept written."""

    reason: Reason | EventReason
    message: str


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Give back what the pod's reservation holds (the pod ended)."""

    record: Record
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class Replace:
    """Delete the reservation ``uid`` (it is not the pod's to use); a new one follows."""

    uid: str
    say: Say | None = None


@dataclass(frozen=True, slots=True)
class LetGo:
    """The pod claims nothing: release what it booked (``uid``), remove our gate."""

    uid: str | None


@dataclass(frozen=True, slots=True)
class Create:
    """Make the pod's reservation: on ``node`` if it runs there, else placed."""

    claim: PodClaim
    node: str | None = None


@dataclass(frozen=True, slots=True)
class Ungate:
    """Pin the pod to its admitted reservation's node and remove our gate."""

    record: Record


@dataclass(frozen=True, slots=True)
class Fence:
    """Admitted for kube-scheduler's choice and not bound in time: fence the pod (one write
    that makes a Binding on its way fail), then, unless that shows it bound, release."""

    record: Record


@dataclass(frozen=True, slots=True)
class Nudge:
    """kube-scheduler left the pod unschedulable and the ledger has news for it: admitted
    from the ledger's queue, or refused and its retry delay over (the next filter queues
    it again). One write makes the scheduler try it now; once per reservation."""

    record: Record
    say: Say | None = None


@dataclass(frozen=True, slots=True)
class Expire:
    """Remember that the pod's lifetime ran out (it gets no other reservation), and say so."""

    say: Say


@dataclass(frozen=True, slots=True)
class BackOff:
    """A reservation first seen finally refused: remember it, say why, and only make a
    new one after the pod's retry delay (it stays visible a while)."""

    refused: str
    say: Say


@dataclass(frozen=True, slots=True)
class Later:
    """Look at the pod again in ``delay`` seconds (its retry delay runs)."""

    delay: float
    say: Say | None = None


PodAction = (
    Nothing | Say | Condition | Reclaim | Replace | LetGo | Create | Ungate | Expire | BackOff
) | (Later | Fence | Nudge)
#: Actions that call the API; one that succeeds ends the pod's failure backoff.
CALLS = (Replace, LetGo, Create, Ungate, Fence, Nudge)
#: How long a reservation admitted for kube-scheduler's choice waits for its Binding.
BIND_GRACE = 60.0


# -- the decision --------------------------------------------------------------------------------


def decide(
    seen: ClaimPod,
    known: Known | None,
    record: Record | None,
    node_facts: Mapping[str, NodeFacts],
    now: float,
    *,
    bind_grace: float = BIND_GRACE,
) -> PodAction:
    """The next thing pod ``seen`` needs, given its reservation ``known`` (if any), that
    reservation's ``record`` (None unless it was made for this incarnation), the facts
    of the nodes, and ``now`` (monotonic, as ``seen.retry_after`` and
    ``record.changed_at``); ``bind_grace``: seconds an admission for kube-scheduler's
    choice waits for its Binding."""
    pod = seen.obj
    name = str((pod.get("metadata") or {}).get("name", ""))
    if is_finished(pod):
        if record is not None and record.held:
            phase = (pod.get("status") or {}).get("phase")
            return Reclaim(record, Reason.OWNER_POD_FINISHED, f"pod {name} {phase}")
        if record is not None and record.confirmed and record.decision.phase == Phase.QUEUED:
            return Replace(record.uid)  # waits for nobody: deleted
        return Nothing()
    if known is not None and known.pod_uid != seen.uid:
        # Left by an earlier pod of the same name (its owner is gone: the garbage
        # collector deletes it too); this pod gets its own.
        return Replace(known.uid)
    if not is_claim_pod(pod):  # gated, but it claims nothing (any more)
        return LetGo(known.uid if known is not None else None)
    try:
        claim = pod_claim(pod)
    except InvalidValueError as error:
        return _bad_claim(seen, known, str(error))
    wait = seen.retry_after - now
    if known is None and wait > 0:
        return Later(wait)  # refused a moment ago: not again at once
    if is_gated(pod):
        return _gated(seen, claim, known, record, node_facts, now, name)
    if record is not None and record.confirmed and _expired(record):
        return Expire(
            Say(
                Reason.EXPIRED,
                f"reservation {record.name} {record.decision.message}, the lifetime its "
                "quota gives; the pod gets no other reservation",
                "Warning",
            )
        )
    if known is None and not _ran_out(seen) and (node := bound_node(pod)) is not None:
        return Create(claim, node)  # the webhook missed it
    if record is not None and record.confirmed and record.held and _awaits_binding(pod):
        left = record.changed_at + bind_grace - now
        if left <= 0:
            return Fence(record)
        if known is not None and known.book.waits and seen.nudged != record.uid:
            # Admitted from the ledger's queue (one made at a bind has no wait, and its
            # Binding is on its way): the scheduler is told to try the pod now.
            admitted = f"admitted on node {record.node} from its queue; kube-scheduler binds it"
            return Nudge(record, Say(EventReason.ADMITTED, admitted))
        # Nothing written meanwhile: its Binding comes within milliseconds, and its
        # condition is written once it is bound (a write per pod fewer in a burst).
        return Later(left)
    if record is not None and record.confirmed and record.held:
        if record.decision.reason == Reason.OVER_COMMITTED:
            return Say(Reason.OVER_COMMITTED, record.decision.message, "Warning")
        # Written again whenever the pod's condition says otherwise.
        return Condition(EventReason.ADMITTED, admitted_message(pod, record))
    made_to_wait = known is not None and known.book.waits  # by the extender's filter
    if made_to_wait and record is not None and record.confirmed and _awaits_binding(pod):
        return _waits_for_scheduler(seen, claim, record, now)
    return Nothing()


def running_claim(seen: ClaimPod, record: Record | None) -> tuple[str, PodClaim] | None:
    """Where pod ``seen`` runs and what it claims, while the ledger has no decision about
    a reservation of it (``record``: that of its own reservation, None if none is
    decided): bound without Headroom's gate (the webhook missed it, the operator was
    down), before its reservation is made and recorded (:func:`decide`'s ``Create`` on
    its node, then the decider). The ledger counts that claim against its namespace's
    quotas meanwhile, so no decision admits into room the pod already uses. None: it
    has a decision, has not run or no longer runs, claims nothing readable, or ran out
    (it gets no other reservation)."""
    pod = seen.obj
    node = seen.node or bound_node(pod)
    if record is not None or node is None or seen.ended or is_finished(pod):
        return None
    if not is_claim_pod(pod) or _ran_out(seen):
        return None
    try:
        return node, pod_claim(pod)
    except InvalidValueError:
        return None


def _waits_for_scheduler(seen: ClaimPod, claim: PodClaim, record: Record, now: float) -> PodAction:
    """A pod kube-scheduler places, whose reservation from the ledger's queue waits or
    was refused: it says so, as a gated pod does; refused, once its retry delay is over,
    it is nudged, and the scheduler's next filter queues it again (its own wait run
    out: it stays, and filter refuses it everywhere)."""
    action = _refused(seen, claim, record, now)
    if isinstance(action, Replace):
        if seen.nudged == record.uid or not unschedulable(seen.obj):
            return Nothing()
        return Nudge(record, action.say)
    return action


def _gated(
    seen: ClaimPod,
    claim: PodClaim,
    known: Known | None,
    record: Record | None,
    node_facts: Mapping[str, NodeFacts],
    now: float,
    name: str,
) -> PodAction:
    if known is None:
        return Create(claim)
    differ = differences(known.book, name, claim)
    if differ and for_another_claim(known.book, name):  # its claim was edited since
        why = Say(
            EventReason.CLAIM_CHANGED,
            f"the Reservation {name} was made for another claim ({'; '.join(differ)}); "
            "it is released and one made for the pod's claim now",
        )
        return Replace(known.uid, why)
    if differ:  # not what the operator makes for this claim: it lets nobody out
        return Say(
            EventReason.RESERVATION_NAME_TAKEN,
            f"the Reservation {name}, owned by this pod, is not the one Headroom makes "
            f"for its claim ({'; '.join(differ)}); delete it and one is made, or the pod "
            "stays gated",
            "Warning",
        )
    facts = node_facts.get(known.book.node)
    if facts is not None and not may_run_on(seen.obj, facts):
        # Its nodeSelector or affinity narrowed, or the node tainted or cordoned since
        # it was placed: pinned there it would never be scheduled.
        why = Say(
            EventReason.NODE_UNSUITABLE,
            f"node {known.book.node} no longer suits the pod (its node selector, "
            "affinity or tolerations against the node's labels, taints and cordon); "
            "its reservation there is released and it is placed again",
        )
        return Replace(known.uid, why)
    if record is not None and record.held and record.confirmed:
        return Ungate(record)
    if record is not None and record.confirmed:
        return _refused(seen, claim, record, now)
    return Nothing()


def _bad_claim(seen: ClaimPod, known: Known | None, error: str) -> PodAction:
    if not is_gated(seen.obj):
        return Say(EventReason.BAD_CLAIM, f"{error}; not gated by Headroom", "Warning")
    why = Say(
        EventReason.BAD_CLAIM,
        f"{error}; it holds no reservation and stays gated until its claim is read",
        "Warning",
    )
    if known is not None:  # what it booked is no longer what it claims
        return Replace(known.uid, why)
    return why


def _refused(seen: ClaimPod, claim: PodClaim, record: Record, now: float) -> PodAction:
    decision = record.decision
    if decision.phase == Phase.QUEUED:
        where = f" at position {decision.position}" if decision.position else ""
        waits = f"waits for room on node {record.node}{where}: {decision.message}"
        return Say(EventReason.WAITING, waits)
    if decision.phase == Phase.RECLAIMED and decision.reason == Reason.OWNER_POD_FINISHED:
        return Nothing()
    why = Say(decision.reason, decision.message, "Warning")
    if decision.reason == Reason.WAIT_TIMEOUT and claim.wait is not None:
        return why  # its own wait ran out: it stays gated, and says why
    if seen.refused != record.uid:  # first seen refused: it stays visible a while
        return BackOff(record.uid, why)
    wait = seen.retry_after - now
    if wait > 0:
        return Later(wait, why)
    return Replace(record.uid, why)  # then a new one is made


# -- small facts ---------------------------------------------------------------------------------


def _expired(record: Record) -> bool:
    return record.decision.phase == Phase.RECLAIMED and record.decision.reason == Reason.EXPIRED


def _awaits_binding(pod: JSON) -> bool:
    """Admitted at kube-scheduler's bind, not bound (yet): neither bound nor pinned (the
    gate path's pin names the reservation; the scheduler path's Binding does, with the
    node, in one write)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return bound_node(pod) is None and RESERVATION_ANNOTATION not in annotations


def _ran_out(seen: ClaimPod) -> bool:
    """Whether the pod ran and its reservation was reclaimed Expired (seen now, or said in
    its condition before a restart): it never gets another, or a quota's lifetime would
    be renewed for as long as the pod runs."""
    return seen.expired or condition_reason(seen.obj) == Reason.EXPIRED


def admitted_message(pod: JSON, record: Record) -> str:
    devices = record.decision.devices
    on = f"; GPU devices {','.join(sorted(devices))}" if devices else ""
    if RESERVATION_ANNOTATION not in ((pod.get("metadata") or {}).get("annotations") or {}):
        return f"recorded on node {record.node}, where it runs; reservation {record.name}{on}"
    if not pinned_to(pod, record.node):  # the scheduler path's Binding named it, not a pin
        return f"bound to node {record.node} by kube-scheduler; reservation {record.name}{on}"
    return f"pinned to node {record.node}; reservation {record.name}{on}"
