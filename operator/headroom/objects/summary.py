"""NodeHeadroom status from the ledger's node summary, checked by the CRD's own model."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from headroom.api.models import DeviceHeadroom, NodeHeadroomStatus
from headroom.ledger import Ledger, format_ratio
from headroom.ledger.devices import DeviceRoom

JSON = dict[str, Any]


def device_headroom(room: DeviceRoom) -> DeviceHeadroom:
    device = room.device
    return DeviceHeadroom(
        id=device.id,
        kind=device.kind.value,
        model=device.model or None,
        memory_mb=device.memory_mb,
        reserved_mb=room.held_mb,
        external_mb=room.external_mb,
        held_outside=("DevicePlugin" if room.plugin else "ResourceClaim") if room.whole else None,
        free_mb=room.free_mb,
    )


def headroom_status(
    ledger: Ledger, node: str, now: datetime, gpu_source: str | None = None
) -> JSON:
    """The ``status`` of one NodeHeadroom, validated by the same model as the CRD.

    ``gpu_source``: where the node's GPU inventory was read (the ledger holds the
    devices, not their provenance)."""
    s = ledger.node_summary(node, now)
    status = NodeHeadroomStatus(
        capacity_known=s.capacity_known,
        total_ram_mb=s.total_ram_mb,
        system_reserve_mb=s.system_reserve_mb,
        max_overcommit_ratio=format_ratio(s.max_overcommit_ratio),
        limit_ram_mb=s.limit_ram_mb,
        reserved_ram_mb=s.reserved_ram_mb,
        allocatable_ram_mb=s.allocatable_ram_mb,
        reserved_vram_mb=s.reserved_vram_mb,
        vram_capacity_mb=s.vram_capacity_mb,
        limit_vram_mb=s.limit_vram_mb,
        max_vram_overcommit_ratio=(
            format_ratio(s.max_vram_overcommit_ratio) if s.vram_capacity_mb is not None else None
        ),
        active_entries=s.active_entries,
        stale_entries=s.stale_entries,
        max_entries=s.max_entries,
        utilization_percent=s.reserved_ram_mb * 100 // s.total_ram_mb if s.total_ram_mb else 0,
        over_committed=s.over_committed,
        queued_entries=s.queued_entries,
        queued_ram_mb=s.queued_ram_mb,
        pod_requests_mb=s.pod_requests_mb,
        stale_window_seconds=max(
            int(ledger.limits_for(node).heartbeat_stale_window.total_seconds()), 1
        ),
        gpu_source=gpu_source if s.devices is not None else None,
        gpu_policy=str(s.gpu_policy) if s.devices is not None else None,
        largest_free_device_mb=s.largest_free_device_mb,
        device_plugin_gpus=s.device_plugin_gpus if s.devices is not None else None,
        devices=None if s.devices is None else [device_headroom(room) for room in s.devices],
    )
    # Absent optional figures are written as null so a merge patch clears them.
    dumped: JSON = status.model_dump(by_alias=True, mode="json", exclude={"updated_at"})
    return dumped
