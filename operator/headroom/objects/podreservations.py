"""Whether a pod's Reservation is the one the operator makes for its claim; letting a pod go.

Pure: no I/O. Why the comparison exists (issue 29, item 3): a Reservation named as a
gated pod and owned by it (an ownerReference anyone may write) is not proof that the
operator made it. Only a reservation exactly as :func:`headroom.objects.pods.pod_reservation`
writes it for the pod's claim — its size, devices, liveness and owner — may let the
pod out of the gate; anything else would let a tenant ungate a pod on a 1 MiB booking.
The node is the operator's choice, so it is checked against the pod's own words (the
``headroom.dev/node`` annotation) and, separately, against its constraints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headroom.api.claims import PodClaim
from headroom.api.constants import SCHEDULING_GATE

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Booked:
    """What a pod-owned Reservation's spec books (the fields a claim decides)."""

    node: str
    ram_mb: object
    vram_mb: object
    gpus: object
    owner_pod: object
    liveness: object
    waits: bool = False  # it has a spec.wait: made to wait in a queue (not at a bind)


def booked(reservation: JSON) -> Booked:
    spec = reservation.get("spec") or {}
    owner = spec.get("owner") or {}
    return Booked(
        node=str(spec.get("node", "")),
        ram_mb=spec.get("ramMB"),
        vram_mb=spec.get("vramMB", 0),
        gpus=spec.get("gpus"),
        owner_pod=owner.get("pod") if isinstance(owner, dict) else None,
        liveness=spec.get("liveness"),
        waits=spec.get("wait") is not None,
    )


def differences(book: Booked, pod_name: str, claim: PodClaim) -> list[str]:
    """How ``book`` differs from what the operator writes for ``claim`` (empty: it is that)."""
    wanted: list[tuple[str, object, object]] = [
        ("ramMB", book.ram_mb, claim.ram_mb),
        ("vramMB", book.vram_mb or 0, claim.vram_mb),
        ("gpus", book.gpus, claim.gpus),
        ("owner.pod", book.owner_pod, pod_name),
        ("liveness", book.liveness, "Pod"),
    ]
    if claim.node is not None:
        wanted.insert(0, ("node", book.node, claim.node))
    return [f"{name} {have}, not {want}" for name, have, want in wanted if have != want]


def for_another_claim(book: Booked, pod_name: str) -> bool:
    """Whether ``book`` is as the operator writes it for the pod but for a claim the pod
    no longer makes (its size, devices or node edited while it was gated): named owner
    and liveness as ours, so it may be ours, made before the edit. Such a reservation can
    never let the pod out; it is replaced, or the pod would be stranded by its own edit.
    (A forged one of this shape is replaced too: it never ungates the pod either.)"""
    return book.owner_pod == pod_name and book.liveness == "Pod"


def gate_removal_patch(pod: JSON) -> list[JSON] | None:
    """A JSON patch that removes our gate and nothing else (None: it is not there), guarded
    by ``test`` operations on the pod's uid and the gate, as the ungate patch is."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    for index, gate in enumerate(gates):
        if isinstance(gate, dict) and gate.get("name") == SCHEDULING_GATE:
            uid = (pod.get("metadata") or {}).get("uid")
            path = f"/spec/schedulingGates/{index}"
            return [
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "test", "path": f"{path}/name", "value": SCHEDULING_GATE},
                {"op": "remove", "path": path},
            ]
    return None


def annotation_patch(pod: JSON, name: str, value: str) -> list[JSON]:
    """A JSON patch that sets annotation ``name`` on this incarnation of the pod (a
    ``test`` of its uid first); whatever it says, the write moves the pod's
    resourceVersion, which is what the fence and the nudge are for."""
    meta = pod.get("metadata") or {}
    ops: list[JSON] = [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid")}]
    if meta.get("annotations"):
        path = "/metadata/annotations/" + name.replace("~", "~0").replace("/", "~1")
        ops.append({"op": "add", "path": path, "value": value})
    else:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {name: value}})
    return ops


def pod_condition(pod: JSON, condition_type: str) -> tuple[str, str, str] | None:
    """The pod's condition of that type as (status, reason, message), if it has one."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == condition_type:
            return (
                str(condition.get("status", "")),
                str(condition.get("reason", "")),
                str(condition.get("message", "")),
            )
    return None
