"""The extender's answers, pure: which nodes have room for a pod's claim (the ledger's
own refusal, per node, with its reason), and the node policy's scores."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from headroom.api.gpus import GpuDevice
from headroom.api.limits import Limits
from headroom.api.reasons import Phase, Reason
from headroom.api.selectors import LabelSelector
from headroom.control.extender import MAX_SCORE, filter_nodes, prioritize, queue_node
from headroom.control.state import Record, State
from headroom.ledger.quotas import QuotaRules
from headroom.objects.status import StatusDecision
from tests.unit.test_core_admission import T0, entry

GIB = 1024


def pod(ram: str, namespace: str = "ml") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": namespace,
            "labels": {"headroom.dev/claim": "true"},
            "annotations": {"headroom.dev/ram": ram},
        },
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def nodes(**ram_gib: int) -> State:
    state = State(Limits(system_reserve_mb=0))
    for name, gib in ram_gib.items():
        state.ledger.set_node_capacity(name, gib * GIB)
        state.ledger.set_node_labels(name, {"pool": "gpu" if name.startswith("g") else "cpu"})
    return state


def test_nodes_without_room_are_refused_with_the_ledgers_reason() -> None:
    state = nodes(big=64, small=8)
    found = filter_nodes(state, pod("16Gi"), ["big", "small", "unknown"], T0)
    assert found.nodes == ["big"]
    assert found.refused == {
        "small": "headroom: InsufficientRAM",
        "unknown": "headroom: NodeUnknown",
    }


def test_a_quotas_node_selector_and_room_are_asked_too() -> None:
    state = nodes(g1=64, c1=64)
    state.ledger.set_namespace("ml", {"team": "ml"})
    rules = QuotaRules(
        "gpus-only",
        LabelSelector(match_labels={"team": "ml"}),
        ram_mb=8 * GIB,
        nodes=LabelSelector(match_labels={"pool": "gpu"}),
    )
    state.ledger.set_quota(rules)
    assert filter_nodes(state, pod("4Gi"), ["g1", "c1"], T0).refused == {
        "c1": "headroom: NodeNotAllowed"
    }
    assert filter_nodes(state, pod("16Gi"), ["g1"], T0).refused == {"g1": "headroom: QuotaExceeded"}


def test_an_unreadable_claim_fails_every_node() -> None:
    found = filter_nodes(nodes(big=64), pod("banana"), ["big"], T0)
    assert (found.nodes, found.refused) == ([], {"big": "headroom: BadClaim"})


def test_spread_prefers_the_most_ram_left_and_binpack_the_least() -> None:
    state = nodes(a=64, b=32, c=16)
    assert prioritize(state, pod("8Gi"), ["a", "b", "c"], T0) == {"a": MAX_SCORE, "b": 3, "c": 0}
    assert prioritize(state, pod("8Gi"), ["a", "b", "c"], T0, binpack=True) == {
        "a": 0,
        "b": 7,
        "c": MAX_SCORE,
    }


def test_a_pod_holding_an_admission_is_bound_there_else_offered_other_nodes() -> None:
    """Admitted on a node (from its queue, or at a bind that failed since): while the
    scheduler finds that node feasible, it is the one node that passes; once it does not
    (its CPU taken, say), the other nodes are judged on their room, not refused as a
    duplicate of its entry."""
    state = nodes(a=64, b=64, c=2)
    assert state.ledger.reserve(entry("ml/p", 4 * GIB, node="a"), T0).admitted
    decision = StatusDecision(Phase.ADMITTED, Reason.FITS, "", T0)
    own = Record("r1", "ml", "p", "a", decision, confirmed=True)
    found = filter_nodes(state, pod("4Gi"), ["a", "b"], T0, own=own)
    assert found.nodes == ["a"]
    assert found.refused == {"b": "headroom: AdmittedOnAnotherNode"}
    found = filter_nodes(state, pod("4Gi"), ["b", "c"], T0, own=own)
    assert found.nodes == ["b"], found.refused
    assert found.refused == {"c": "headroom: InsufficientRAM"}


def test_a_pod_waiting_in_a_nodes_queue_is_let_go_there_in_its_turn_only() -> None:
    state = nodes(a=64, b=64)
    decision = StatusDecision(Phase.QUEUED, Reason.INSUFFICIENT_RAM, "", T0, position=2)
    own = Record("r1", "ml", "p", "a", decision, confirmed=True)
    found = filter_nodes(state, pod("4Gi"), ["a", "b"], T0, own=own)
    assert found.nodes == ["b"]
    assert found.refused == {"a": "headroom: Queued"}


def test_a_pod_that_claims_nothing_is_the_schedulers_alone() -> None:
    plain = pod("lots")
    plain["metadata"]["labels"] = {}
    assert filter_nodes(nodes(a=8), plain, ["a", "b"], T0).nodes == ["a", "b"]


def test_under_strict_fifo_a_node_with_a_reservation_waiting_is_refused_as_the_decider_would() -> (
    None
):
    state = nodes(a=8, b=8)
    assert state.ledger.reserve(entry("other/full", 7 * GIB, node="a"), T0).admitted
    earlier = T0 - timedelta(minutes=1)
    waiting = entry(
        "other/waits", 4 * GIB, node="a", at=earlier, wait_until=T0 + timedelta(hours=1)
    )
    assert state.ledger.reserve_or_wait(waiting, T0, waiting.wait_until, strict=True).queued
    state.ledger.release("other/full")
    # Room for 1 GiB again on a, but a 4 GiB reservation waits there first.
    strict = filter_nodes(state, pod("1Gi"), ["a", "b"], T0, strict=True)
    assert strict.refused == {"a": "headroom: WaitersAhead"}
    assert filter_nodes(state, pod("1Gi"), ["a", "b"], T0).nodes == ["a", "b"]


def test_a_quota_refusal_makes_the_pod_wait_on_room_anywhere() -> None:
    state = nodes(g1=64)
    state.ledger.set_namespace("ml", {"team": "ml"})
    state.ledger.set_quota(
        QuotaRules("small", LabelSelector(match_labels={"team": "ml"}), ram_mb=1 * GIB)
    )
    found = filter_nodes(state, pod("4Gi"), ["g1"], T0)
    assert found.refused == {"g1": "headroom: QuotaExceeded"}
    assert found.for_quota
    assert not filter_nodes(nodes(a=1), pod("4Gi"), ["a"], T0).for_quota


def test_a_pod_no_node_has_room_for_queues_on_the_policys_best_node_refused_for_room() -> None:
    state = nodes(big=64, mid=32, small=8)
    state.ledger.set_namespace("ml", {"team": "ml"})
    rules = QuotaRules(
        "cpu-only",
        LabelSelector(match_labels={"team": "ml"}),
        nodes=LabelSelector(match_labels={"pool": "cpu"}),
    )
    state.ledger.set_quota(rules)
    names = ["big", "mid", "small", "gone"]
    found = filter_nodes(state, pod("100Gi"), names, T0)
    assert found.nodes == []
    assert found.waitable == ["big", "mid", "small"]  # not gone: NodeUnknown
    assert queue_node(state, pod("100Gi"), found, T0) is None  # no node could ever hold it
    assert state.ledger.reserve(entry("ml/x", 60 * GIB, node="big"), T0).admitted
    assert state.ledger.reserve(entry("ml/y", 30 * GIB, node="mid"), T0).admitted
    found = filter_nodes(state, pod("16Gi"), names, T0)
    assert (found.nodes, found.waitable) == ([], ["big", "mid", "small"])
    # The most room now (big: 4 GiB, mid: 2 GiB) among those that could hold it (not small).
    assert queue_node(state, pod("16Gi"), found, T0) == "big"
    found = filter_nodes(state, pod("40Gi"), names, T0)
    assert queue_node(state, pod("40Gi"), found, T0) == "big"  # mid could never hold it
    state.ledger.set_node_labels("big", {"pool": "gpu"})  # outside the quota's nodeSelector
    found = filter_nodes(state, pod("40Gi"), names, T0)
    assert found.waitable == ["mid", "small"]
    assert queue_node(state, pod("40Gi"), found, T0) is None


def test_a_pod_whose_own_wait_ran_out_in_the_queue_is_refused_everywhere() -> None:
    state = nodes(big=64)
    waited = pod("4Gi")
    waited["metadata"]["annotations"]["headroom.dev/wait"] = "1m"
    decision = StatusDecision(Phase.REJECTED, Reason.WAIT_TIMEOUT, "waited 1m", T0)
    own = Record("r1", "ml", "p", "big", decision, confirmed=True)
    found = filter_nodes(state, waited, ["big"], T0, own=own)
    assert (found.nodes, found.refused) == ([], {"big": "headroom: WaitTimeout"})
    # Without a wait of its own (its quota's maxWait ran out), it is queued again.
    assert filter_nodes(state, pod("4Gi"), ["big"], T0, own=own).nodes == ["big"]


def test_a_pod_never_queues_on_a_node_whose_gpus_could_never_hold_its_claim() -> None:
    """Two GPUs of 16 GiB: a claim over four GPUs, or of 20 GiB on one, fits the node's
    VRAM in sum but never its devices; waiting there would be for nothing (and, under
    strict FIFO, would hold back every claim behind it)."""
    state = State(Limits(system_reserve_mb=0))
    state.ledger.set_node_capacity("g1", 64 * GIB, 32 * GIB)
    devices = tuple(GpuDevice(f"GPU-{i}", 16 * GIB, ref=f"d/g1/{i}") for i in range(2))
    state.ledger.set_node_devices("g1", devices)
    held = entry("ml/x", 1, node="g1", vram=30 * GIB)
    held.gpus = 2
    assert state.ledger.reserve(held, T0).admitted
    for vram, gpus in (("8Gi", "4"), ("20Gi", "1"), ("16Gi", "2")):
        claim = pod("1Gi")
        claim["metadata"]["annotations"] |= {"headroom.dev/vram": vram, "headroom.dev/gpus": gpus}
        found = filter_nodes(state, claim, ["g1"], T0)
        assert found.waitable == ["g1"], found.refused
        fits_once_free = gpus == "2"
        assert (queue_node(state, claim, found, T0) == "g1") is fits_once_free, (vram, gpus)
