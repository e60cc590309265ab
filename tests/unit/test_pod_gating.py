"""Pure parts of pod gating: a pod's claim, where it may run, the patch that ungates it,
and the ledger's record of a pod the scheduler placed without asking."""

from __future__ import annotations

from copy import deepcopy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.api.claims import PodClaim, is_claim_pod, pod_claim
from headroom.api.constants import MAX_MB, RESERVATION_ANNOTATION, SCHEDULING_GATE
from headroom.api.limits import Limits
from headroom.api.parse import InvalidValueError
from headroom.api.reasons import Reason
from headroom.ledger import Entry, Ledger
from headroom.objects.nodeconstraints import NodeFacts, may_run_on
from headroom.objects.pods import (
    condition_patch,
    is_gated,
    owning_pod_uid,
    pinned_node,
    pod_reservation,
    ungate_patch,
)
from headroom_dev.sim.fakeapi.jsonvalue import PatchError, apply_json_patch
from headroom_dev.sim.fakeapi.podrules import REQUIRED, update_errors

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def annotated(**annotations: str) -> dict[str, Any]:
    keys = {"ram": "headroom.dev/ram", "vram": "headroom.dev/vram"}
    keys |= {"wait": "headroom.dev/wait", "node": "headroom.dev/node", "gpus": "headroom.dev/gpus"}
    return {"metadata": {"annotations": {keys[k]: v for k, v in annotations.items()}}}


# -- the claim --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "claim"),
    [
        ({"ram": "8Gi"}, PodClaim(8192)),
        ({"ram": "8192"}, PodClaim(8192)),
        ({"ram": "16000Mi", "vram": "80Gi"}, PodClaim(16000, 81920)),
        ({"vram": "1.5G"}, PodClaim(0, 1431)),  # 1,500,000,000 bytes, rounded up
        ({"ram": "1"}, PodClaim(1)),  # plain digits are MiB, not bytes
        ({"ram": "1Ki"}, PodClaim(1)),  # never smaller than asked
        ({"ram": "1Gi", "wait": "10m"}, PodClaim(1024, wait=timedelta(minutes=10))),
        ({"ram": "1Gi", "node": "gpu-1.example"}, PodClaim(1024, node="gpu-1.example")),
        ({"vram": "100Gi", "gpus": "2"}, PodClaim(0, 102400, gpus=2)),
        ({"vram": "100Gi", "gpus": "0"}, PodClaim(0, 102400, gpus=0)),
    ],
)
def test_a_claim_reads_quantities_and_plain_mib(
    annotations: dict[str, str], claim: PodClaim
) -> None:
    assert pod_claim(annotated(**annotations)) == claim


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({"ram": "lots"}, "annotation headroom.dev/ram: not a memory quantity"),
        ({"ram": "-1Gi"}, "annotation headroom.dev/ram: a memory quantity cannot be negative"),
        ({"ram": "1e40"}, "annotation headroom.dev/ram: '1e40' is above"),
        ({"ram": str(MAX_MB + 1)}, f"annotation headroom.dev/ram: '{MAX_MB + 1}' is above"),
        ({"vram": "8GB"}, "annotation headroom.dev/vram: not a memory quantity"),
        ({"ram": "0", "vram": "0"}, "annotation headroom.dev/ram or headroom.dev/vram: a pod"),
        ({}, "annotation headroom.dev/ram or headroom.dev/vram: a pod"),
        ({"ram": "1Gi", "wait": "48h"}, "annotation headroom.dev/wait: duration '48h'"),
        ({"ram": "1Gi", "wait": "soon"}, "annotation headroom.dev/wait: not a duration"),
        ({"ram": "1Gi", "node": "Node_1"}, "annotation headroom.dev/node: not a Node name"),
        ({"vram": "1Gi", "gpus": "two"}, "annotation headroom.dev/gpus: "),
        ({"vram": "1Gi", "gpus": "-1"}, "annotation headroom.dev/gpus: "),
        ({"vram": "1Gi", "gpus": "1025"}, "annotation headroom.dev/gpus: "),
    ],
)
def test_a_bad_claim_names_the_annotation_and_the_value(
    annotations: dict[str, str], named: str
) -> None:
    with pytest.raises(InvalidValueError, match="^" + named.replace("(", r"\(")):
        pod_claim(annotated(**annotations))


