"""Status bodies, and the JSON patches that write them.

A decision is a small record (phase, reason, message, when, decision id, stamp);
these functions turn it into the ``status`` a Reservation carries, the same way
every time, so that writing it again after a lost answer is idempotent.

Every status patch first tests ``metadata.uid``: a write meant for one
incarnation of a Reservation can never land on a namesake that was created
after it was deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from headroom.api.constants import API_VERSION, MAX_DEVICE_NAME, MAX_GPUS, MAX_MB
from headroom.api.parse import InvalidValueError, parse_time
from headroom.api.reasons import Phase, Reason
from headroom.api.refs import ObjectRef

JSON = dict[str, Any]


def timestamp(moment: datetime) -> str:
    """RFC 3339 with a Z, second precision as Kubernetes writes it."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def precise(moment: datetime) -> str:
    """RFC 3339 with microseconds: for heartbeats, where seconds are too coarse."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def reservation_ref(namespace: str, name: str, uid: str) -> ObjectRef:
    return ObjectRef(API_VERSION, "Reservation", name, uid, namespace)


@dataclass(slots=True)
class StatusDecision:
    """What the operator decided about one Reservation: what its status must say."""

    phase: Phase
    reason: Reason
    message: str
    at: datetime  # admittedAt / reclaimedAt / the condition's transition time
    decision_id: str = ""
    stamp: str | None = None
    generation: int | None = None
    position: int | None = None  # while Queued: its place in its node's queue
    #: Admitted on a node's GPU devices: device id -> MiB held there (status.devices).
    devices: dict[str, int] = field(default_factory=dict)
    #: The expiry its quota gave it, spec.expiresAt being absent (status.expiresAt).
    expires_at: datetime | None = None

    @property
    def expiry_text(self) -> str | None:
        """``status.expiresAt`` as written (and stamped): whole seconds."""
        return timestamp(self.expires_at) if self.expires_at is not None else None

    def matches(self, status: JSON) -> bool:
        """Whether an object's status already carries this decision."""
        if status.get("phase") != self.phase:
            return False
        return self.phase == Phase.RECLAIMED or status.get("decisionID") == self.decision_id


def admitted_condition(decision: StatusDecision) -> JSON:
    condition: JSON = {
        "type": "Admitted",
        "status": "True" if decision.phase == Phase.ADMITTED else "False",
        "reason": str(decision.reason),
        "message": decision.message,
        "lastTransitionTime": timestamp(decision.at),
    }
    if decision.generation is not None:
        condition["observedGeneration"] = decision.generation
    return condition


def status_body(decision: StatusDecision, last_heartbeat: datetime | None = None) -> JSON:
    """The whole ``status`` for a decision (replaces what was there)."""
    status: JSON = {
        "phase": str(decision.phase),
        "reason": str(decision.reason),
        "message": decision.message,
        "conditions": [admitted_condition(decision)],
    }
    if decision.phase != Phase.RECLAIMED:
        status["decisionID"] = decision.decision_id
        if decision.stamp:
            status["decisionStamp"] = decision.stamp
    if decision.generation is not None:
        status["observedGeneration"] = decision.generation
    if decision.phase == Phase.ADMITTED:
        status["admittedAt"] = timestamp(decision.at)
        if decision.devices:
            status["devices"] = [
                {"id": device, "memoryMB": mib} for device, mib in sorted(decision.devices.items())
            ]
        if decision.expires_at is not None:
            status["expiresAt"] = timestamp(decision.expires_at)
        if last_heartbeat is not None:
            status["lastHeartbeat"] = precise(last_heartbeat)
    elif decision.phase == Phase.RECLAIMED:
        status["reclaimedAt"] = timestamp(decision.at)
    elif decision.phase == Phase.QUEUED and decision.position is not None:
        status["queuePosition"] = decision.position
    return status


def replace_status(uid: str, status: JSON) -> list[JSON]:
    """Replace ``status`` of exactly this incarnation (uid) of the Reservation."""
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "add", "path": "/status", "value": status},
    ]


def set_position(uid: str, decision_id: str, position: int) -> list[JSON]:
    """Move a Queued reservation's ``queuePosition`` while it still carries that decision."""
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": "/status/decisionID", "value": decision_id},
        {"op": "add", "path": "/status/queuePosition", "value": position},
    ]


def set_heartbeat(uid: str, decision_id: str, at: datetime) -> list[JSON]:
    """Record ``lastHeartbeat`` while the status still carries this admission."""
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": "/status/decisionID", "value": decision_id},
        {"op": "add", "path": "/status/lastHeartbeat", "value": precise(at)},
    ]


def decision_of(status: JSON, at: datetime) -> StatusDecision | None:
    """The decision a status carries (read back at rebuild), or None if it has none."""
    try:
        phase = Phase(str(status.get("phase")))
        reason = Reason(str(status.get("reason")))
    except ValueError:
        return None
    generation = status.get("observedGeneration")
    position = status.get("queuePosition")
    return StatusDecision(
        phase=phase,
        reason=reason,
        message=str(status.get("message") or "")[:4096],
        at=at,
        decision_id=str(status.get("decisionID") or ""),
        stamp=status.get("decisionStamp"),
        generation=generation if isinstance(generation, int) else None,
        position=position if isinstance(position, int) else None,
        devices=recorded_devices(status) if phase == Phase.ADMITTED else {},
        expires_at=_expiry(status) if phase == Phase.ADMITTED else None,
    )


def recorded_expiry(status: JSON) -> str | None:
    """``status.expiresAt`` as written, if it is a string (what the stamp covers)."""
    value = status.get("expiresAt")
    return value if isinstance(value, str) and value else None


def _expiry(status: JSON) -> datetime | None:
    text = recorded_expiry(status)
    if text is None:
        return None
    try:
        return parse_time(text)
    except InvalidValueError:
        return None  # the stamp covers the text: a changed one no longer verifies


def recorded_devices(status: JSON) -> dict[str, int]:
    """The assignment an Admitted status records (``status.devices``), read totally.

    An item that is not ``{id, memoryMB}`` within bounds is left out; the decision
    stamp covers the assignment (``headroom.objects.stamp``), so a status that lost
    or changed an item no longer verifies and is decided again.
    """
    items = status.get("devices")
    if not isinstance(items, list):
        return {}
    devices: dict[str, int] = {}
    for item in items[:MAX_GPUS]:
        if not isinstance(item, dict):
            continue
        device, mib = item.get("id"), item.get("memoryMB")
        if (
            isinstance(device, str)
            and 0 < len(device) <= MAX_DEVICE_NAME
            and isinstance(mib, int)
            and not isinstance(mib, bool)
            and 0 < mib <= MAX_MB
            and device not in devices
        ):
            devices[device] = mib
    return devices


def canonical_devices(devices: Mapping[str, int]) -> str:
    """An assignment as one string, the same for the same devices in any order."""
    return ",".join(f"{device}={mib}" for device, mib in sorted(devices.items()))
