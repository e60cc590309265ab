"""NodeHeadroom status from the ledger's node summary, checked by the CRD's own model."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from headroom.api.models import NodeHeadroomStatus
from headroom.ledger import Ledger, format_ratio

JSON = dict[str, Any]


def headroom_status(ledger: Ledger, node: str, now: datetime) -> JSON:
    """The ``status`` of one NodeHeadroom, validated by the same model as the CRD."""
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
    )
    # Absent optional figures are written as null so a merge patch clears them.
    dumped: JSON = status.model_dump(by_alias=True, mode="json", exclude={"updated_at"})
    return dumped
