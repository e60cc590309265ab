"""Read a Node into ledger terms: total RAM, VRAM and per-node limits.

Every figure goes through a total parser (``headroom.api.parse``): a value that
does not parse, or lies outside its bound, never raises past this module; it
comes back as a ``problem`` sentence naming the field and the value, for a
``BadHeadroomSettings`` Event, and the rest of the Node is still used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from headroom.api.constants import (
    ENTRIES_ANNOTATION,
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    MAX_ENTRIES_PER_NODE,
    MAX_GPUS,
    MAX_MB,
    RATIO_ANNOTATION,
    RESERVE_ANNOTATION,
)
from headroom.api.limits import Limits
from headroom.api.parse import InvalidValueError, memory_mib, parse_int, parse_ratio

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
