"""Gated pods under quotas (issue 29, items 4, 5, 8), pure: the default wait, the nodes a
placement may choose, and the deadline the ungate patch gives a pod with a lifetime."""

from __future__ import annotations

from copy import deepcopy
from datetime import timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from headroom.api.claims import PodClaim
from headroom.api.constants import MAX_WAIT
from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.api.selectors import LabelSelector
from headroom.control.placement import Placement, choose_node
from headroom.control.state import State
from headroom.ledger.quotas import QuotaRules
from headroom.objects.nodeconstraints import NodeFacts
from headroom.objects.pods import (
    active_deadline,
    condition_reason,
    pod_reservation,
    pod_wait,
    ungate_patch,
)
from headroom_dev.sim.fakeapi.jsonvalue import apply_json_patch
from tests.unit.test_core_admission import T0, entry
from tests.unit.test_ledger_quotas import ledger, team

GATE = "headroom.dev/admission"
ML = LabelSelector(match_labels={"team": "ml"})
GPU_NODES = LabelSelector(match_labels={"pool": "gpu"})


def gated(name: str = "p", namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": "u1"},
        "spec": {"schedulingGates": [{"name": GATE}], **spec},
    }


def state(nodes: dict[str, tuple[int, dict[str, str]]], *quotas: QuotaRules) -> State:
    """Nodes name -> (RAM MiB, labels), known to the ledger and to placement; namespace ml
    is team ml."""
    built = State(Limits(system_reserve_mb=0))
    for name, (ram, labels) in nodes.items():
        built.ledger.set_node_capacity(name, ram)
        built.ledger.set_node_labels(name, labels)
        built.set_node_facts(name, NodeFacts(name, labels))
    built.ledger.set_namespace("ml", {"team": "ml"})
    for rules in quotas:
        built.ledger.set_quota(rules)
    return built


# -- item 4: the default wait fits the quotas ---------------------------------------------------


def test_the_max_wait_is_the_smallest_a_valid_quota_gives() -> None:
    book = ledger()
    assert book.quotas.max_wait("ml") is None
    book.set_quota(QuotaRules("long", team("ml"), max_wait=timedelta(hours=2)))
    book.set_quota(QuotaRules("short", team("ml"), max_wait=timedelta(minutes=10)))
    book.set_quota(
        QuotaRules("broken", team("ml"), max_wait=timedelta(seconds=1), invalid="unreadable")
    )
    assert book.quotas.max_wait("ml") == timedelta(minutes=10)
    assert book.quotas.max_wait("ml-dev") == timedelta(minutes=10)
    assert book.quotas.max_wait("web") is None


def test_a_pods_wait_is_its_own_else_as_long_as_its_quotas_allow() -> None:
    ten = timedelta(minutes=10)
    assert pod_wait(PodClaim(1024), None) == MAX_WAIT
    assert pod_wait(PodClaim(1024), ten) == ten
    assert pod_wait(PodClaim(1024), timedelta(days=2)) == MAX_WAIT
    assert pod_wait(PodClaim(1024), timedelta(seconds=90, milliseconds=500)) == timedelta(
        seconds=90
    )  # whole seconds, as spec.wait says it: never over the bound
    assert pod_wait(PodClaim(1024), timedelta(milliseconds=500)) is None
    assert pod_wait(PodClaim(1024, wait=timedelta(hours=1)), ten) == timedelta(hours=1)

    body = pod_reservation(gated(), PodClaim(1024), "n1", max_wait=ten)
    assert body["spec"]["wait"] == "600s"
    never = pod_reservation(gated(), PodClaim(1024), "n1", max_wait=timedelta(0))
    assert "wait" not in never["spec"]  # maxWait 0: it may not wait at all


# -- item 5: placement asks the ledger for final refusals ----------------------------------------


def test_final_refusals_are_the_node_the_lifetime_and_the_wait_never_the_room() -> None:
    book = ledger()
    book.set_quota(
        QuotaRules("q", team("ml"), ram_mb=1024, nodes=GPU_NODES, max_wait=timedelta(minutes=10))
    )
    assert book.quotas.final_refusal(entry("ml/a", 4096, node="n1")) is None  # full: waitable
    outside = book.quotas.final_refusal(entry("ml/b", 1, node="n2"))
    assert outside is not None
    assert outside[0] == Reason.NODE_NOT_ALLOWED
    patient = entry("ml/c", 1, node="n1", wait_until=T0 + timedelta(hours=1))
    refusal = book.quotas.final_refusal(patient)
    assert refusal is not None
    assert refusal[0] == Reason.WAIT_TOO_LONG
    assert book.refusal(patient, T0) == refusal  # the decision says the same


