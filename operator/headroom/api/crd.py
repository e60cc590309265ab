"""Generate the CustomResourceDefinitions from the pydantic models.

One source of truth: the models in :mod:`headroom.api.models` carry names,
types, bounds, descriptions and CEL rules; this module reshapes their JSON
schema into the *structural* OpenAPI v3 schema the API server requires
(no ``$ref``, no ``anyOf`` for optionals, no ``additionalProperties`` beside
``properties``) and wraps it in a CRD with printer columns. ``make generate``
writes ``crds/``; ``make verify`` and a unit test fail when the files drift.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from headroom.api.constants import GROUP, VERSION
from headroom.api.models import (
    NodeHeadroomStatus,
    ReservationSpec,
    ReservationStatus,
)
from headroom.api.quotas import HeadroomQuotaSpec, HeadroomQuotaStatus

Schema = dict[str, Any]


def structural(model: type[BaseModel]) -> Schema:
    """The model's JSON schema, made structural for a CRD."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions: dict[str, Schema] = raw.pop("$defs", {})
    return _reshape(raw, definitions)


def _reshape(node: Schema, definitions: dict[str, Schema]) -> Schema:
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _reshape(merged, definitions)
    if "anyOf" in node:  # Optional[X]: the API server expresses absence by omission.
        choices = [c for c in node["anyOf"] if c.get("type") != "null"]
        if len(choices) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {node}")
        rest = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
        return _reshape({**choices[0], **rest}, definitions)
    if "const" in node:
        node = {**{k: v for k, v in node.items() if k != "const"}, "enum": [node["const"]]}
    out: Schema = {}
    for key, value in node.items():
        if key == "title" or (key == "default" and value in (None, [])):
            continue
        if key == "additionalProperties":  # a map's values (pydantic's False: closed object)
            if isinstance(value, dict):
                out[key] = _reshape(value, definitions)
        elif key == "properties":
            out[key] = {name: _reshape(sub, definitions) for name, sub in value.items()}
        elif key == "items":
            out[key] = _reshape(value, definitions)
        else:
            out[key] = copy.deepcopy(value)  # no YAML aliases between two uses of one model
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def _crd(
    *,
    kind: str,
    plural: str,
    scope: str,
    short_names: list[str],
    description: str,
    properties: Schema,
    required: list[str],
    columns: list[Schema],
) -> Schema:
    schema: Schema = {
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            **properties,
        },
    }
    if required:
        schema["required"] = required
    names: Schema = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": kind.lower(),
        "categories": ["headroom"],
    }
    if short_names:
        names["shortNames"] = short_names
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": names,
            "scope": scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def _column(name: str, path: str, type_: str = "string", **extra: Any) -> Schema:
    return {"name": name, "type": type_, "jsonPath": path, **extra}


def reservation_crd() -> Schema:
    return _crd(
        kind="Reservation",
        plural="reservations",
        scope="Namespaced",
        short_names=["rsv"],
        description=(
            "A claim on a node's RAM and VRAM. The operator admits it only if the node "
            "has headroom under its limits; delete it to release the memory."
        ),
        properties={"spec": structural(ReservationSpec), "status": structural(ReservationStatus)},
        required=["spec"],
        columns=[
            _column("Node", ".spec.node"),
            _column("RAM", ".spec.ramMB", "integer", description="MiB"),
            _column("VRAM", ".spec.vramMB", "integer", description="MiB"),
            _column("GPUs", ".spec.gpus", "integer", priority=1),
            _column("Phase", ".status.phase"),
            _column("Reason", ".status.reason"),
            _column("Position", ".status.queuePosition", "integer"),
            _column("Age", ".metadata.creationTimestamp", "date"),
            _column("Message", ".status.message", priority=1),
        ],
    )


def node_headroom_crd() -> Schema:
    return _crd(
        kind="NodeHeadroom",
        plural="nodeheadrooms",
        scope="Cluster",
        short_names=["nhr"],
        description=(
            "Per-node reservation headroom, one per Node with the same name, "
            "written by the operator. Read-only for everyone else."
        ),
        properties={"status": structural(NodeHeadroomStatus)},
        required=[],
        columns=[
            _column("Total", ".status.totalRAMMB", "integer", description="MiB"),
            _column("Reserved", ".status.reservedRAMMB", "integer", description="MiB"),
            _column("Allocatable", ".status.allocatableRAMMB", "integer", description="MiB"),
            _column("Util%", ".status.utilizationPercent", "integer"),
            _column("Entries", ".status.activeEntries", "integer"),
            _column("Stale", ".status.staleEntries", "integer"),
            _column("Queued", ".status.queuedEntries", "integer"),
            _column(
                "GPU-Free",
                ".status.largestFreeDeviceMB",
                "integer",
                description="MiB free on the emptiest GPU device",
            ),
            _column("VRAM", ".status.reservedVRAMMB", "integer", priority=1),
            _column("Over", ".status.overCommitted", "boolean", priority=1),
        ],
    )


def headroom_quota_crd() -> Schema:
    return _crd(
        kind="HeadroomQuota",
        plural="headroomquotas",
        scope="Cluster",
        short_names=["hq"],
        description=(
            "How much memory the namespaces it selects may hold together, on which nodes, "
            "and for how long. Written by platform admins; status written by the operator."
        ),
        properties={
            "spec": structural(HeadroomQuotaSpec),
            "status": structural(HeadroomQuotaStatus),
        },
        required=["spec"],
        columns=[
            _column("RAM-Used", ".status.ramMB", "integer", description="MiB"),
            _column("RAM-Limit", ".spec.ramMB", "integer", description="MiB"),
            _column("VRAM-Used", ".status.vramMB", "integer", description="MiB"),
            _column("VRAM-Limit", ".spec.vramMB", "integer", description="MiB"),
            _column("Entries", ".status.entries", "integer"),
            _column("Queued", ".status.queued", "integer"),
            _column("Namespaces", ".status.namespaceCount", "integer"),
            _column("Over", ".status.over", "boolean", priority=1),
            _column("Valid", ".status.valid", "boolean", priority=1),
            _column("Age", ".metadata.creationTimestamp", "date"),
        ],
    )


def all_crds() -> dict[str, Schema]:
    """File name in ``crds/`` -> CRD object."""
    return {
        f"{GROUP}_reservations.yaml": reservation_crd(),
        f"{GROUP}_nodeheadrooms.yaml": node_headroom_crd(),
        f"{GROUP}_headroomquotas.yaml": headroom_quota_crd(),
    }