@given(
    st.dictionaries(st.sampled_from(["ram", "vram", "wait", "node", "gpus"]), st.text(max_size=40))
)
def test_any_annotation_text_is_a_claim_or_a_named_refusal(annotations: dict[str, str]) -> None:
    try:
        claim = pod_claim(annotated(**annotations))
    except InvalidValueError as error:
        refusal = str(error)
        claim = None
    if claim is None:
        assert refusal.startswith("annotation headroom.dev/")
    else:
        assert claim.ram_mb + claim.vram_mb > 0
        assert claim.ram_mb <= MAX_MB
        assert claim.vram_mb <= MAX_MB


def test_only_the_label_true_opts_in() -> None:
    assert is_claim_pod({"metadata": {"labels": {"headroom.dev/claim": "true"}}})
    assert not is_claim_pod({"metadata": {"labels": {"headroom.dev/claim": "True"}}})
    assert not is_claim_pod({"metadata": {"annotations": {"headroom.dev/claim": "true"}}})
    assert not is_claim_pod({})


# -- where a pod may run ----------------------------------------------------------------------

GPU = NodeFacts("gpu-1", {"pool": "gpu", "gpus": "8"})
CPU = NodeFacts("cpu-1", {"pool": "cpu"})
TAINTED = NodeFacts("gpu-2", {"pool": "gpu"}, ({"key": "gpu", "effect": "NoSchedule"},))
DRAINED = NodeFacts("gpu-3", {"pool": "gpu"}, unschedulable=True)


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "uid": "u1", "annotations": {}}, "spec": deepcopy(spec)}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    rule = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    return {"nodeAffinity": rule}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


@pytest.mark.parametrize(
    ("spec", "allowed"),
    [
        ({}, {"gpu-1", "cpu-1"}),
        ({"nodeSelector": {"pool": "gpu"}}, {"gpu-1"}),
        ({"affinity": required(expr("pool", "In", "cpu"))}, {"cpu-1"}),
        ({"affinity": required(expr("pool", "NotIn", "cpu"))}, {"gpu-1"}),
        ({"affinity": required(expr("gpus", "Exists"))}, {"gpu-1"}),
        ({"affinity": required(expr("gpus", "DoesNotExist"))}, {"cpu-1"}),
        ({"affinity": required(expr("gpus", "Gt", "4"))}, {"gpu-1"}),
        ({"affinity": required(expr("gpus", "Lt", "4"))}, set()),
        # Terms are ORed; the requirements inside one are ANDed.
        (
            {"affinity": required(expr("pool", "In", "cpu"), expr("gpus", "Gt", "7"))},
            {"gpu-1", "cpu-1"},
        ),
        (
            {
                "affinity": required(
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["cpu-1"]}
                        ]
                    }
                )
            },
            {"cpu-1"},
        ),
        ({"affinity": required({})}, set()),  # an empty term matches nothing
    ],
)
def test_hard_constraints_choose_the_nodes(spec: dict[str, Any], allowed: set[str]) -> None:
    assert {n.name for n in (GPU, CPU) if may_run_on(pod(**spec), n)} == allowed


def test_taints_and_cordons_need_tolerations() -> None:
    assert not may_run_on(pod(), TAINTED)
    assert may_run_on(pod(tolerations=[{"key": "gpu", "operator": "Exists"}]), TAINTED)
    assert may_run_on(pod(tolerations=[{"operator": "Exists"}]), TAINTED)  # tolerates all
    wrong_effect = [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]
    assert not may_run_on(pod(tolerations=wrong_effect), TAINTED)
    soft = NodeFacts("n", {}, ({"key": "x", "effect": "PreferNoSchedule"},))
    assert may_run_on(pod(), soft)
    assert not may_run_on(pod(), DRAINED)
    cordon = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]
    assert may_run_on(pod(tolerations=cordon), DRAINED)


