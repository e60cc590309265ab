"""Per-node aggregates, kept incrementally so admission is O(1) in the node's entries.

The limit is ``floor(total × ratio) − system reserve`` in integer MiB, with the
ratio an exact Fraction: the only rounding anywhere is that one floor, and it
rounds against admission.

VRAM is held twice over, on purpose: as the node's sum (``reserved_vram_mb``,
what every claim adds, checked against the sum of the node's devices) and per
device (``device_held``, what claims with an assignment put on each device,
``headroom.ledger.devices``). A claim with ``gpus: 0`` spans the node and has
no assignment, so it is only in the sum; the sum check keeps the two kinds from
overfilling the node together.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headroom.api.gpus import GpuDevice
from headroom.api.limits import Limits
from headroom.ledger import devices as device_math
from headroom.ledger.entry import Entry


@dataclass(slots=True)
class NodeState:
    name: str
    limits: Limits
    total_ram_mb: int | None = None  # None: capacity unknown
    vram_mb: int | None = None  # None: VRAM unknown, tracked but not enforced
    reserved_ram_mb: int = 0
    pod_requests_mb: int = 0  # requested by pods beyond their claims (headroom.ledger.pods)
    reserved_vram_mb: int = 0
    entries: dict[str, Entry] = field(default_factory=dict)
    #: The node's GPU devices (its inventory); None: no per-device admission here.
    devices: tuple[GpuDevice, ...] | None = None
    #: Device id -> MiB that admitted assignments hold on it, whether or not the
    #: device is in ``devices`` now (a device that went away keeps its holdings).
    device_held: dict[str, int] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        return self.total_ram_mb is not None

    def limit_ram_mb(self) -> int | None:
        """Most RAM that may be reserved: ``floor(total × ratio) − reserve − memory pods
        requested beyond their claims``; None when unlimited (ratio 0) or unknown."""
        if self.total_ram_mb is None or self.limits.unlimited:
            return None
        ratio = self.limits.max_overcommit_ratio
        scaled = self.total_ram_mb * ratio.numerator // ratio.denominator
        return max(scaled - self.limits.system_reserve_mb - self.pod_requests_mb, 0)

    def limit_vram_mb(self) -> int | None:
        """Most VRAM the node's claims may hold in sum: ``floor(VRAM × VRAM ratio)``;
        None when VRAM is unknown or unlimited (VRAM ratio 0)."""
        if self.vram_mb is None:
            return None
        return device_math.device_limit_mb(self.vram_mb, self.limits.max_vram_overcommit_ratio)

    def on_devices(self, entry: Entry) -> bool:
        """Whether ``entry`` is admitted per device here: it asks VRAM over at least one
        device, and the node has an inventory."""
        return self.devices is not None and entry.gpus >= 1 and entry.vram_mb > 0

    def choose(self, entry: Entry) -> device_math.Assignment | device_math.DeviceRefusal:
        """The devices ``entry`` would go on now (``on_devices`` must hold)."""
        assert self.devices is not None
        return device_math.choose_devices(
            self.devices,
            self.device_held,
            entry.vram_mb,
            entry.gpus,
            self.limits.max_vram_overcommit_ratio,
            self.limits.gpu_policy,
        )

    def over_committed_devices(self) -> list[device_math.OverCommit]:
        return device_math.over_committed(
            self.devices or (), self.device_held, self.limits.max_vram_overcommit_ratio
        )

    def add(self, entry: Entry) -> None:
        self.entries[entry.id] = entry
        self.reserved_ram_mb += entry.ram_mb
        self.reserved_vram_mb += entry.vram_mb
        device_math.hold(self.device_held, entry.devices)

    def remove(self, entry_id: str) -> Entry:
        entry = self.entries.pop(entry_id)
        self.reserved_ram_mb -= entry.ram_mb
        self.reserved_vram_mb -= entry.vram_mb
        device_math.release(self.device_held, entry.devices)
        return entry
