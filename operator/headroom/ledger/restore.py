"""After a restart: which of the entries put back no longer fit, without re-deciding any.

A restart must not cost a tenant a reservation the operator admitted: its limits
or a node's capacity may have changed while it was down, but what was admitted
is put back as it was (:meth:`Ledger.restore`). What no longer fits is only
found and reported, so that the operator can surface it, and the order is the
one admission followed: on each node the oldest entries (by creation, then id)
are kept within the limits, and those after them are over; on a node with GPU
devices, the entries admitted without an assignment are placed first, and those
on a device holding more than it may are over too.
"""

from __future__ import annotations

from collections.abc import Iterable

from headroom.ledger.decisions import RestoreResult
from headroom.ledger.entry import Entry
from headroom.ledger.node import NodeState


def over_committed(states: Iterable[NodeState]) -> RestoreResult:
    """The entries of the nodes just restored (``states``) that no longer fit, oldest
    first, each once; entries held per device without an assignment are placed."""
    over: list[Entry] = []
    for state in states:
        if state.devices is not None:
            state.place_unassigned()
            crowded = {o.device_id for o in state.over_committed_devices()}
            over.extend(e for e in state.entries.values() if crowded.intersection(e.devices))
        limit, vram_limit = state.limit_ram_mb(), state.limit_vram_mb()
        ram = vram = 0
        for entry in sorted(state.entries.values(), key=lambda e: (e.created_at, e.id)):
            ram, vram = ram + entry.ram_mb, vram + entry.vram_mb
            if (limit is not None and ram > limit) or (
                vram_limit is not None and vram > vram_limit
            ):
                over.append(entry)
    unique = {entry.id: entry for entry in over}
    return RestoreResult(sorted(unique.values(), key=lambda e: (e.created_at, e.id)))
