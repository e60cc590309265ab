"""Per-device VRAM arithmetic: which devices a claim goes on, and what each holds.

A claim of ``vram_mb`` over ``gpus`` devices needs ``gpus`` distinct devices
with its *share* free on each. The share is ``ceil(vram_mb / gpus)``, and that
is also what each chosen device holds: a framework that splits a model over k
devices puts an equal shard on each, a claim is never smaller than asked (at
most ``gpus − 1`` MiB more in total), and every assignment is the same number
on each device, which makes the rebuild a plain sum.

A device's limit is ``floor(memory × ratio)`` with the ratio an exact Fraction,
as for a node's RAM (``headroom.ledger.node``): the one floor rounds against
admission. Ratio 0 means unlimited, as it does for RAM.

What is held outside Headroom (``headroom.ledger.external``: DRA ResourceClaims,
device-plugin pods) comes off a device's limit; a device held whole by someone else
has nothing free, whatever the ratio.

Among the devices with room, ``binpack`` takes the fullest: the least free MiB
after what it holds (best fit, which keeps large devices whole for large
claims; with equal devices that is the one holding most). ``spread`` takes the
emptiest: the most free. Under an unlimited ratio free is unbounded, so fullest
means most held. Ties go to the smaller device id. Everything here is pure: the
caller owns the per-device holdings (a dict of device id -> MiB) and passes
them in; :func:`hold` and :func:`release` update them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from headroom.api.gpus import GpuDevice, GpuPolicy
from headroom.ledger.external import Outside
from headroom.ledger.ratio import format_ratio

#: Device id -> MiB held on it by admitted claims.
Held = Mapping[str, int]
#: What one claim holds: device id -> MiB, its share on each chosen device.
Assignment = dict[str, int]
#: The ratio under which every device has room (for claims that already run).
UNLIMITED = Fraction(0)


def share_mb(vram_mb: int, gpus: int) -> int:
    """Each device's share of a claim: ``ceil(vram_mb / gpus)`` MiB."""
    if gpus < 1 or vram_mb < 0:
        raise ValueError(f"a share needs gpus >= 1 and vram_mb >= 0, got {gpus} and {vram_mb}")
    return -(-vram_mb // gpus)


def device_limit_mb(memory_mb: int, ratio: Fraction) -> int | None:
    """Most MiB that may be held on a device: ``floor(memory × ratio)``; None if unlimited."""
    if ratio < 0:
        raise ValueError(f"an overcommit ratio cannot be negative, got {ratio}")
    if ratio == 0:
        return None
    return memory_mb * ratio.numerator // ratio.denominator


@dataclass(frozen=True, slots=True)
class DeviceRoom:
    """A device at the moment of a decision: what it holds and may hold."""

    device: GpuDevice
    held_mb: int
    limit_mb: int | None  # None: unlimited (ratio 0)
    external_mb: int = 0  # held outside Headroom (DRA claims, device-plugin pods)
    whole: bool = False  # held whole outside Headroom: nothing free
    plugin: bool = False  # ... by a device-plugin pod (taken as the emptiest device)

    @property
    def free_mb(self) -> int | None:
        """MiB still free (0 when over-committed or held whole outside); None when
        unlimited."""
        if self.whole:
            return 0
        if self.limit_mb is None:
            return None
        return max(self.limit_mb - self.held_mb - self.external_mb, 0)

    def fits(self, share: int) -> bool:
        free = self.free_mb
        return free is None or free >= share


_NOTHING_OUTSIDE = Outside(0, False)


def rooms(
    devices: Iterable[GpuDevice],
    held: Held,
    ratio: Fraction,
    outside: Mapping[str, Outside] | None = None,
) -> list[DeviceRoom]:
    """Every device with its holdings and limit, ordered by id; ``outside``: what is
    held outside Headroom, by device id."""
    found: list[DeviceRoom] = []
    for device in devices:
        there = (outside or {}).get(device.id, _NOTHING_OUTSIDE)
        limit = device_limit_mb(device.memory_mb, ratio)
        found.append(
            DeviceRoom(device, held.get(device.id, 0), limit, there.mb, there.whole, there.plugin)
        )
    return sorted(found, key=lambda room: room.device.id)


def _fullness(room: DeviceRoom) -> int:
    """Smaller is fuller: free MiB, or minus what is held when unlimited."""
    free = room.free_mb
    return -room.held_mb if free is None else free


@dataclass(frozen=True, slots=True)
class DeviceRefusal:
    """Why a claim fits on no set of devices, with the numbers for its message.

    ``largest`` is the device with most room among those that lack the share
    (None when every device has it and there are just too few devices).
    """

    gpus: int
    share_mb: int
    devices: int
    fitting: int
    largest: DeviceRoom | None
    ratio: Fraction

    def message(self, node: str) -> str:
        """E.g. ``node gpu-1: needs 1 device with 51200 MiB free; largest free 30720 MiB
        (GPU-aabbccdd… 80 GiB, 49152 held)``."""
        plural = "device" if self.gpus == 1 else "devices"
        each = "" if self.gpus == 1 else " each"
        text = f"node {node}: needs {self.gpus} {plural} with {self.share_mb} MiB free{each}"
        if self.devices == 0:
            return f"{text}; it has no GPU devices"
        if self.gpus > 1:
            text += f"; {self.fitting} of {self.devices} have it"
        if self.largest is None:
            return f"{text}; it has {self.devices} device{'' if self.devices == 1 else 's'}"
        room = self.largest
        ratio = "" if self.ratio == 1 else f" × {format_ratio(self.ratio)}"
        largest = "largest" if self.fitting == 0 else "next largest"
        outside = ""
        if room.plugin:
            outside = ", held by a device-plugin pod"
        elif room.whole:
            outside = ", allocated whole by a ResourceClaim"
        elif room.external_mb:
            outside = f", {room.external_mb} held outside Headroom"
        return (
            f"{text}; {largest} free {room.free_mb} MiB ({short_id(room.device.id)} "
            f"{format_mib(room.device.memory_mb)}{ratio}, {room.held_mb} held{outside})"
        )


def choose_devices(
    devices: Sequence[GpuDevice],
    held: Held,
    vram_mb: int,
    gpus: int,
    ratio: Fraction,
    policy: GpuPolicy,
    outside: Mapping[str, Outside] | None = None,
) -> Assignment | DeviceRefusal:
    """The devices a claim of ``vram_mb`` over ``gpus`` devices goes on, or why none.

    Device ids are unique (the inventory guarantees it). ``held`` may name
    devices that are gone; they are ignored here. The result is deterministic:
    the same devices, holdings and claim give the same assignment, whatever the
    order of ``devices``.
    """
    if gpus < 1 or vram_mb < 1:
        raise ValueError(f"a device claim needs gpus >= 1 and vram_mb >= 1, got {gpus}, {vram_mb}")
    share = share_mb(vram_mb, gpus)
    every = rooms(devices, held, ratio, outside)
    fitting = [room for room in every if room.fits(share)]
    if len(fitting) < gpus:
        short = [room for room in every if not room.fits(share)]
        largest = min(short, key=lambda room: -_fullness(room), default=None)
        return DeviceRefusal(gpus, share, len(every), len(fitting), largest, ratio)
    if policy is GpuPolicy.BINPACK:
        fitting.sort(key=_fullness)  # stable: ties stay in id order
    else:
        fitting.sort(key=lambda room: -_fullness(room))
    return {room.device.id: share for room in fitting[:gpus]}


def describe(assignment: Mapping[str, int]) -> str:
    """``GPU-aabbccdd… (51200 MiB), GPU-eeff0011… (51200 MiB)``, in id order."""
    return ", ".join(f"{short_id(d)} ({mib} MiB)" for d, mib in sorted(assignment.items()))


def hold(held: MutableMapping[str, int], assignment: Mapping[str, int]) -> None:
    """Add an admitted claim's assignment to the holdings."""
    for device_id, mib in assignment.items():
        held[device_id] = held.get(device_id, 0) + mib


def release(held: MutableMapping[str, int], assignment: Mapping[str, int]) -> None:
    """Take a released claim's assignment off the holdings (a device at 0 is dropped)."""
    for device_id, mib in assignment.items():
        left = held.get(device_id, 0) - mib
        if left > 0:
            held[device_id] = left
        else:
            held.pop(device_id, None)


@dataclass(frozen=True, slots=True)
class OverCommit:
    """A device holding more than its limit, or holdings on a device that is gone."""

    device_id: str
    held_mb: int
    memory_mb: int | None  # None: the device is no longer in the inventory
    limit_mb: int | None

    def message(self, node: str) -> str:
        name = short_id(self.device_id)
        if self.memory_mb is None:
            return (
                f"node {node}: device {name} holds {self.held_mb} MiB of admitted claims "
                f"but is no longer in the inventory"
            )
        return (
            f"node {node}: device {name} holds {self.held_mb} MiB, above its limit of "
            f"{self.limit_mb} MiB ({format_mib(self.memory_mb)})"
        )


@dataclass(frozen=True, slots=True)
class Restored:
    """Holdings rebuilt from recorded assignments, and what no longer fits."""

    held: dict[str, int] = field(default_factory=dict)
    over: tuple[OverCommit, ...] = ()


def over_committed(devices: Iterable[GpuDevice], held: Held, ratio: Fraction) -> list[OverCommit]:
    """Devices over their limit, and holdings on devices not in ``devices``, by id."""
    known = {device.id: device for device in devices}
    over: list[OverCommit] = []
    for device_id in sorted(held):
        mib = held[device_id]
        device = known.get(device_id)
        if device is None:
            if mib > 0:
                over.append(OverCommit(device_id, mib, None, None))
            continue
        limit = device_limit_mb(device.memory_mb, ratio)
        if limit is not None and mib > limit:
            over.append(OverCommit(device_id, mib, device.memory_mb, limit))
    return over


def restore_holdings(
    devices: Iterable[GpuDevice], assignments: Iterable[Mapping[str, int]], ratio: Fraction
) -> Restored:
    """The holdings that recorded assignments add up to (the rebuild), never refusing one.

    An admitted claim keeps its devices even if one is gone or has shrunk: its
    MiB stay held under that device id (so a release takes them off again, and
    a device that comes back is full as before), and the device is reported in
    ``over``, as a shrinking node is today. Each MiB figure is expected to have
    been read and bounded by the caller (``0 .. MAX_MB``).
    """
    held: dict[str, int] = {}
    for assignment in assignments:
        hold(held, assignment)
    return Restored(held, tuple(over_committed(devices, held, ratio)))


_NVIDIA_UUID = re.compile(r"(GPU|MIG)-([0-9a-fA-F]{8})-[0-9a-fA-F-]{27}")


def short_id(device_id: str) -> str:
    """A device id for a message: ``GPU-aabbccdd…`` for an NVIDIA UUID, long ids cut."""
    if match := _NVIDIA_UUID.fullmatch(device_id):
        return f"{match[1]}-{match[2]}…"
    return device_id if len(device_id) <= 40 else f"{device_id[:39]}…"


def format_mib(mib: int) -> str:
    """``80 GiB`` when whole GiB, else ``4864 MiB``."""
    return f"{mib // 1024} GiB" if mib and mib % 1024 == 0 else f"{mib} MiB"
