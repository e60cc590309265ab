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

What is held outside Headroom on the node's devices (``headroom.ledger.external``)
is worked out from the ledger-wide holders, this node's devices, what its claims
hold and which pods own them; it is kept while none of those changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headroom.api.gpus import GpuDevice, GpuPolicy
from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.ledger import devices as device_math
from headroom.ledger.entry import Entry
from headroom.ledger.external import ExternalHoldings, Outside, PodKey
from headroom.ledger.ratio import format_ratio


@dataclass(slots=True)
class NodeState:
    name: str
    limits: Limits
    total_ram_mb: int | None = None  # None: capacity unknown
    vram_mb: int | None = None  # None: VRAM unknown, tracked but not enforced
    reserved_ram_mb: int = 0
    pod_requests_mb: int = 0  # requested by pods beyond their claims (ledger.podrequests)
    reserved_vram_mb: int = 0
    entries: dict[str, Entry] = field(default_factory=dict)
    #: The node's GPU devices (its inventory); None: no per-device admission here.
    devices: tuple[GpuDevice, ...] | None = None
    #: Device id -> MiB that admitted assignments hold on it, whether or not the
    #: device is in ``devices`` now (a device that went away keeps its holdings).
    device_held: dict[str, int] = field(default_factory=dict)
    #: Holders outside Headroom, ledger-wide (DRA claims, device-plugin pods); None: none.
    external: ExternalHoldings | None = None
    #: Per owner pod, device id -> MiB its admitted claims hold here (what offsets the
    #: pod's holdings outside Headroom), kept with ``device_held``.
    own: dict[PodKey, dict[str, int]] = field(default_factory=dict)
    # The last device choice, kept while nothing it depends on changed: a decision asks
    # "does it fit?" and then "where?" of the same entry, back to back.
    _version: int = 0  # bumped by every change to holdings, devices or limits
    _chosen: tuple[Entry | None, int, device_math.Assignment | device_math.DeviceRefusal] = (
        None,
        -1,
        {},
    )
    _outside: tuple[int, dict[str, Outside]] = (-1, {})  # (version, per device id)
    # The RAM limit and what it was worked out from (the limits object itself, so it is
    # never another one at a reused address): a scheduler's filter and prioritize ask it
    # of every node for every pod, and the Fraction arithmetic was their largest cost.
    _ram_limit: tuple[Limits | None, int | None, int, int | None] = field(
        default=(None, None, 0, None), compare=False, repr=False
    )

    @property
    def known(self) -> bool:
        return self.total_ram_mb is not None

    def limit_ram_mb(self) -> int | None:
        """Most RAM that may be reserved: ``floor(total × ratio) − reserve − memory pods
        requested beyond their claims``; None when unlimited (ratio 0) or unknown."""
        limits, total, pods, limit = self._ram_limit
        if limits is self.limits and total == self.total_ram_mb and pods == self.pod_requests_mb:
            return limit
        limits, total, pods = self.limits, self.total_ram_mb, self.pod_requests_mb
        if total is None or limits.unlimited:
            limit = None
        else:
            ratio = limits.max_overcommit_ratio
            scaled = total * ratio.numerator // ratio.denominator
            limit = max(scaled - limits.system_reserve_mb - pods, 0)
        self._ram_limit = (limits, total, pods, limit)
        return limit

    def limit_vram_mb(self) -> int | None:
        """Most VRAM the node's claims may hold in sum: ``floor(VRAM × VRAM ratio)`` less
        what is held outside Headroom (a device held whole: its whole limit), as pods'
        requests come off the RAM limit; None when VRAM is unknown or unlimited (ratio 0)."""
        if self.vram_mb is None:
            return None
        limit = device_math.device_limit_mb(self.vram_mb, self.limits.max_vram_overcommit_ratio)
        return None if limit is None else max(limit - self.vram_outside_mb(), 0)

    def vram_outside_mb(self) -> int:
        """What is held outside Headroom on the node's devices, as it comes off the VRAM
        limit: a device held whole takes its whole limit, a share its MiB."""
        outside = self.outside()
        if not outside:
            return 0
        ratio = self.limits.max_vram_overcommit_ratio
        taken = 0
        for device in self.devices or ():
            if (there := outside.get(device.id)) is not None:
                whole = device_math.device_limit_mb(device.memory_mb, ratio) if there.whole else 0
                taken += max(there.mb, whole or 0)
        return taken

    def on_devices(self, entry: Entry) -> bool:
        """Whether ``entry`` is admitted per device here: it asks VRAM over at least one
        device, and the node has an inventory."""
        return self.devices is not None and entry.gpus >= 1 and entry.vram_mb > 0

    def _own(self, entry: Entry, sign: int) -> None:
        """Keep ``own`` with an entry's assignment held (+1) or released (-1)."""
        if not entry.owner.pod or not entry.devices:
            return
        key = (entry.id.split("/", 1)[0], entry.owner.pod)
        if sign > 0:
            device_math.hold(self.own.setdefault(key, {}), entry.devices)
        elif (held := self.own.get(key)) is not None:
            device_math.release(held, entry.devices)
            if not held:
                del self.own[key]

    def outside(self) -> dict[str, Outside]:
        """What is held outside Headroom on each of the node's devices (by id)."""
        version, found = self._outside
        if version == self._version:
            return found
        found = {}
        external, devices = self.external, self.devices
        if external is not None and devices and external.any_on(self.name, devices):
            found = external.outside(self.name, devices, self.device_held, self.own)
        self._outside = (self._version, found)
        return found

    def plugin_gpus(self) -> int:
        """GPUs device-plugin pods here hold beyond the devices their own claims hold."""
        if self.external is None:
            return 0
        return self.external.plugin_gpus(self.name, self.devices or (), self.own)

    def changed(self) -> None:
        """Devices or limits were set: a kept device choice no longer holds."""
        self._version += 1

    def set_devices(self, devices: tuple[GpuDevice, ...] | None) -> None:
        """The node's inventory changed. Never moves an assignment: what admitted claims
        hold stays on its device ids. Claims holding VRAM per device but admitted
        without an assignment are placed now (``place_unassigned``)."""
        self.devices = devices
        self.changed()
        if devices is not None:
            self.place_unassigned()

    def choose(self, entry: Entry) -> device_math.Assignment | device_math.DeviceRefusal:
        """The devices ``entry`` would go on now (``on_devices`` must hold)."""
        last, version, choice = self._chosen
        if last is not entry or version != self._version:
            assert self.devices is not None
            choice = device_math.choose_devices(
                self.devices,
                self.device_held,
                entry.vram_mb,
                entry.gpus,
                self.limits.max_vram_overcommit_ratio,
                self.limits.gpu_policy,
                self.outside(),
            )
            self._chosen = (entry, self._version, choice)
        return dict(choice) if isinstance(choice, dict) else choice

    def forced_assignment(self, entry: Entry) -> dict[str, int]:
        """Devices for a claim that holds VRAM whether or not it fits (it already runs, or
        was admitted before the node had devices): the emptiest; none when the node has
        fewer devices than the claim spans. What is held outside Headroom counts as held."""
        held = dict(self.device_held)
        for device, outside in self.outside().items():
            held[device] = held.get(device, 0) + outside.mb
        chosen = device_math.choose_devices(
            self.devices or (),
            held,
            entry.vram_mb,
            entry.gpus,
            device_math.UNLIMITED,  # every device has room
            GpuPolicy.SPREAD,
        )
        return chosen if isinstance(chosen, dict) else {}

    def place_unassigned(self) -> None:
        """Claims on devices admitted without an assignment (before the node had an
        inventory, or before the upgrade that brought devices): placed oldest first, so
        that new claims see them. No-op without devices."""
        if self.devices is None:
            return
        unplaced = [e for e in self.entries.values() if self.on_devices(e) and not e.devices]
        for entry in sorted(unplaced, key=lambda e: (e.created_at, e.id)):
            entry.devices = self.forced_assignment(entry)
            device_math.hold(self.device_held, entry.devices)
            self._own(entry, +1)
            self.changed()

    def over_committed_devices(self) -> list[device_math.OverCommit]:
        return device_math.over_committed(
            self.devices or (), self.device_held, self.limits.max_vram_overcommit_ratio
        )

    def could_hold(self, entry: Entry) -> bool:
        """Whether ``entry`` would fit were nothing reserved on the node: within its RAM
        and VRAM limits as they are now, and on its devices were none of them held by
        Headroom's claims (what is held outside Headroom stays held)."""
        if self.limits.max_entries_per_node < 1:
            return False
        limit, vram_limit = self.limit_ram_mb(), self.limit_vram_mb()
        if entry.ram_mb and limit is not None and entry.ram_mb > limit:
            return False
        if entry.vram_mb and vram_limit is not None and entry.vram_mb > vram_limit:
            return False
        if not self.on_devices(entry):
            return True
        assert self.devices is not None
        choice = device_math.choose_devices(
            self.devices,
            {},
            entry.vram_mb,
            entry.gpus,
            self.limits.max_vram_overcommit_ratio,
            self.limits.gpu_policy,
            self.outside(),
        )
        return not isinstance(choice, device_math.DeviceRefusal)

    def room_refusal(self, entry: Entry) -> tuple[Reason, str] | None:
        """Why the node has no room for ``entry`` now (its capacity is known), with the
        numbers; None when it fits. Changes nothing."""
        cap = self.limits.max_entries_per_node
        if len(self.entries) >= cap:
            return Reason.TOO_MANY_ENTRIES, (
                f"node {self.name}: {len(self.entries)} active reservations, the cap is {cap}"
            )
        # A claim is refused only for what it asks: a VRAM-only claim on a node over its
        # RAM limit (after a shrink, say) takes none of the RAM that is short.
        limit = self.limit_ram_mb()
        if entry.ram_mb and limit is not None and self.reserved_ram_mb + entry.ram_mb > limit:
            pods = f" − pods {self.pod_requests_mb}" if self.pod_requests_mb else ""
            return Reason.INSUFFICIENT_RAM, (
                f"node {self.name}: requested {entry.ram_mb} MiB, allocatable "
                f"{max(limit - self.reserved_ram_mb, 0)} MiB (total {self.total_ram_mb} × "
                f"{format_ratio(self.limits.max_overcommit_ratio)} − reserve "
                f"{self.limits.system_reserve_mb}{pods} − reserved {self.reserved_ram_mb})"
            )
        # Devices first: their refusal says which device lacks what; the node's sum
        # (which what is held outside comes off too) stays checked after them.
        if self.on_devices(entry):
            choice = self.choose(entry)
            if isinstance(choice, device_math.DeviceRefusal):
                return Reason.INSUFFICIENT_VRAM, choice.message(self.name)
        vram_limit = self.limit_vram_mb()
        if (
            entry.vram_mb
            and vram_limit is not None
            and self.reserved_vram_mb + entry.vram_mb > vram_limit
        ):
            ratio = self.limits.max_vram_overcommit_ratio
            scaled = "" if ratio == 1 else f" × {format_ratio(ratio)}"
            taken = self.vram_outside_mb()
            held = f"− {taken} held outside Headroom " if taken else ""
            return Reason.INSUFFICIENT_VRAM, (
                f"node {self.name}: requested {entry.vram_mb} MiB VRAM, allocatable "
                f"{max(vram_limit - self.reserved_vram_mb, 0)} MiB (VRAM {self.vram_mb}{scaled} "
                f"{held}− reserved {self.reserved_vram_mb})"
            )
        return None

    def add(self, entry: Entry) -> None:
        self._version += 1
        self.entries[entry.id] = entry
        self.reserved_ram_mb += entry.ram_mb
        self.reserved_vram_mb += entry.vram_mb
        device_math.hold(self.device_held, entry.devices)
        self._own(entry, +1)

    def remove(self, entry_id: str) -> Entry:
        self._version += 1
        entry = self.entries.pop(entry_id)
        self.reserved_ram_mb -= entry.ram_mb
        self.reserved_vram_mb -= entry.vram_mb
        device_math.release(self.device_held, entry.devices)
        self._own(entry, -1)
        return entry
