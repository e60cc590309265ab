"""The webhook's pure decision: which pods are gated, which are refused, and the review."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.api.constants import (
    CLAIM_LABEL,
    NODE_ANNOTATION,
    OWNER_LABEL,
    RAM_ANNOTATION,
    SCHEDULING_GATE,
    VRAM_ANNOTATION,
    WAIT_ANNOTATION,
)
from headroom.objects.gating import GateVerdict, ReviewError, gate_pod, review_response
from headroom_dev.sim.fakeapi.jsonvalue import apply_json_patch

GATE = {"name": SCHEDULING_GATE}


def pod(
    annotations: dict[str, Any] | None = None,
    *,
    label: str | None = "true",
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "ml"}
    if label is not None:
        metadata["labels"] = {CLAIM_LABEL: label, "app": "x"}
    metadata["annotations"] = {RAM_ANNOTATION: "8Gi"} if annotations is None else annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "c", "image": "busybox"}]} if spec is None else spec,
    }


def review(obj: Any, *, operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "object": obj,
        },
    }


def apply(patch: list[dict[str, Any]], obj: dict[str, Any]) -> dict[str, Any]:
    """The webhook's JSON patch, applied as the API server would (only adds)."""
    assert all(op["op"] == "add" for op in patch)
    out: dict[str, Any] = apply_json_patch(json.loads(json.dumps(obj)), patch)
    return out


def test_an_opted_in_pod_gets_exactly_the_gate_and_the_owner_label() -> None:
    verdict = gate_pod(pod())
    assert verdict.allowed
    gated = apply(verdict.patch, pod())
    assert gated["spec"]["schedulingGates"] == [GATE]
    assert gated["metadata"]["labels"] == {CLAIM_LABEL: "true", "app": "x", OWNER_LABEL: "true"}
    assert verdict.patch == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [GATE]},
        {"op": "add", "path": "/metadata/labels/headroom.dev~1owner", "value": "true"},
    ]


def test_other_gates_are_kept_and_ours_is_not_added_twice() -> None:
    other = pod(spec={"containers": [], "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]})
    gated = apply(gate_pod(other).patch, other)
    assert gated["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}, GATE]
    assert gate_pod(gated) == GateVerdict(True)


def test_an_empty_or_null_gate_list_is_replaced() -> None:
    for gates in ([], None):
        obj = pod(spec={"containers": [], "schedulingGates": gates})
        assert apply(gate_pod(obj).patch, obj)["spec"]["schedulingGates"] == [GATE]


@pytest.mark.parametrize("label", [None, "false", "True", "yes", ""])
def test_a_pod_that_did_not_opt_in_is_left_alone(label: str | None) -> None:
    assert gate_pod(pod({RAM_ANNOTATION: "lots"}, label=label)) == GateVerdict(True)


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({RAM_ANNOTATION: "8 gigs"}, RAM_ANNOTATION),
        ({RAM_ANNOTATION: "-5"}, RAM_ANNOTATION),
        ({VRAM_ANNOTATION: "1e99999"}, VRAM_ANNOTATION),
        ({RAM_ANNOTATION: "0"}, RAM_ANNOTATION),
        ({}, RAM_ANNOTATION),
        ({RAM_ANNOTATION: "1Gi", WAIT_ANNOTATION: "forever"}, WAIT_ANNOTATION),
        ({RAM_ANNOTATION: "1Gi", WAIT_ANNOTATION: "48h"}, WAIT_ANNOTATION),
        ({RAM_ANNOTATION: "1Gi", NODE_ANNOTATION: "Not_A_Node"}, NODE_ANNOTATION),
    ],
)
def test_a_bad_annotation_is_refused_naming_it_and_its_value(
    annotations: dict[str, str], named: str
) -> None:
    verdict = gate_pod(pod(annotations))
    assert not verdict.allowed
    assert verdict.code == 422
    assert f"annotation {named}" in verdict.message
    assert repr(annotations.get(named)) in verdict.message  # the value, as written
    assert verdict.patch == []


def test_a_pod_with_a_node_name_is_refused_and_told_about_the_annotation() -> None:
    verdict = gate_pod(pod(spec={"containers": [], "nodeName": "gpu-1"}))
    assert not verdict.allowed
    assert "spec.nodeName" in verdict.message
    assert "'gpu-1'" in verdict.message
    assert NODE_ANNOTATION in verdict.message


def test_a_review_is_answered_with_its_uid_and_a_base64_json_patch() -> None:
    answer = review_response(review(pod()))
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == gate_pod(pod()).patch


def test_a_refusal_carries_a_status_for_kubectl() -> None:
    response = review_response(review(pod({RAM_ANNOTATION: "8 gigs"})))["response"]
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"]["code"] == 422
    assert RAM_ANNOTATION in response["status"]["message"]
    assert "'8 gigs'" in response["status"]["message"]


@pytest.mark.parametrize(("operation", "kind"), [("UPDATE", "Pod"), ("CREATE", "Binding")])
def test_anything_but_a_pod_create_passes_untouched(operation: str, kind: str) -> None:
    response = review_response(review(pod(), operation=operation, kind=kind))["response"]
    assert response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "x",
        {},
        {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 5}},
    ],
)
def test_what_is_not_a_review_is_a_review_error(body: Any) -> None:
    with pytest.raises(ReviewError):
        review_response(body)


