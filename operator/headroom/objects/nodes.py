"""Read a Node into ledger terms: total RAM and per-node limits.

Its VRAM is not read here: it is the sum of the node's GPU devices, and those
come from the node's inventory (``headroom.objects.gpus``), which also reads
ResourceSlices and knows when GFD's labels would count MIG memory twice.

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
    GPU_POLICY_ANNOTATION,
    MAX_ENTRIES_PER_NODE,
    MAX_MB,
    RATIO_ANNOTATION,
    RESERVE_ANNOTATION,
    VRAM_RATIO_ANNOTATION,
)
from headroom.api.gpus import GpuPolicy
from headroom.api.limits import Limits
from headroom.api.parse import InvalidValueError, memory_mib, parse_int, parse_ratio, shown

JSON = dict[str, Any]


@dataclass(frozen=True)
class NodeCapacity:
    """What the ledger needs from a Node, plus what could not be read."""

    name: str
    total_ram_mb: int | None
    limits: Limits
    problems: list[str] = field(default_factory=list)


def node_capacity(
    node: JSON, defaults: Limits, ram_source: Literal["allocatable", "capacity"]
) -> NodeCapacity:
    """Total RAM and limits of a Node; bad values are reported and ignored."""
    metadata = node.get("metadata") or {}
    name = metadata.get("name", "")
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

    ratio = reserve = entries = vram_ratio = None
    policy: GpuPolicy | None = None
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
    try:
        if VRAM_RATIO_ANNOTATION in annotations:
            vram_ratio = parse_ratio(
                annotations[VRAM_RATIO_ANNOTATION], f"annotation {VRAM_RATIO_ANNOTATION}"
            )
    except InvalidValueError as error:
        problems.append(f"{error}; default used")
    if GPU_POLICY_ANNOTATION in annotations:
        raw_policy = annotations[GPU_POLICY_ANNOTATION]
        if raw_policy in set(GpuPolicy):
            policy = GpuPolicy(raw_policy)
        else:
            problems.append(
                f"annotation {GPU_POLICY_ANNOTATION}: not "
                f"{' or '.join(p.value for p in GpuPolicy)}: {shown(raw_policy)}; default used"
            )
    limits = defaults.with_overrides(
        max_overcommit_ratio=ratio,
        system_reserve_mb=reserve,
        max_entries_per_node=entries,
        max_vram_overcommit_ratio=vram_ratio,
        gpu_policy=policy,
    )
    return NodeCapacity(name, total, limits, problems)
