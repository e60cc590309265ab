"""Read Kubernetes objects into ledger terms, refusing what does not parse.

Everything the API server sends passes through here before the ledger sees it:
Node figures, GPU labels, per-node limit annotations, Reservation specs and
heartbeat annotations. A value that does not parse never raises past this
module; it comes back as a ``problem`` sentence that names the field and the
value, for an Event, and the rest of the object is still used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError

from headroom.api.limits import MAX_ENTRIES_PER_NODE, Limits, parse_ratio
from headroom.api.models import GROUP, HEARTBEAT_ANNOTATION, MAX_RESERVATION_MB, ReservationSpec
from headroom.kube.quantity import memory_mib
from headroom.ledger import Entry, Owner

JSON = dict[str, Any]

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU, from GPU Feature Discovery
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
RATIO_ANNOTATION = f"{GROUP}/max-overcommit-ratio"
RESERVE_ANNOTATION = f"{GROUP}/system-reserve-mb"
ENTRIES_ANNOTATION = f"{GROUP}/max-entries"


@dataclass(frozen=True)
class NodeCapacity:
    """What the ledger needs from a Node, plus what could not be read."""

    name: str
    total_ram_mb: int | None
    vram_mb: int | None
    limits: Limits
    problems: list[str] = field(default_factory=list)


def _int_in(value: str, low: int, high: int) -> int:
    number = int(value.strip())
    if not low <= number <= high:
        raise ValueError(f"must be between {low} and {high}")
    return number


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
            total = min(memory_mib(raw_memory), MAX_RESERVATION_MB)
        except ValueError as error:
            problems.append(f"status.{ram_source}.memory: {error}; capacity treated as unknown")

    vram: int | None = None
    if GPU_MEMORY_LABEL in labels:
        try:
            per_gpu = _int_in(labels[GPU_MEMORY_LABEL], 0, MAX_RESERVATION_MB)
            count = _int_in(labels.get(GPU_COUNT_LABEL, "1"), 0, 1024)
            vram = min(per_gpu * count, MAX_RESERVATION_MB)
        except ValueError as error:
            problems.append(
                f"labels {GPU_MEMORY_LABEL}={labels.get(GPU_MEMORY_LABEL)!r}, "
                f"{GPU_COUNT_LABEL}={labels.get(GPU_COUNT_LABEL)!r}: {error}; VRAM not enforced"
            )

    ratio = reserve = entries = None
    if RATIO_ANNOTATION in annotations:
        try:
            ratio = parse_ratio(annotations[RATIO_ANNOTATION])
        except ValueError as error:
            problems.append(f"annotation {RATIO_ANNOTATION}: {error}; default used")
    for key, low, high in (
        (RESERVE_ANNOTATION, 0, MAX_RESERVATION_MB),
        (ENTRIES_ANNOTATION, 1, MAX_ENTRIES_PER_NODE),
    ):
        if key in annotations:
            try:
                number = _int_in(annotations[key], low, high)
            except ValueError as error:
                problems.append(f"annotation {key}={annotations[key]!r}: {error}; default used")
                continue
            if key == RESERVE_ANNOTATION:
                reserve = number
            else:
                entries = number
    limits = defaults.with_overrides(
        max_overcommit_ratio=ratio, system_reserve_mb=reserve, max_entries_per_node=entries
    )
    return NodeCapacity(name, total, vram, limits, problems)


def parse_time(value: str) -> datetime:
    """RFC 3339 -> aware UTC datetime. Raises ValueError naming the value."""
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        raise ValueError(f"not an RFC 3339 time: {value!r}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"RFC 3339 time needs a zone (e.g. Z): {value!r}")
    return parsed.astimezone(UTC)


def heartbeat_of(obj: JSON) -> datetime | None:
    """The heartbeat annotation of a Reservation or Pod; ValueError if malformed."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(HEARTBEAT_ANNOTATION)
    return None if raw is None else parse_time(raw)


def reservation_id(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def reservation_entry(obj: JSON, now: datetime) -> Entry:
    """The ledger entry for a Reservation; ValueError naming the field if the spec is bad."""
    metadata = obj.get("metadata") or {}
    try:
        spec = ReservationSpec.model_validate(obj.get("spec") or {})
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"spec.{where}: {first['msg']} (got {first.get('input')!r})") from None
    created = metadata.get("creationTimestamp")
    created_at = parse_time(created) if created else now
    status = obj.get("status") or {}
    beats = [created_at]
    if status.get("lastHeartbeat"):
        beats.append(parse_time(status["lastHeartbeat"]))
    try:
        annotated = heartbeat_of(obj)
    except ValueError:
        annotated = None
    if annotated is not None:
        beats.append(min(annotated, now))  # a heartbeat from the future counts as now
    owner = spec.owner
    return Entry(
        id=reservation_id(metadata.get("namespace", ""), metadata.get("name", "")),
        node=spec.node,
        ram_mb=spec.ram_mb,
        vram_mb=spec.vram_mb,
        created_at=created_at,
        last_heartbeat=max(beats),
        expires_at=spec.expires_at.astimezone(UTC) if spec.expires_at else None,
        owner=Owner(
            exec_id=owner.exec_id if owner else None,
            surface=owner.surface if owner else None,
            pid=owner.pid if owner else None,
            origin=owner.origin if owner else None,
            pod=owner.pod if owner else None,
        ),
        description=spec.description or "",
    )
