"""Read-only views of the ledger (seed: NodeSummary, ClusterSummary, Metrics)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction

from headroom.api.constants import MAX_MB
from headroom.api.gpus import GpuPolicy
from headroom.api.reasons import Reason
from headroom.ledger.devices import DeviceRoom, rooms
from headroom.ledger.node import NodeState


@dataclass(frozen=True, slots=True)
class NodeSummary:
    node: str
    capacity_known: bool
    total_ram_mb: int
    system_reserve_mb: int
    max_overcommit_ratio: Fraction
    limit_ram_mb: int | None  # None: unlimited, or capacity unknown
    reserved_ram_mb: int
    allocatable_ram_mb: int
    reserved_vram_mb: int
    vram_capacity_mb: int | None
    active_entries: int
    stale_entries: int
    max_entries: int
    utilization_pct: float  # display only; never used in a decision
    over_committed: bool
    queued_entries: int = 0  # waiting for room (hold no capacity)
    queued_ram_mb: int = 0
    pod_requests_mb: int = 0  # requested by pods beyond their claims; out of the limit
    limit_vram_mb: int | None = None  # VRAM × VRAM ratio; None: unknown or unlimited
    max_vram_overcommit_ratio: Fraction = Fraction(1)
    #: Each GPU device with what it holds and may hold; None: no inventory.
    devices: tuple[DeviceRoom, ...] | None = None
    gpu_policy: GpuPolicy = GpuPolicy.BINPACK
    #: GPUs bound device-plugin pods hold beyond their own claims (taken as whole devices).
    device_plugin_gpus: int = 0

    @property
    def largest_free_device_mb(self) -> int | None:
        """MiB free on the emptiest device (None: no devices, or unlimited)."""
        free = [room.free_mb for room in self.devices or ()]
        if not free or any(mib is None for mib in free):
            return None
        return max(mib for mib in free if mib is not None)


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    nodes: list[NodeSummary]
    total_reserved_mb: int
    total_vram_mb: int
    active_entries: int
    stale_entries: int


@dataclass(frozen=True, slots=True)
class Metrics:
    """Counters since this ledger was built:
    restored + reserved − released − reclaimed = active MiB.

    ``restored_mb`` is what a start put back (admitted by an earlier process);
    ``reserved_mb`` only what this ledger admitted, so it starts at 0 at every start.
    """

    reserved_mb: int
    released_mb: int
    reclaimed_mb: int
    reserve_failures: int
    active_entries: int
    active_mb: int
    failures_by_reason: Mapping[Reason, int] = field(default_factory=dict)
    restored_mb: int = 0


def cluster_summary(nodes: list[NodeSummary], active_entries: int) -> ClusterSummary:
    """The cluster's totals over its nodes' summaries."""
    return ClusterSummary(
        nodes=nodes,
        total_reserved_mb=sum(n.reserved_ram_mb for n in nodes),
        total_vram_mb=sum(n.reserved_vram_mb for n in nodes),
        active_entries=active_entries,
        stale_entries=sum(n.stale_entries for n in nodes),
    )


def allocatable(state: NodeState) -> int:
    """RAM still reservable: 0 when unknown, clamped at 0 when over-committed.

    With ratio 0 (unlimited) RAM is not enforced, so the answer is the largest
    reservation the API accepts.
    """
    if not state.known:
        return 0
    limit = state.limit_ram_mb()
    if limit is None:
        return MAX_MB
    return max(limit - state.reserved_ram_mb, 0)


def _shared(room: DeviceRoom) -> bool:
    """Admitted claims and holders outside Headroom together need more than the device
    has: a holder that came after them (they are never revoked)."""
    if not room.held_mb or not (room.whole or room.external_mb):
        return False
    return room.whole or (
        room.limit_mb is not None and room.held_mb + room.external_mb > room.limit_mb
    )


def summarize(state: NodeState, now: datetime) -> NodeSummary:
    window = state.limits.heartbeat_stale_window
    stale = sum(1 for e in state.entries.values() if e.is_stale(now, window))
    total = state.total_ram_mb or 0
    limit, vram_limit = state.limit_ram_mb(), state.limit_vram_mb()
    devices = (
        None
        if state.devices is None
        else tuple(
            rooms(
                state.devices,
                state.device_held,
                state.limits.max_vram_overcommit_ratio,
                state.outside(),
            )
        )
    )
    return NodeSummary(
        node=state.name,
        capacity_known=state.known,
        total_ram_mb=total,
        system_reserve_mb=state.limits.system_reserve_mb,
        max_overcommit_ratio=state.limits.max_overcommit_ratio,
        limit_ram_mb=limit,
        pod_requests_mb=state.pod_requests_mb,
        reserved_ram_mb=state.reserved_ram_mb,
        allocatable_ram_mb=allocatable(state),
        reserved_vram_mb=state.reserved_vram_mb,
        vram_capacity_mb=state.vram_mb,
        active_entries=len(state.entries),
        stale_entries=stale,
        max_entries=state.limits.max_entries_per_node,
        utilization_pct=100.0 * state.reserved_ram_mb / total if total else 0.0,
        over_committed=(limit is not None and state.reserved_ram_mb > limit)
        or (vram_limit is not None and state.reserved_vram_mb > vram_limit)
        or bool(state.devices is not None and state.over_committed_devices())
        or any(_shared(room) for room in devices or ()),
        devices=devices,
        device_plugin_gpus=state.plugin_gpus() if state.devices is not None else 0,
        gpu_policy=state.limits.gpu_policy,
        limit_vram_mb=vram_limit,
        max_vram_overcommit_ratio=state.limits.max_vram_overcommit_ratio,
    )
