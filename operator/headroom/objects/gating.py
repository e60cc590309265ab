"""The mutating webhook's decision for one Pod CREATE, and the AdmissionReview around it.

Why a pod is gated at all: a scheduling gate can only be set when the pod is
created, so this is the one moment Headroom can hold an opted-in pod back until
its memory is admitted (issue 19). Why the checks are here and not only in the
controller: a bad ``headroom.dev/ram`` refused at ``kubectl apply`` names the
annotation and the value to the person who wrote it; the same pod accepted and
left gated forever would say nothing to anyone. The controller reads the claim
with the same :func:`~headroom.api.claims.pod_claim`, so the two never disagree.

A gated pod may not name its node in ``spec.nodeName`` (the API server refuses a
gate together with a nodeName, with a message that does not mention Headroom);
the node goes in the annotation ``headroom.dev/node`` instead, which says so.

Everything here is pure: the server in ``headroom.serving.webhook`` does the I/O.
Every input, however malformed, ends in an answer (allowed, denied, or a
:class:`ReviewError` for a body that is not an AdmissionReview), never in an
unexpected exception: the property tests hold that.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from headroom.api.claims import is_claim_pod, pod_claim
from headroom.api.constants import CLAIM_LABEL, NODE_ANNOTATION, OWNER_LABEL, SCHEDULING_GATE
from headroom.api.parse import InvalidValueError, shown

REVIEW_API_VERSION = "admission.k8s.io/v1"
#: What the API server puts in a pod's spec.schedulerName when it names none.
DEFAULT_SCHEDULER = "default-scheduler"
#: The status code of a refusal: the object is invalid, as a schema violation is.
INVALID = 422


@dataclass(frozen=True, slots=True)
class GateVerdict:
    """Allowed with a JSONPatch (possibly empty), or denied with a code and a message."""

    allowed: bool
    message: str = ""
    code: int = 200
    patch: list[dict[str, Any]] = field(default_factory=list)


class ReviewError(ValueError):
    """A request body that is not an AdmissionReview this webhook can answer (HTTP 400)."""


def gate_pod(pod: Any, *, scheduler: str | None = None) -> GateVerdict:
    """What to do with a pod being created: gate it, refuse it, or leave it alone.

    ``scheduler``: placement by kube-scheduler (``placement.mode: scheduler``): a pod
    left to the default scheduler is given this ``schedulerName`` instead of the gate,
    so the scheduler whose extender is Headroom binds it where its claim is admitted.
    One that names another scheduler is gated as in the gate mode: that scheduler
    knows nothing of the ledger."""
    if not isinstance(pod, dict):
        return GateVerdict(False, f"the object is not a Pod: {shown(pod)}", INVALID)
    if not is_claim_pod(pod):
        # Defence in depth: the objectSelector should never send such a pod.
        return GateVerdict(True)
    try:
        pod_claim(pod)
    except InvalidValueError as error:
        return GateVerdict(False, str(error), INVALID)
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return GateVerdict(False, f"spec: not a map: {shown(spec)}", INVALID)
    node_name = spec.get("nodeName")
    if node_name:
        held = (
            f"bound by the scheduler {scheduler}, through Headroom,"
            if scheduler is not None
            else f"created behind the scheduling gate {SCHEDULING_GATE}"
        )
        return GateVerdict(
            False,
            f'spec.nodeName: a pod labelled {CLAIM_LABEL}: "true" is {held} and may not set '
            f"spec.nodeName (got {shown(node_name)}); name its node in the annotation "
            f"{NODE_ANNOTATION}",
            INVALID,
        )
    name = spec.get("schedulerName")
    if scheduler is not None and name in (None, "", DEFAULT_SCHEDULER, scheduler):
        return GateVerdict(True, patch=_scheduler_patch(spec, scheduler) + _owner_patch(pod))
    return GateVerdict(True, patch=_gate_patch(spec) + _owner_patch(pod))


def _scheduler_patch(spec: dict[str, Any], scheduler: str) -> list[dict[str, Any]]:
    if spec.get("schedulerName") == scheduler:
        return []
    op = "replace" if "schedulerName" in spec else "add"
    return [{"op": op, "path": "/spec/schedulerName", "value": scheduler}]


def _gate_patch(spec: dict[str, Any]) -> list[dict[str, Any]]:
    gates = spec.get("schedulingGates")
    if not isinstance(gates, list) or not gates:
        return [
            {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": SCHEDULING_GATE}]}
        ]
    if any(isinstance(g, dict) and g.get("name") == SCHEDULING_GATE for g in gates):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": SCHEDULING_GATE}}]


def _owner_patch(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The owner label, so that the pod's deletion releases its reservation like any
    owner pod's; added here, it saves the operator a write per pod. (The claim label is
    there, so ``metadata.labels`` is a map.)"""
    if pod["metadata"]["labels"].get(OWNER_LABEL) == "true":
        return []
    path = "/metadata/labels/" + OWNER_LABEL.replace("~", "~0").replace("/", "~1")
    return [{"op": "add", "path": path, "value": "true"}]


def review_request(review: Any) -> tuple[str, dict[str, Any]]:
    """The uid and request of an AdmissionReview; ReviewError if it is not one."""
    if not isinstance(review, dict):
        raise ReviewError(f"expected an AdmissionReview object, got {type(review).__name__}")
    if review.get("apiVersion") != REVIEW_API_VERSION or review.get("kind") != "AdmissionReview":
        raise ReviewError(
            f"expected apiVersion {REVIEW_API_VERSION} kind AdmissionReview, got "
            f"{shown(review.get('apiVersion'))} {shown(review.get('kind'))}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError(f"request.uid: expected a non-empty string, got {shown(uid)}")
    return uid, request


def review_response(review: Any, *, scheduler: str | None = None) -> dict[str, Any]:
    """The AdmissionReview that answers ``review``; ReviewError if it is not one.
    ``scheduler``: as for :func:`gate_pod`."""
    uid, request = review_request(review)
    kind = request.get("kind") or {}
    is_pod = isinstance(kind, dict) and kind.get("group", "") == "" and kind.get("kind") == "Pod"
    if request.get("operation") != "CREATE" or not is_pod:
        verdict = GateVerdict(True)  # only Pod CREATE is registered; anything else passes
    else:
        verdict = gate_pod(request.get("object"), scheduler=scheduler)
    return {
        "apiVersion": REVIEW_API_VERSION,
        "kind": "AdmissionReview",
        "response": _answer(uid, verdict),
    }


def _answer(uid: str, verdict: GateVerdict) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {
            "code": verdict.code,
            "reason": "Invalid",
            "message": verdict.message,
        }
    elif verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(verdict.patch).encode()).decode()
    return response
