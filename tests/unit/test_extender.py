"""The extender's answers, pure: which nodes have room for a pod's claim (the ledger's
own refusal, per node, with its reason), and the node policy's scores."""

from __future__ import annotations

from typing import Any

from headroom.api.limits import Limits
from headroom.api.selectors import LabelSelector
from headroom.control.extender import MAX_SCORE, filter_nodes, prioritize
from headroom.control.state import State
from headroom.ledger.quotas import QuotaRules
from tests.unit.test_core_admission import T0

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
    state.ledger.quotas.set_namespace("ml", {"team": "ml"})
    rules = QuotaRules(
        "gpus-only",
        LabelSelector(match_labels={"team": "ml"}),
        ram_mb=8 * GIB,
        nodes=LabelSelector(match_labels={"pool": "gpu"}),
    )
    state.ledger.quotas.set_quota(rules)
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
