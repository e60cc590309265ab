"""Status bodies and the patches that write them.

Every status write is a JSON patch that first tests ``metadata.uid``: a write
meant for one incarnation of a Reservation can never land on a namesake that
was created after it was deleted.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from headroom.api.constants import API_VERSION
from headroom.api.reasons import Phase, Reason
from headroom.kube.client import JSON, KubeClient, resource_path
from headroom.kube.events import ObjectRef

GROUP, VERSION = API_VERSION.split("/")


def timestamp(moment: datetime) -> str:
    """RFC 3339 with a Z, second precision as Kubernetes writes it."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def precise(moment: datetime) -> str:
    """RFC 3339 with microseconds: for heartbeats, where seconds are too coarse."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def reservation_ref(namespace: str, name: str, uid: str) -> ObjectRef:
    return ObjectRef(API_VERSION, "Reservation", name, uid, namespace)


def admitted_condition(
    admitted: bool, reason: Reason, message: str, now: datetime, generation: int | None
) -> JSON:
    condition: JSON = {
        "type": "Admitted",
        "status": "True" if admitted else "False",
        "reason": str(reason),
        "message": message,
        "lastTransitionTime": timestamp(now),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def decision_status(
    *,
    admitted: bool,
    reason: Reason,
    message: str,
    now: datetime,
    generation: int | None,
    decision_id: str,
    last_heartbeat: datetime | None,
    stamp: str | None = None,
) -> JSON:
    status: JSON = {
        "phase": str(Phase.ADMITTED if admitted else Phase.REJECTED),
        "reason": str(reason),
        "message": message,
        "decisionID": decision_id,
        **({"decisionStamp": stamp} if stamp else {}),
        "conditions": [admitted_condition(admitted, reason, message, now, generation)],
    }
    if generation is not None:
        status["observedGeneration"] = generation
    if admitted:
        status["admittedAt"] = timestamp(now)
        if last_heartbeat is not None:
            status["lastHeartbeat"] = precise(last_heartbeat)
    return status


def reclaimed_status(reason: Reason, message: str, now: datetime) -> JSON:
    return {
        "phase": str(Phase.RECLAIMED),
        "reason": str(reason),
        "message": message,
        "reclaimedAt": timestamp(now),
        "conditions": [admitted_condition(False, reason, message, now, None)],
    }


def reservation_path(namespace: str, name: str, subresource: str = "") -> str:
    path = resource_path(GROUP, VERSION, "reservations", namespace, name)
    return f"{path}/{subresource}" if subresource else path


async def write_status(
    client: KubeClient, namespace: str, name: str, uid: str, status: JSON
) -> JSON:
    """Replace ``status`` of exactly this incarnation (uid) of the Reservation."""
    return await client.json_patch(
        reservation_path(namespace, name, "status"),
        [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/status", "value": status},
        ],
    )


async def write_status_fields(
    client: KubeClient, namespace: str, name: str, uid: str, fields: dict[str, Any]
) -> JSON:
    """Set some fields of an existing status of exactly this incarnation."""
    operations: list[JSON] = [{"op": "test", "path": "/metadata/uid", "value": uid}]
    operations += [{"op": "add", "path": f"/status/{k}", "value": v} for k, v in fields.items()]
    return await client.json_patch(reservation_path(namespace, name, "status"), operations)


async def write_stamp(
    client: KubeClient,
    namespace: str,
    name: str,
    uid: str,
    phase: str,
    decision_id: str,
    stamp: str,
) -> JSON:
    """Stamp an existing decision again (a new decision key), only if it is still that phase."""
    return await client.json_patch(
        reservation_path(namespace, name, "status"),
        [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": "/status/phase", "value": phase},
            {"op": "add", "path": "/status/decisionID", "value": decision_id},
            {"op": "add", "path": "/status/decisionStamp", "value": stamp},
        ],
    )
