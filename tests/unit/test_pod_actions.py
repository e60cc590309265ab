"""What a gated pod needs next, as a table: one row per branch of ``decide``.

No asyncio, no API: the pod as seen, what is remembered of it, its reservation, that
reservation's decision and the node facts go in; one action comes out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import pytest

from headroom.api.claims import pod_claim
from headroom.api.constants import (
    CLAIM_LABEL,
    RAM_ANNOTATION,
    RESERVATION_ANNOTATION,
    SCHEDULING_GATE,
    WAIT_ANNOTATION,
)
from headroom.api.reasons import Phase, Reason
from headroom.control.podactions import (
    BackOff,
    ClaimPod,
    Condition,
    Create,
    Expire,
    Fence,
    Known,
    Later,
    LetGo,
    Nothing,
    Nudge,
    PodAction,
    Reclaim,
    Replace,
    Say,
    Ungate,
    decide,
    running_claim,
)
from headroom.control.state import Record
from headroom.objects.nodeconstraints import NodeFacts
from headroom.objects.podreservations import Booked
from headroom.objects.pods import CONDITION, JSON, pinned_to
from headroom.objects.status import StatusDecision

NOW = 1000.0  # monotonic
AT = datetime(2026, 1, 1, tzinfo=UTC)
NAME, POD_UID, RES_UID = "train", "pod-1", "res-1"
NODE = "n1"
FACTS = {NODE: NodeFacts(NODE), "cordoned": NodeFacts("cordoned", unschedulable=True)}


def pod(
    *,
    gated: bool = True,
    labelled: bool = True,
    ram: str = "1Gi",
    wait: str | None = None,
    phase: str = "Pending",
    node: str | None = None,
    pinned: bool = False,
    condition: str | None = None,
    unschedulable: bool = False,
    bound_with_reservation: bool = False,
) -> JSON:
    annotations = {RAM_ANNOTATION: ram}
    if wait is not None:
        annotations[WAIT_ANNOTATION] = wait
    spec: JSON = {"containers": [{"name": "c"}]}
    if bound_with_reservation:  # the scheduler path's Binding wrote the annotation
        annotations[RESERVATION_ANNOTATION] = NAME
    if pinned:  # the gate path's ungate patch: the reservation named, the node pinned
        annotations[RESERVATION_ANNOTATION] = NAME
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
        selector = {"nodeSelectorTerms": [term]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}
        }
    if gated:
        spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    if node is not None:
        spec["nodeName"] = node
    status: JSON = {"phase": phase}
    if condition is not None:
        status["conditions"] = [{"type": CONDITION, "status": "False", "reason": condition}]
    if unschedulable:  # kube-scheduler tried it and found no node
        scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        status["conditions"] = [*status.get("conditions", []), scheduled]
    return {
        "metadata": {
            "name": NAME,
            "namespace": "ml",
            "uid": POD_UID,
            "labels": {CLAIM_LABEL: "true"} if labelled else {},
            "annotations": annotations,
        },
        "spec": spec,
        "status": status,
    }


def known(
    *,
    node: str = NODE,
    ram_mb: int = 1024,
    pod_uid: str = POD_UID,
    owner_pod: str = NAME,
    waits: bool = False,
) -> Known:
    """``waits``: made with a ``spec.wait`` (a queue's, not a bind's)."""
    claim = pod_claim(pod())
    book = Booked(node, ram_mb, 0, claim.gpus, owner_pod, "Pod", waits=waits)
    return Known(RES_UID, pod_uid, book)


def record(
    phase: Phase, reason: Reason, *, confirmed: bool = True, message: str = "because"
) -> Record:
    decision = StatusDecision(
        phase, reason, message, AT, position=2 if phase == Phase.QUEUED else None
    )
    return Record(
        RES_UID, "ml", NAME, NODE, decision, pod=NAME, pod_uid=POD_UID, confirmed=confirmed
    )


ADMITTED = record(Phase.ADMITTED, Reason.FITS)
REFUSED = record(Phase.REJECTED, Reason.INSUFFICIENT_RAM)


@dataclass(frozen=True)
class Row:
    """One branch: what goes in, the action that comes out."""

    meaning: str
    obj: JSON
    want: PodAction | type
    known: Known | None = None
    record: Record | None = None
    remembered: dict[str, object] = field(default_factory=dict)  # ClaimPod fields


ROWS = [
    Row(
        "finished, its reservation holding memory -> reclaimed OwnerPodFinished",
        pod(gated=False, node=NODE, phase="Succeeded"),
        Reclaim(ADMITTED, Reason.OWNER_POD_FINISHED, f"pod {NAME} Succeeded"),
        known(),
        ADMITTED,
    ),
    Row(
        "finished, its reservation still queued -> deleted",
        pod(phase="Failed"),
        Replace(RES_UID),
        known(),
        record(Phase.QUEUED, Reason.INSUFFICIENT_RAM),
    ),
    Row(
        "finished, its reservation neither held nor queued -> nothing",
        pod(phase="Failed"),
        Nothing(),
        known(),
        REFUSED,
    ),
    Row(
        "a reservation of an earlier pod of the same name -> deleted, this pod gets its own",
        pod(),
        Replace(RES_UID),
        known(pod_uid="pod-0"),
    ),
    Row(
        "gated, not labelled, holding a reservation -> let go, the reservation released",
        pod(labelled=False),
        LetGo(RES_UID),
        known(),
    ),
    Row("gated, not labelled, nothing booked -> let go", pod(labelled=False), LetGo(None)),
    Row(
        "an unreadable claim, not gated -> says BadClaim",
        pod(gated=False, ram="lots"),
        Say,
    ),
    Row(
        "an unreadable claim, gated, holding a reservation -> released, says BadClaim",
        pod(ram="lots"),
        Replace,
        known(),
    ),
    Row("an unreadable claim, gated, nothing booked -> says BadClaim", pod(ram="lots"), Say),
    Row(
        "no reservation, refused a moment ago -> looked at again when its delay runs out",
        pod(),
        Later(30.0),
        remembered={"retry_after": NOW + 30},
    ),
    Row("gated, no reservation -> one is created, placed", pod(), Create(pod_claim(pod()))),
    Row(
        "gated, its reservation not of the operator's shape (another owner) -> says so, gated",
        pod(),
        Say,
        known(ram_mb=1, owner_pod="someone-else"),
    ),
    Row(
        "gated, its reservation of the operator's shape for another size -> replace, ClaimChanged",
        pod(),
        Replace,
        known(ram_mb=1),
    ),
    Row(
        "gated, node cordoned since -> replace, NodeUnsuitable",
        pod(),
        Replace,
        known(node="cordoned"),
        ADMITTED,
    ),
    Row(
        "gated, reservation admitted and written -> ungate",
        pod(),
        Ungate(ADMITTED),
        known(),
        ADMITTED,
    ),
    Row(
        "gated, reservation admitted but not written yet -> nothing",
        pod(),
        Nothing(),
        known(),
        replace(ADMITTED, confirmed=False),
    ),
    Row("gated, reservation not decided yet -> nothing", pod(), Nothing(), known()),
    Row(
        "gated, reservation queued -> says Waiting, with its place",
        pod(),
        Say(
            "Waiting",
            f"waits for room on node {NODE} at position 2: because",
        ),
        known(),
        record(Phase.QUEUED, Reason.INSUFFICIENT_RAM),
    ),
    Row(
        "gated, reservation reclaimed as its pod finished -> nothing",
        pod(),
        Nothing(),
        known(),
        record(Phase.RECLAIMED, Reason.OWNER_POD_FINISHED),
    ),
    Row(
        "gated, its own wait ran out -> says WaitTimeout and stays gated, no new reservation",
        pod(wait="1m"),
        Say(str(Reason.WAIT_TIMEOUT), "because", "Warning"),
        known(),
        record(Phase.REJECTED, Reason.WAIT_TIMEOUT),
    ),
    Row(
        "gated, reservation first seen refused -> says why, remembered, retried after a delay",
        pod(),
        BackOff(RES_UID, Say(str(Reason.INSUFFICIENT_RAM), "because", "Warning")),
        known(),
        REFUSED,
    ),
    Row(
        "gated, refused and seen before, its delay running -> says why, looked at again later",
        pod(),
        Later(5.0, Say(str(Reason.INSUFFICIENT_RAM), "because", "Warning")),
        known(),
        REFUSED,
        {"refused": RES_UID, "retry_after": NOW + 5},
    ),
    Row(
        "gated, refused and seen before, its delay over -> deleted, a new one follows",
        pod(),
        Replace(RES_UID, Say(str(Reason.INSUFFICIENT_RAM), "because", "Warning")),
        known(),
        REFUSED,
        {"refused": RES_UID, "retry_after": NOW - 1},
    ),
    Row(
        "running, its reservation reclaimed Expired -> remembered, says Expired",
        pod(gated=False, node=NODE, phase="Running", pinned=True),
        Expire,
        known(),
        record(Phase.RECLAIMED, Reason.EXPIRED),
    ),
    Row(
        "running, bound, no reservation (the webhook missed it) -> created on its node",
        pod(gated=False, node=NODE, phase="Running"),
        Create(pod_claim(pod()), NODE),
    ),
    Row(
        "running, no reservation, its lifetime ran out before -> nothing, never another",
        pod(gated=False, node=NODE, phase="Running"),
        Nothing(),
        remembered={"expired": True},
    ),
    Row(
        "running, no reservation, its condition says Expired (a restart) -> nothing",
        pod(gated=False, node=NODE, phase="Running", condition="Expired"),
        Nothing(),
    ),
    Row(
        "running, recorded over the limit -> says OverCommitted",
        pod(gated=False, node=NODE, phase="Running"),
        Say("OverCommitted", "over", "Warning"),
        known(),
        record(Phase.ADMITTED, Reason.OVER_COMMITTED, message="over"),
    ),
    Row(
        "running, pinned and admitted -> its condition says Admitted (written if not)",
        pod(gated=False, node=NODE, phase="Running", pinned=True),
        Condition("Admitted", f"pinned to node {NODE}; reservation {NAME}"),
        known(),
        ADMITTED,
    ),
    Row(
        "running, recorded where it runs (never gated) -> its condition says so",
        pod(gated=False, node=NODE, phase="Running"),
        Condition("Admitted", f"recorded on node {NODE}, where it runs; reservation {NAME}"),
        known(),
        ADMITTED,
    ),
    Row(
        "not gated, not bound, no reservation -> nothing (the scheduler has it)",
        pod(gated=False),
        Nothing(),
    ),
    Row(
        "admitted at kube-scheduler's bind, not bound yet, within the grace -> looks again "
        "when the grace runs out (its Binding is on its way)",
        pod(gated=False),
        Later(40.0),
        known(),
        replace(ADMITTED, changed_at=NOW - 20),
    ),
    Row(
        "admitted at kube-scheduler's bind, not bound past the grace -> fenced, then released",
        pod(gated=False),
        Fence(replace(ADMITTED, changed_at=NOW - 61)),
        known(),
        replace(ADMITTED, changed_at=NOW - 61),
    ),
    Row(
        "for kube-scheduler, its reservation in the ledger's queue -> says where it waits",
        pod(gated=False, unschedulable=True),
        Say("Waiting", f"waits for room on node {NODE} at position 2: because"),
        known(waits=True),
        record(Phase.QUEUED, Reason.INSUFFICIENT_RAM),
    ),
    Row(
        "for kube-scheduler, admitted from the ledger's queue while it is unschedulable -> "
        "nudged (the scheduler tries it now)",
        pod(gated=False, unschedulable=True),
        Nudge(
            replace(ADMITTED, changed_at=NOW - 20),
            Say("Admitted", f"admitted on node {NODE} from its queue; kube-scheduler binds it"),
        ),
        known(waits=True),
        replace(ADMITTED, changed_at=NOW - 20),
    ),
    Row(
        "for kube-scheduler, admitted from the queue and nudged -> looks again when the grace "
        "runs out",
        pod(gated=False, unschedulable=True),
        Later(40.0),
        known(waits=True),
        replace(ADMITTED, changed_at=NOW - 20),
        {"nudged": RES_UID},
    ),
    Row(
        "for kube-scheduler, refused from the queue, first seen -> says why, backs off",
        pod(gated=False, unschedulable=True),
        BackOff,
        known(waits=True),
        REFUSED,
    ),
    Row(
        "for kube-scheduler, refused, its retry delay over -> nudged (its next filter queues "
        "it again)",
        pod(gated=False, unschedulable=True),
        Nudge(REFUSED, Say(str(Reason.INSUFFICIENT_RAM), "because", "Warning")),
        known(waits=True),
        REFUSED,
        {"refused": RES_UID},
    ),
    Row(
        "for kube-scheduler, refused and nudged for it already -> nothing",
        pod(gated=False, unschedulable=True),
        Nothing(),
        known(waits=True),
        REFUSED,
        {"refused": RES_UID, "nudged": RES_UID},
    ),
    Row(
        "for kube-scheduler, its own wait ran out -> says why and stays (filter refuses it)",
        pod(gated=False, wait="1m", unschedulable=True),
        Say(str(Reason.WAIT_TIMEOUT), "because", "Warning"),
        known(waits=True),
        record(Phase.REJECTED, Reason.WAIT_TIMEOUT),
    ),
    Row(
        "admitted at kube-scheduler's bind (no wait), unschedulable once, the watch behind its "
        "Binding -> no nudge: its Binding is on its way",
        pod(gated=False, unschedulable=True),
        Later(40.0),
        known(),
        replace(ADMITTED, changed_at=NOW - 20),
    ),
    Row(
        "refused at kube-scheduler's bind (no wait) -> nothing: the scheduler's backoff retries",
        pod(gated=False, unschedulable=True),
        Nothing(),
        known(),
        REFUSED,
    ),
    Row(
        "bound by kube-scheduler through the extender (its Binding named the reservation) -> "
        "its condition says so",
        pod(gated=False, node=NODE, phase="Running", bound_with_reservation=True),
        Condition("Admitted", f"bound to node {NODE} by kube-scheduler; reservation {NAME}"),
        known(),
        ADMITTED,
    ),
    Row(
        "ungated and pinned by the gate path, its reservation refused since -> not the "
        "scheduler path's: nothing",
        pod(gated=False, pinned=True, unschedulable=True),
        Nothing(),
        known(waits=True),
        REFUSED,
    ),
    Row(
        "ungated and pinned by the gate path, not bound yet -> no grace: it is pinned there",
        pod(gated=False, pinned=True),
        Condition("Admitted", f"pinned to node {NODE}; reservation {NAME}"),
        known(),
        replace(ADMITTED, changed_at=NOW - 600),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.meaning for row in ROWS])
def test_what_a_pod_needs_next(row: Row) -> None:
    seen = ClaimPod(row.obj, POD_UID)
    for name, value in row.remembered.items():
        setattr(seen, name, value)
    action = decide(seen, row.known, row.record, FACTS, NOW)
    if isinstance(row.want, type):
        assert type(action) is row.want, action
    else:
        assert action == row.want


def test_the_says_name_what_is_wrong() -> None:
    """The rows above that only name the action's kind: what each says."""

    def said(action: PodAction) -> Say:
        say = getattr(action, "say", action)
        assert isinstance(say, Say), action
        return say

    bad = decide(ClaimPod(pod(ram="lots"), POD_UID), known(), None, FACTS, NOW)
    assert bad == Replace(RES_UID, said(bad))
    assert (said(bad).reason, said(bad).kind) == ("BadClaim", "Warning")
    assert "stays gated until its claim is read" in said(bad).message
    ungated = said(decide(ClaimPod(pod(gated=False, ram="lots"), POD_UID), None, None, FACTS, NOW))
    assert ungated.reason == "BadClaim"
    assert ungated.message.endswith("not gated by Headroom")
    forged = known(ram_mb=1, owner_pod="someone-else")
    taken = said(decide(ClaimPod(pod(), POD_UID), forged, None, FACTS, NOW))
    assert taken.reason == "ReservationNameTaken"
    assert "ramMB 1, not 1024" in taken.message
    resized = decide(ClaimPod(pod(), POD_UID), known(ram_mb=1), None, FACTS, NOW)
    assert resized == Replace(RES_UID, said(resized))
    assert said(resized).reason == "ClaimChanged"
    assert "made for another claim (ramMB 1, not 1024)" in said(resized).message
    moved = decide(ClaimPod(pod(), POD_UID), known(node="cordoned"), ADMITTED, FACTS, NOW)
    assert moved == Replace(RES_UID, said(moved))
    assert said(moved).reason == "NodeUnsuitable"
    assert "node cordoned no longer suits the pod" in said(moved).message
    ran_out = decide(
        ClaimPod(pod(gated=False, node=NODE, phase="Running"), POD_UID),
        known(),
        record(Phase.RECLAIMED, Reason.EXPIRED, message="expired at noon"),
        FACTS,
        NOW,
    )
    assert said(ran_out).reason == "Expired"
    assert said(ran_out).message.startswith(f"reservation {NAME} expired at noon")


