"""Whether a pod's Reservation is the one the operator writes for its claim (issue 29,
item 3), and the patch that lets a pod that claims nothing go (item 6). Pure."""

from __future__ import annotations

from typing import Any

import pytest

from headroom.api.claims import PodClaim
from headroom.api.constants import SCHEDULING_GATE
from headroom.objects.podreservations import booked, differences, gate_removal_patch
from headroom.objects.pods import pod_reservation

POD: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ml", "uid": "u1"}}
CLAIM = PodClaim(8192, 1024, gpus=2)


def ours(**spec: Any) -> dict[str, Any]:
    body = pod_reservation(POD, CLAIM, "n1")
    body["spec"].update(spec)
    return body


def test_the_operators_own_reservation_has_no_differences() -> None:
    assert differences(booked(ours()), "p", CLAIM) == []


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"ramMB": 1}, "ramMB 1, not 8192"),
        ({"vramMB": 0}, "vramMB 0, not 1024"),
        ({"gpus": 1}, "gpus 1, not 2"),
        ({"owner": {"pod": "q"}}, "owner.pod q, not p"),
        ({"liveness": "Heartbeat"}, "liveness Heartbeat, not Pod"),
    ],
)
def test_any_other_booking_is_named(spec: dict[str, Any], said: str) -> None:
    assert differences(booked(ours(**spec)), "p", CLAIM) == [said]


def test_the_node_counts_only_where_the_pod_names_it() -> None:
    elsewhere = booked(ours(node="n2"))
    assert differences(elsewhere, "p", CLAIM) == []
    named = PodClaim(8192, 1024, gpus=2, node="n1")
    assert differences(elsewhere, "p", named) == ["node n2, not n1"]


def test_letting_go_removes_our_gate_only() -> None:
    pod = {
        "metadata": {"uid": "u1"},
        "spec": {"schedulingGates": [{"name": "example.com/q"}, {"name": SCHEDULING_GATE}]},
    }
    assert gate_removal_patch(pod) == [
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": SCHEDULING_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]
    assert gate_removal_patch({"spec": {"schedulingGates": [{"name": "example.com/q"}]}}) is None