def test_placement_chooses_the_node_its_quota_allows_not_the_roomiest() -> None:
    quota = QuotaRules("q", ML, nodes=GPU_NODES)
    nodes = {"big": (64 * 1024, {"pool": "cpu"}), "small": (8 * 1024, {"pool": "gpu"})}
    assert choose_node(state(nodes, quota), [], gated(), PodClaim(1024), T0) == Placement("small")
    assert choose_node(state(nodes), [], gated(), PodClaim(1024), T0) == Placement("big")


def test_a_pod_no_allowed_node_matches_is_told_why_in_one_sentence() -> None:
    quota = QuotaRules("q", ML, nodes=GPU_NODES)
    nodes = {"a": (8192, {"pool": "cpu"}), "b": (8192, {"pool": "cpu"})}
    placed = choose_node(state(nodes, quota), [], gated(), PodClaim(1024), T0)
    assert (placed.node, placed.reason) == (None, Reason.NODE_NOT_ALLOWED)
    assert placed.why == (
        "its quota allows none of the 2 nodes it may run on: namespace ml (quota q): node a "
        "is outside spec.nodeSelector (pool=gpu); it stays gated"
    )
    named = choose_node(state(nodes, quota), [], gated(), PodClaim(1024, node="b"), T0)
    assert (named.node, named.reason) == (None, Reason.NODE_NOT_ALLOWED)
    assert named.why.startswith("its quota does not allow the node it may run on: ")
    nowhere = choose_node(state(nodes, quota), [], gated(nodeSelector={"x": "y"}), PodClaim(1), T0)
    assert (nowhere.node, nowhere.reason) == (None, "NoNode")


def test_a_wait_over_the_max_wait_is_said_whatever_the_nodes() -> None:
    quota = QuotaRules("q", ML, nodes=GPU_NODES, max_wait=timedelta(minutes=10))
    nodes = {"cpu": (8192, {"pool": "cpu"}), "gpu": (8192, {"pool": "gpu"})}
    claim = PodClaim(1024, wait=timedelta(hours=1))
    placed = choose_node(state(nodes, quota), [], gated(), claim, T0)
    assert (placed.node, placed.reason) == (None, Reason.WAIT_TOO_LONG)
    assert placed.why == (
        "annotation headroom.dev/wait: namespace ml (quota q): spec.wait 1h is longer than "
        "spec.maxWait 10m; it stays gated"
    )
    # Without a wait of its own, the pod's wait is the quota's: placed.
    assert choose_node(state(nodes, quota), [], gated(), PodClaim(1024), T0) == Placement("gpu")


# -- item 8: a lifetime ends the pod --------------------------------------------------------------


@given(
    left=st.integers(min_value=-5_000, max_value=10**7).map(lambda ms: timedelta(milliseconds=ms)),
    own=st.none() | st.integers(min_value=1, max_value=10**5),
)
def test_the_ungate_patch_ends_the_pod_by_its_reservations_expiry(
    left: timedelta, own: int | None
) -> None:
    spec = {} if own is None else {"activeDeadlineSeconds": own}
    before = gated(**spec)
    operations = ungate_patch(before, "n1", "p", time_left=left)
    assert operations is not None
    after = apply_json_patch(deepcopy(before), operations)
    deadline = after["spec"]["activeDeadlineSeconds"]
    bound = max(int(left.total_seconds()), 1)
    assert 1 <= deadline <= bound or deadline == own  # by the expiry, or sooner of its own
    assert own is None or deadline <= own  # never raised (the API server refuses it)
    assert active_deadline(before, left) == (None if own is not None and own <= bound else bound)


def test_without_an_expiry_the_pod_keeps_its_spec() -> None:
    operations = ungate_patch(gated(), "n1", "p")
    assert operations is not None
    assert "activeDeadlineSeconds" not in apply_json_patch(gated(), operations)["spec"]


def test_the_pods_condition_reason_is_read_back() -> None:
    pod = gated()
    assert condition_reason(pod) is None
    pod["status"] = {
        "conditions": [
            {"type": "PodScheduled", "reason": "SchedulingGated"},
            {"type": "headroom.dev/Admitted", "status": "False", "reason": "Expired"},
        ]
    }
    assert condition_reason(pod) == "Expired"