def test_a_pin_is_told_from_a_binding_whatever_the_pods_own_terms() -> None:
    """The ungate patch pins every term that asks something (not an empty one), beside
    the pod's own requirements, even its own single-node ones."""
    own = {"key": "metadata.name", "operator": "In", "values": ["other"]}
    ours = {"key": "metadata.name", "operator": "In", "values": [NODE]}
    terms = [{"matchFields": [own, ours]}, {"matchExpressions": [], "matchFields": [ours]}, {}]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": terms
    }
    pinned = {"spec": {"affinity": affinity}}
    assert pinned_to(pinned, NODE)
    assert not pinned_to(pinned, "other")
    assert not pinned_to({"spec": {}}, NODE)


@pytest.mark.parametrize(
    ("meaning", "obj", "decided", "remembered", "counted"),
    [
        ("bound, no decision about its reservation", pod(gated=False, node=NODE), None, {}, True),
        ("bound, its reservation decided", pod(gated=False, node=NODE), ADMITTED, {}, False),
        (
            "bound, refused: as before, held nowhere",
            pod(gated=False, node=NODE),
            REFUSED,
            {},
            False,
        ),
        ("gated: runs nowhere", pod(), None, {}, False),
        ("not bound", pod(gated=False), None, {}, False),
        ("bound once (a lagging event)", pod(gated=False), None, {"node": NODE}, True),
        ("ended", pod(gated=False, node=NODE, phase="Failed"), None, {}, False),
        ("ended once seen", pod(gated=False, node=NODE), None, {"ended": True}, False),
        ("no longer claiming", pod(gated=False, node=NODE, labelled=False), None, {}, False),
        ("claim unreadable", pod(gated=False, node=NODE, ram="lots"), None, {}, False),
        (
            "ran out (its condition says so)",
            pod(gated=False, node=NODE, condition=Reason.EXPIRED),
            None,
            {},
            False,
        ),
        ("ran out (seen)", pod(gated=False, node=NODE), None, {"expired": True}, False),
    ],
)
def test_a_pod_running_with_no_decision_about_its_reservation_counts_its_claim(
    meaning: str, obj: JSON, decided: Record | None, remembered: dict[str, object], counted: bool
) -> None:
    seen = ClaimPod(obj, POD_UID)
    for name, value in remembered.items():
        setattr(seen, name, value)
    got = running_claim(seen, decided)
    if counted:
        assert got is not None, meaning
        assert (got[0], got[1].ram_mb) == (NODE, 1024), meaning
    else:
        assert got is None, meaning
