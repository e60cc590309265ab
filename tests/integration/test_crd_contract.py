"""The CRDs, installed in the real API server, accept good objects and refuse bad ones.

Every refusal must happen at ``kubectl apply`` time and name the offending field,
so a person sees what to fix without reading operator logs.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml

Kubectl = Callable[..., CompletedProcess[str]]

VALID: dict[str, Any] = {
    "apiVersion": "headroom.dev/v1alpha1",
    "kind": "Reservation",
    "metadata": {"name": "train-42"},
    "spec": {
        "node": "gpu-node-1",
        "ramMB": 8192,
        "vramMB": 16000,
        "owner": {
            "execID": "exec-42",
            "surface": "cli",
            "pid": 1234,
            "origin": "batch",
            "pod": "train-42-7f9c",
        },
        "expiresAt": "2026-12-03T00:00:00Z",
        "description": "fine-tune run 42",
    },
}


def with_spec(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(VALID)
    for key, value in changes.items():
        if value is _DELETE:
            del body["spec"][key]
        else:
            body["spec"][key] = value
    return body


_DELETE = object()

# (case id, object, text the error must contain: the field and what is wrong)
MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("ram-string", with_spec(ramMB="8Gi"), "spec.ramMB"),
    ("ram-float", with_spec(ramMB=1.5), "spec.ramMB"),
    ("ram-negative", with_spec(ramMB=-1), "spec.ramMB"),
    ("vram-negative", with_spec(vramMB=-5), "spec.vramMB"),
    ("ram-absurd", with_spec(ramMB=1 << 40), "spec.ramMB"),
    ("vram-absurd", with_spec(vramMB=10**15), "spec.vramMB"),
    ("ram-missing", with_spec(ramMB=_DELETE), "spec.ramMB: Required value"),
    ("node-missing", with_spec(node=_DELETE), "spec.node: Required value"),
    ("node-empty", with_spec(node=""), "spec.node"),
    ("node-uppercase", with_spec(node="GPU-Node"), "spec.node"),
    ("node-underscore", with_spec(node="gpu_node"), "spec.node"),
    ("node-too-long", with_spec(node="a" * 254), "spec.node"),
    ("node-number", with_spec(node=42), "spec.node"),
    ("both-zero", with_spec(ramMB=0, vramMB=0), "at least one of spec.ramMB and spec.vramMB"),
    ("expires-not-a-time", with_spec(expiresAt="tomorrow"), "spec.expiresAt"),
    ("expires-number", with_spec(expiresAt=1767225600), "spec.expiresAt"),
    ("description-huge", with_spec(description="x" * 5000), "spec.description"),
    ("owner-pid-zero", with_spec(owner={"pid": 0}), "spec.owner.pid"),
    ("owner-pid-huge", with_spec(owner={"pid": 1 << 31}), "spec.owner.pid"),
    ("owner-pod-bad", with_spec(owner={"pod": "Not A Pod"}), "spec.owner.pod"),
    ("owner-surface-long", with_spec(owner={"surface": "s" * 64}), "spec.owner.surface"),
    ("owner-not-object", with_spec(owner="me"), "spec.owner"),
    ("unknown-spec-field", with_spec(ramGB=8), 'unknown field "spec.ramGB"'),
    ("unknown-owner-field", with_spec(owner={"user": "x"}), 'unknown field "spec.owner.user"'),
    ("wait-negative", with_spec(wait="-5m"), "spec.wait"),
    ("wait-absurd", with_spec(wait="25h"), "spec.wait: Invalid value"),
    ("wait-days", with_spec(wait="2d"), "spec.wait"),
    ("wait-not-a-duration", with_spec(wait="soon"), "spec.wait"),
    ("wait-number", with_spec(wait=600), "spec.wait"),
    ("gpus-negative", with_spec(gpus=-1), "spec.gpus"),
    ("gpus-absurd", with_spec(gpus=1025), "spec.gpus"),
    ("gpus-string", with_spec(gpus="2"), "spec.gpus"),
    ("spec-missing", {k: v for k, v in VALID.items() if k != "spec"}, "spec: Required value"),
    ("spec-not-object", {**VALID, "spec": "8Gi please"}, "spec"),
]


def apply(kubectl: Kubectl, namespace: str, body: dict[str, Any]) -> CompletedProcess[str]:
    return kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))


def test_every_crd_is_established(crds: list[str]) -> None:
    assert sorted(crds) == [
        "headroomquotas.headroom.dev",
        "nodeheadrooms.headroom.dev",
        "reservations.headroom.dev",
    ]


def test_valid_examples_are_accepted(crds: list[str], kubectl: Kubectl, namespace: str) -> None:
    minimal = {**VALID, "metadata": {"name": "minimal"}, "spec": {"node": "n1", "ramMB": 1}}
    vram_only = {
        **VALID,
        "metadata": {"name": "vram-only"},
        "spec": {"node": "gpu-1.example.com", "ramMB": 0, "vramMB": 4096},
    }
    for body in (VALID, minimal, vram_only):
        result = apply(kubectl, namespace, body)
        assert result.returncode == 0, result.stderr
    got = json.loads(kubectl("get", "rsv", "-n", namespace, "minimal", "-o", "json").stdout)
    assert got["spec"] == {"node": "n1", "ramMB": 1, "vramMB": 0}  # vramMB defaulted


@pytest.mark.parametrize(
    ("body", "expected"), [(b, e) for _, b, e in MALFORMED], ids=[case for case, _, _ in MALFORMED]
)
def test_malformed_reservations_are_refused_naming_the_field(
    crds: list[str], kubectl: Kubectl, namespace: str, body: dict[str, Any], expected: str
) -> None:
    result = apply(kubectl, namespace, body)
    assert result.returncode != 0, f"accepted: {body}"
    assert expected in result.stderr, result.stderr
    assert kubectl("get", "rsv", "-n", namespace, "-o", "name").stdout == ""


@pytest.mark.parametrize(
    ("field", "value"), [("ramMB", 4096), ("node", "other-node"), ("description", "changed")]
)
def test_spec_is_immutable(
    crds: list[str], kubectl: Kubectl, namespace: str, field: str, value: Any
) -> None:
    assert apply(kubectl, namespace, VALID).returncode == 0
    result = apply(kubectl, namespace, with_spec(**{field: value}))
    assert result.returncode != 0
    assert "spec is immutable" in result.stderr, result.stderr


def test_metadata_changes_are_allowed_after_creation(
    crds: list[str], kubectl: Kubectl, namespace: str
) -> None:
    assert apply(kubectl, namespace, VALID).returncode == 0
    result = kubectl(
        "annotate", "-n", namespace, "rsv/train-42", "headroom.dev/heartbeat=2026-12-02T10:00:00Z"
    )
    assert result.returncode == 0, result.stderr


def test_printer_columns(crds: list[str], kubectl: Kubectl, namespace: str) -> None:
    assert apply(kubectl, namespace, VALID).returncode == 0
    header = kubectl("get", "rsv", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "NODE", "RAM", "VRAM", "PHASE", "REASON", "POSITION", "AGE"]
    name = f"printer-{namespace}"
    created = kubectl(
        "create",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "headroom.dev/v1alpha1",
                "kind": "NodeHeadroom",
                "metadata": {"name": name},
            }
        ),
    )
    assert created.returncode == 0, created.stderr
    header = kubectl("get", "nodeheadroom", name).stdout.splitlines()[0].split()
    assert header == [
        "NAME",
        "TOTAL",
        "RESERVED",
        "ALLOCATABLE",
        "UTIL%",
        "ENTRIES",
        "STALE",
        "QUEUED",
        "GPU-FREE",  # the largest free device: the biggest one-GPU claim that fits
    ]
    wide = kubectl("get", "rsv", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert wide[4] == "GPUS", wide
    kubectl("delete", "nodeheadroom", name)


def test_status_is_a_subresource(crds: list[str], kubectl: Kubectl, namespace: str) -> None:
    """A status sent with the object on create is dropped: only /status writes it."""
    body = {**VALID, "status": {"phase": "Admitted", "reason": "Fits"}}
    assert apply(kubectl, namespace, body).returncode == 0
    got = json.loads(kubectl("get", "rsv", "-n", namespace, "train-42", "-o", "json").stdout)
    assert "status" not in got


def test_explain_documents_every_field(crds: list[str], kubectl: Kubectl) -> None:
    result = kubectl("explain", "reservations.spec", "--recursive=false")
    assert result.returncode == 0, result.stderr
    for field in ("node", "ramMB", "vramMB", "owner", "expiresAt", "description"):
        assert field in result.stdout
    assert "Name of the Node to reserve memory on." in result.stdout