# -- ungating ---------------------------------------------------------------------------------

GATED = {"schedulingGates": [{"name": "other.io/x"}, {"name": SCHEDULING_GATE}]}


@pytest.mark.parametrize(
    "affinity",
    [
        None,
        {"podAntiAffinity": {}},
        {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        required(expr("pool", "In", "gpu"), expr("gpus", "Exists")),
        required({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}]}),
    ],
)
def test_one_patch_pins_names_and_ungates(affinity: dict[str, Any] | None) -> None:
    spec = dict(GATED, **({"affinity": affinity} if affinity is not None else {}))
    before = pod(**spec)
    assert is_gated(before)
    operations = ungate_patch(before, "gpu-1", "p")
    assert operations is not None
    after = apply_json_patch(before, operations)
    assert not is_gated(after)
    assert after["spec"]["schedulingGates"] == [{"name": "other.io/x"}]  # foreign gates stay
    assert pinned_node(after) == "gpu-1"
    assert after["metadata"]["annotations"][RESERVATION_ANNOTATION] == "p"
    assert may_run_on(after, GPU)
    assert not may_run_on(after, NodeFacts("gpu-9", {"pool": "gpu", "gpus": "1"}))


def test_the_devices_of_the_admission_are_annotated_in_the_same_patch() -> None:
    devices = {"GPU-b": 40960, "GPU-a": 40960}
    annotated_pod = pod(**GATED)
    annotated_pod["metadata"]["annotations"] = {"team": "ml"}
    for before in (pod(**GATED), annotated_pod):
        operations = ungate_patch(before, "gpu-1", "p", devices)
        assert operations is not None
        after = apply_json_patch(before, operations)
        assert after["metadata"]["annotations"]["headroom.dev/devices"] == "GPU-a,GPU-b"
        assert after["metadata"]["annotations"][RESERVATION_ANNOTATION] == "p"
        assert not is_gated(after)
    without = apply_json_patch(pod(**GATED), ungate_patch(pod(**GATED), "gpu-1", "p") or [])
    assert "headroom.dev/devices" not in without["metadata"]["annotations"]


def test_the_patch_lands_only_on_the_same_pod_with_our_gate() -> None:
    before = pod(**GATED)
    operations = ungate_patch(before, "gpu-1", "p")
    assert operations is not None
    other = pod(**GATED)
    other["metadata"]["uid"] = "u2"  # deleted and created again under the same name
    with pytest.raises(PatchError):
        apply_json_patch(other, operations)
    moved = pod(
        schedulingGates=[{name: value for name, value in GATED["schedulingGates"][1].items()}]
    )
    with pytest.raises(PatchError):
        apply_json_patch(moved, operations)  # the gate is not where it was
    assert ungate_patch(pod(), "gpu-1", "p") is None  # not gated: nothing to do


