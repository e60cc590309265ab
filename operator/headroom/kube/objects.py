"""Read Kubernetes objects into ledger terms, refusing what does not parse.

Everything the API server sends passes through here before the ledger sees it:
Node figures, GPU labels, per-node limit annotations, Reservation specs and
heartbeat annotations. A value that does not parse never raises past this
module; it comes back as a ``problem`` sentence that names the field and the
value, for an Event, and the rest of the object is still used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from headroom.api.constants import (
    ENTRIES_ANNOTATION,
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    HEARTBEAT_ANNOTATION,
    MAX_ENTRIES_PER_NODE,
    MAX_GPUS,
    MAX_MB,
    RATIO_ANNOTATION,
    RESERVE_ANNOTATION,
)
from headroom.api.limits import Limits
from headroom.api.models import ReservationSpec
from headroom.api.parse import (
    InvalidValueError,
    memory_mib,
    parse_int,
    parse_ratio,
    parse_time,
    shown,
)
from headroom.ledger import Entry, Owner

JSON = dict[str, Any]


@dataclass(frozen=True)
class NodeCapacity:
    """What the ledger needs from a Node, plus what could not be read."""

    name: str
    total_ram_mb: int | None
    vram_mb: int | None
    limits: Limits
    problems: list[str] = field(default_factory=list)


def node_capacity(
    node: JSON, defaults: Limits, ram_source: Literal["allocatable", "capacity"]
) -> NodeCapacity:
    """Total RAM, VRAM and limits of a Node; bad values are reported and ignored."""
    metadata = node.get("metadata") or {}
    name = metadata.get("name", "")
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    status = node.get("status") or {}
    problems: list[str] = []

    total: int | None = None
    raw_memory = (status.get(ram_source) or {}).get("memory")
    if raw_memory is not None:
        try:
            total = memory_mib(raw_memory, f"status.{ram_source}.memory")
        except InvalidValueError as error:
            problems.append(f"{error}; capacity treated as unknown")

    vram: int | None = None
    if GPU_MEMORY_LABEL in labels:
        try:
            per_gpu = parse_int(labels[GPU_MEMORY_LABEL], f"label {GPU_MEMORY_LABEL}", 0, MAX_MB)
            count = parse_int(
                labels.get(GPU_COUNT_LABEL, "1"), f"label {GPU_COUNT_LABEL}", 0, MAX_GPUS
            )
            if per_gpu * count > MAX_MB:
                raise InvalidValueError(
                    f"labels {GPU_MEMORY_LABEL} × {GPU_COUNT_LABEL}: {per_gpu} × {count} MiB "
                    f"is above {MAX_MB} MiB"
                )
            vram = per_gpu * count
        except InvalidValueError as error:
            problems.append(f"{error}; VRAM not enforced")

    ratio = reserve = entries = None
    try:
        if RATIO_ANNOTATION in annotations:
            ratio = parse_ratio(annotations[RATIO_ANNOTATION], f"annotation {RATIO_ANNOTATION}")
    except InvalidValueError as error:
        problems.append(f"{error}; default used")
    try:
        if RESERVE_ANNOTATION in annotations:
            reserve = parse_int(
                annotations[RESERVE_ANNOTATION], f"annotation {RESERVE_ANNOTATION}", 0, MAX_MB
            )
    except InvalidValueError as error:
        problems.append(f"{error}; default used")
    try:
        if ENTRIES_ANNOTATION in annotations:
            entries = parse_int(
                annotations[ENTRIES_ANNOTATION],
                f"annotation {ENTRIES_ANNOTATION}",
                1,
                MAX_ENTRIES_PER_NODE,
            )
    except InvalidValueError as error:
        problems.append(f"{error}; default used")
    limits = defaults.with_overrides(
        max_overcommit_ratio=ratio, system_reserve_mb=reserve, max_entries_per_node=entries
    )
    return NodeCapacity(name, total, vram, limits, problems)


def heartbeat_of(obj: JSON) -> datetime | None:
    """The heartbeat annotation of a Reservation or Pod; InvalidValueError if malformed."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(HEARTBEAT_ANNOTATION)
    return None if raw is None else parse_time(raw, f"annotation {HEARTBEAT_ANNOTATION}")


def reservation_id(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def reservation_entry(obj: JSON, now: datetime) -> Entry:
    """The ledger entry for a Reservation; InvalidValueError naming the field if the spec is bad.

    Total: whatever the object holds, this returns an Entry or raises InvalidValueError.
    Optional times that do not parse (a status or annotation someone else wrote)
    are left out rather than failing the whole reservation.
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
    status = obj.get("status") or {}
    beats = [created_at]
    if (recorded := optional_time(status.get("lastHeartbeat"))) is not None:
        beats.append(recorded)
    try:
        annotated = heartbeat_of(obj)
    except InvalidValueError:
        annotated = None
    if annotated is not None:
        beats.append(annotated)
    beats = [min(beat, now) for beat in beats]  # a time from the future counts as now
    owner = spec.owner
    return Entry(
        id=reservation_id(metadata.get("namespace", ""), metadata.get("name", "")),
        node=spec.node,
        ram_mb=spec.ram_mb,
        vram_mb=spec.vram_mb,
        created_at=created_at,
        last_heartbeat=max(beats),
        expires_at=spec.expires_at,
        owner=Owner(
            exec_id=owner.exec_id if owner else None,
            surface=owner.surface if owner else None,
            pid=owner.pid if owner else None,
            origin=owner.origin if owner else None,
            pod=owner.pod if owner else None,
        ),
        description=spec.description or "",
    )


def optional_time(value: object) -> datetime | None:
    """A time from the API server or a status, or None when absent or unreadable."""
    if value is None:
        return None
    try:
        return parse_time(value)
    except InvalidValueError:
        return None
