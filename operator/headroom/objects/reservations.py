"""Read a Reservation (and an owner Pod) into ledger terms, refusing what does not parse.

Everything a tenant writes passes through here before the ledger sees it: the
spec (validated by the same pydantic model the CRD is generated from) and the
heartbeat annotation. Whatever the object holds, these functions return a value
or raise InvalidValueError naming the field and the value.

A heartbeat is a *change* of the annotation's value, timed by the operator's
own clock when it sees the change (see ``headroom.control``): the value must be
an RFC 3339 time, but that time is never compared with the operator's clock, so
a client whose clock is wrong still keeps its reservation alive.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from headroom.api.constants import HEARTBEAT_ANNOTATION, OWNER_LABEL
from headroom.api.models import ReservationSpec
from headroom.api.parse import InvalidValueError, parse_time, shown
from headroom.ledger import Entry, Owner

JSON = dict[str, Any]
HEARTBEAT_FIELD = f"annotation {HEARTBEAT_ANNOTATION}"


def reservation_id(namespace: str, name: str) -> str:
    """The ledger's id of a Reservation: its namespace and name."""
    return f"{namespace}/{name}"


def heartbeat_value(obj: JSON) -> str | None:
    """The heartbeat annotation of a Reservation or Pod, checked to be a time.

    Returns the raw value (what the operator compares to see a change), None when
    absent; InvalidValueError naming the annotation when it is not a valid time.
    """
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(HEARTBEAT_ANNOTATION)
    if raw is None:
        return None
    parse_time(raw, HEARTBEAT_FIELD)
    return str(raw)


def is_owner_pod(obj: JSON) -> bool:
    """Whether a Pod carries the label that makes the operator follow it."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(OWNER_LABEL) == "true"


def spec_targets(obj: JSON) -> tuple[str | None, str | None]:
    """(node, owner pod) as written in the spec, unchecked: for ordering, not deciding."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return None, None
    node = spec.get("node")
    owner = spec.get("owner")
    pod = owner.get("pod") if isinstance(owner, dict) else None
    return (node if isinstance(node, str) else None), (pod if isinstance(pod, str) else None)


def reservation_entry(obj: JSON, now: datetime) -> Entry:
    """The ledger entry for a Reservation, alive as of ``now``.

    ``now`` is when the operator admits it (a reservation's stale clock starts at
    its admission) or when it began watching heartbeats after a start. Nothing
    from ``status`` is read: a status is not covered by the decision stamp.
    InvalidValueError names the field when the spec is bad.
    """
    metadata = obj.get("metadata") or {}
    spec_body = obj.get("spec")
    if not isinstance(spec_body, dict):
        raise InvalidValueError(f"spec: expected an object, got {shown(spec_body)}")
    try:
        spec = ReservationSpec.model_validate(spec_body)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        got = shown(first.get("input"))
        raise InvalidValueError(f"spec.{where}: {message} (got {got})") from None
    created_at = optional_time(metadata.get("creationTimestamp")) or now
    owner = spec.owner
    return Entry(
        id=reservation_id(metadata.get("namespace", ""), metadata.get("name", "")),
        node=spec.node,
        ram_mb=spec.ram_mb,
        vram_mb=spec.vram_mb,
        created_at=min(created_at, now),
        last_heartbeat=now,
        expires_at=spec.expires_at,
        owner=Owner(
            exec_id=owner.exec_id if owner else None,
            surface=owner.surface if owner else None,
            pid=owner.pid if owner else None,
            origin=owner.origin if owner else None,
            pod=owner.pod if owner else None,
        ),
        description=spec.description or "",
        wait_until=created_at + spec.wait if spec.wait else None,
        pod_lifetime=spec.liveness == "Pod",
        gpus=1 if spec.gpus is None else spec.gpus,
    )


def optional_time(value: object) -> datetime | None:
    """A time from the API server or a status, or None when absent or unreadable."""
    if value is None:
        return None
    try:
        return parse_time(value)
    except InvalidValueError:
        return None


def decision_essentials(obj: JSON) -> JSON:
    """What a decision reads from a Reservation; the rest (managedFields…) is not kept.
    (The ownerReferences name a gated pod's reservation's owner: its incarnation.)

    Undecided reservations wait in the admission queue as these: a backlog of
    30,000 full objects once grew the operator past 1 GB.
    """
    metadata = obj.get("metadata") or {}
    kept = {
        key: metadata[key]
        for key in (
            "uid",
            "namespace",
            "name",
            "creationTimestamp",
            "generation",
            "ownerReferences",
        )
        if key in metadata
    }
    beat = (metadata.get("annotations") or {}).get(HEARTBEAT_ANNOTATION)
    if beat is not None:
        kept["annotations"] = {HEARTBEAT_ANNOTATION: beat}
    return {"metadata": kept, "spec": obj.get("spec")}