# -- properties ---------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=200),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=10,
)
annotation_values = st.one_of(
    st.text(max_size=300),
    st.from_regex(r"[0-9.eE+-]{0,30}(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?", fullmatch=True),
    st.from_regex(r"([0-9]{1,12}(\.[0-9]{0,12})?(ns|us|ms|s|m|h)){1,4}", fullmatch=True),
    json_values,
)
keys = st.sampled_from([RAM_ANNOTATION, VRAM_ANNOTATION, WAIT_ANNOTATION, NODE_ANNOTATION])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, annotation_values, max_size=4))
def test_any_annotation_values_end_in_a_gate_or_a_denial(annotations: dict[str, Any]) -> None:
    verdict = gate_pod(pod(annotations))
    if verdict.allowed:
        assert apply(verdict.patch, pod(annotations))["spec"]["schedulingGates"] == [GATE]
    else:
        assert verdict.code == 422
        assert "annotation headroom.dev/" in verdict.message
        assert len(verdict.message) < 1000


@settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from(["CREATE", "UPDATE"]))
def test_any_object_in_a_review_gets_an_answer(obj: Any, operation: str) -> None:
    answer = review_response(review(obj, operation=operation))
    assert isinstance(answer["response"]["allowed"], bool)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["labels", "annotations", "name"]), json_values, max_size=3),
    json_values,
)
def test_any_pod_shape_gets_a_verdict(metadata: dict[str, Any], spec: Any) -> None:
    labelled = {**metadata, "labels": {CLAIM_LABEL: "true"}}
    for meta in (metadata, labelled):
        verdict = gate_pod({"metadata": meta, "spec": spec})
        assert isinstance(verdict, GateVerdict)
        assert verdict.allowed or verdict.message


# -- placement by kube-scheduler (placement.mode: scheduler) ---------------------------------


@pytest.mark.parametrize("named", [None, "default-scheduler", "headroom"])
def test_in_scheduler_mode_a_pod_left_to_the_default_scheduler_gets_ours_and_no_gate(
    named: str | None,
) -> None:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if named is not None:
        spec["schedulerName"] = named
    obj = pod(spec=spec)
    verdict = gate_pod(obj, scheduler="headroom")
    assert verdict.allowed
    placed: dict[str, Any] = apply_json_patch(json.loads(json.dumps(obj)), verdict.patch)
    assert placed["spec"]["schedulerName"] == "headroom"
    assert "schedulingGates" not in placed["spec"]
    assert placed["metadata"]["labels"][OWNER_LABEL] == "true"


def test_in_scheduler_mode_a_pod_naming_another_scheduler_is_gated_as_before() -> None:
    obj = pod(spec={"containers": [], "schedulerName": "volcano"})
    verdict = gate_pod(obj, scheduler="headroom")
    gated = apply(verdict.patch, obj)
    assert gated["spec"]["schedulingGates"] == [GATE]
    assert gated["spec"]["schedulerName"] == "volcano"


def test_in_scheduler_mode_a_node_name_is_refused_saying_who_binds_the_pod() -> None:
    verdict = gate_pod(pod(spec={"containers": [], "nodeName": "n1"}), scheduler="headroom")
    assert not verdict.allowed
    assert "bound by the scheduler headroom" in verdict.message
    assert NODE_ANNOTATION in verdict.message


def test_in_scheduler_mode_a_bad_claim_is_refused_as_in_gate_mode() -> None:
    bad = pod({RAM_ANNOTATION: "8 gigs"})
    assert gate_pod(bad, scheduler="headroom") == gate_pod(bad)
    assert not gate_pod(bad).allowed