def test_a_pods_reservation_is_owned_by_it_and_lives_with_it() -> None:
    body = pod_reservation(
        {"metadata": {"name": "p", "namespace": "ml", "uid": "u1"}},
        PodClaim(1024, 2048, None, None, gpus=2),
        "gpu-1",
    )
    assert (body["metadata"]["name"], body["metadata"]["namespace"]) == ("p", "ml")
    assert owning_pod_uid(body) == "u1"
    assert body["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is False
    assert body["spec"] == {
        "node": "gpu-1",
        "ramMB": 1024,
        "vramMB": 2048,
        "gpus": 2,
        "owner": {"pod": "p", "surface": "pod"},
        "liveness": "Pod",
        "wait": "86400s",
        "description": "memory of pod p",
    }


# -- the ledger ---------------------------------------------------------------------------------


def lifetime_entry(entry_id: str, ram: int, *, pod_lifetime: bool = True) -> Entry:
    return Entry(
        id=entry_id,
        node="n1",
        ram_mb=ram,
        created_at=T0,
        last_heartbeat=T0,
        pod_lifetime=pod_lifetime,
    )


def test_a_placed_pod_is_recorded_over_the_limit_and_says_so() -> None:
    book = Ledger(Limits(system_reserve_mb=0))
    book.set_node_capacity("n1", 1000)
    assert book.record(lifetime_entry("ml/a", 600), T0).reason == Reason.FITS
    over = book.record(lifetime_entry("ml/b", 600), T0)
    assert (over.admitted, over.reason) == (True, Reason.OVER_COMMITTED)
    assert "requested 600 MiB, allocatable 400 MiB" in over.message
    summary = book.node_summary("n1", T0)
    assert (summary.reserved_ram_mb, summary.over_committed) == (1200, True)
    assert not book.record(lifetime_entry("ml/b", 1), T0).admitted  # one entry per id
    assert not book.reserve(lifetime_entry("ml/c", 1), T0).admitted  # nothing new fits now


def test_a_pods_lifetime_never_goes_stale() -> None:
    book = Ledger(Limits(heartbeat_stale_window=timedelta(seconds=30)))
    book.set_node_capacity("n1", 32768)
    book.reserve(lifetime_entry("ml/pod", 1024), T0)
    book.reserve(lifetime_entry("ml/beats", 1024, pod_lifetime=False), T0)
    later = T0 + timedelta(days=300)
    assert [r.entry.id for r in book.due(later)] == ["ml/beats"]
    assert book.node_summary("n1", later).stale_entries == 1  # ml/beats alone


def test_our_condition_is_set_without_touching_the_kubelets() -> None:
    kubelets = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
    before = {"metadata": {"uid": "u1"}, "status": {"conditions": [kubelets]}}
    waiting = apply_json_patch(
        deepcopy(before), condition_patch(before, "False", "Waiting", "position 2", "t1")
    )
    assert waiting["status"]["conditions"][0] == kubelets
    assert waiting["status"]["conditions"][1]["reason"] == "Waiting"
    still = apply_json_patch(
        deepcopy(waiting), condition_patch(waiting, "False", "Waiting", "position 1", "t2")
    )
    assert still["status"]["conditions"][1]["lastTransitionTime"] == "t1"  # no transition
    admitted = apply_json_patch(
        deepcopy(still), condition_patch(still, "True", "Admitted", "pinned", "t3")
    )
    assert [c["type"] for c in admitted["status"]["conditions"]] == [
        "PodScheduled",
        "headroom.dev/Admitted",
    ]
    assert admitted["status"]["conditions"][1]["lastTransitionTime"] == "t3"
    bare = {"metadata": {"uid": "u1"}, "status": {}}
    first = apply_json_patch(deepcopy(bare), condition_patch(bare, "False", "Waiting", "", "t0"))
    assert [c["type"] for c in first["status"]["conditions"]] == ["headroom.dev/Admitted"]


def test_an_empty_term_is_left_empty_as_the_api_server_requires() -> None:
    """A gated pod's empty term may not gain requirements (the simulation found the
    operator adding the pin to it, refused forever); it matches no node anyway."""
    before = pod(**GATED, affinity=required({}, expr("pool", "In", "gpu")))
    operations = ungate_patch(before, "gpu-1", "p")
    assert operations is not None
    after = apply_json_patch(before, operations)
    terms = after["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert terms[0] == {}
    assert pinned_node(after) == "gpu-1"
    assert may_run_on(after, GPU)
    assert not may_run_on(after, NodeFacts("gpu-9", {"pool": "gpu", "gpus": "1"}))
    assert not update_errors(before, after)  # what the API server allows a gated pod
