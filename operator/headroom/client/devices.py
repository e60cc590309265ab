"""GPU devices as a claim sees them: the ones it holds, and a node's room on each.

A node's VRAM is not one number: three 50 GiB claims do not fit on 2 × 80 GiB
GPUs although 150 GiB < 160 GiB. The operator decides per device (a claim of
``vramMB`` over ``gpus`` devices needs ``gpus`` devices with its share,
``ceil(vramMB / gpus)``, free on each) and says so twice: in an admitted
Reservation's ``status.devices`` (which devices, how many MiB on each) and in a
NodeHeadroom's ``status.devices`` (each device's free MiB). This module reads
both for the claim library and the command line, which import of the operator's
ledger only its node order (``headroom.ledger.nodeorder``): the share is restated
here, one line, and a unit test holds it to the ledger's.

``status.devices`` is read totally, as the operator reads its own statuses: an
item that is not ``{id: non-empty string, memoryMB: whole MiB}`` is left out,
never an error, so a status written by a newer operator (or by hand) cannot
break a claim that holds memory. Ids with a comma or whitespace are left out
too: they could not be listed in ``$HEADROOM_DEVICES`` or
``CUDA_VISIBLE_DEVICES``.

``CUDA_VISIBLE_DEVICES`` takes device UUIDs (``GPU-…``, ``MIG-…``), not the
synthetic ids an inventory without UUIDs gets (``gfd-0``,
``gpu.nvidia.com/pool/gpu-0``); indices would name whatever the container's
runtime numbered 0, not the device the ledger chose. So the variable is given
only when every device is a UUID, and otherwise left as it was.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from headroom.api.constants import MAX_DEVICE_NAME, MAX_GPUS, MAX_MB
from headroom.api.models import DeviceHeadroom

#: An NVIDIA device UUID as CUDA_VISIBLE_DEVICES takes it: ``GPU-<uuid>``, ``MIG-<uuid>``
#: or the older ``MIG-GPU-<uuid>/<gi>/<ci>``.
NVIDIA_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*")
#: Devices named in a refusal, most free first; the rest are counted.
SHOWN_DEVICES = 4


@dataclass(frozen=True, slots=True)
class Device:
    """One device an admitted claim holds VRAM on: its id and the MiB held there."""

    id: str
    memory_mb: int


def _listable(device_id: object) -> bool:
    return (
        isinstance(device_id, str)
        and 0 < len(device_id) <= MAX_DEVICE_NAME
        and not any(c == "," or c.isspace() for c in device_id)
    )


def devices_of(status: object) -> tuple[Device, ...]:
    """``status.devices`` of a Reservation, in status order; malformed items left out
    (and a repeated id: its first item counts)."""
    items = status.get("devices") if isinstance(status, dict) else None
    if not isinstance(items, list):
        return ()
    found: dict[str, Device] = {}
    for item in items[:MAX_GPUS]:
        if not isinstance(item, dict):
            continue
        device_id, mib = item.get("id"), item.get("memoryMB")
        if not _listable(device_id) or not isinstance(mib, int) or isinstance(mib, bool):
            continue
        assert isinstance(device_id, str)
        if 0 <= mib <= MAX_MB and device_id not in found:
            found[device_id] = Device(device_id, mib)
    return tuple(found.values())


def device_list(devices: Sequence[Device]) -> str | None:
    """The ids comma-joined (``$HEADROOM_DEVICES``); None when there are none."""
    return ",".join(d.id for d in devices) or None


def cuda_visible_devices(devices: Sequence[Device]) -> str | None:
    """The ids comma-joined when every one is an NVIDIA UUID; else None (none, or a
    synthetic id, which CUDA cannot take)."""
    if not devices or not all(NVIDIA_UUID.fullmatch(d.id) for d in devices):
        return None
    return ",".join(d.id for d in devices)


def share_mb(vram_mb: int, gpus: int) -> int:
    """Each device's share of a claim, ``ceil(vram_mb / gpus)`` (the ledger's rule)."""
    return -(-vram_mb // gpus)


def short_id(device_id: str) -> str:
    """A device id for a one-line message: an NVIDIA UUID cut after its first group."""
    if NVIDIA_UUID.fullmatch(device_id) and len(device_id) > 13:
        return f"{device_id[:12]}…"
    return device_id if len(device_id) <= 40 else f"{device_id[:39]}…"


@dataclass(frozen=True, slots=True)
class DeviceFit:
    """How a claim of ``vram_mb`` over ``gpus`` devices stands on a node's devices."""

    gpus: int
    share_mb: int
    #: Devices with the share free now.
    fitting: int
    #: Devices whose limit could hold the share once others leave.
    could_fit: int
    devices: tuple[DeviceHeadroom, ...]

    @property
    def fits(self) -> bool:
        return self.fitting >= self.gpus

    @property
    def fits_later(self) -> bool:
        return self.could_fit >= self.gpus

    def why_not(self) -> str:
        """``needs 1 device with 51200 MiB free; 0 of 2 have it (free MiB: GPU-aabb… 30720,
        GPU-ccdd… 30720)``."""
        plural = "device" if self.gpus == 1 else "devices"
        each = "" if self.gpus == 1 else " each"
        text = f"needs {self.gpus} {plural} with {self.share_mb} MiB free{each}"
        if not self.devices:
            return f"{text}; it has no GPU devices"
        free = sorted(self.devices, key=lambda d: (-_free_or_most(d), d.id))
        shown = ", ".join(f"{short_id(d.id)} {_free_text(d)}" for d in free[:SHOWN_DEVICES])
        more = f", {len(free) - SHOWN_DEVICES} more" if len(free) > SHOWN_DEVICES else ""
        return f"{text}; {self.fitting} of {len(self.devices)} have it (free MiB: {shown}{more})"


def _free_or_most(device: DeviceHeadroom) -> int:
    return MAX_MB + 1 if device.free_mb is None else device.free_mb


def _free_text(device: DeviceHeadroom) -> str:
    return "unlimited" if device.free_mb is None else str(device.free_mb)


def device_fit(devices: Sequence[DeviceHeadroom], vram_mb: int, gpus: int) -> DeviceFit:
    """``vram_mb`` over ``gpus`` devices (both at least 1) against a node's devices."""
    share = share_mb(vram_mb, gpus)
    fitting = sum(1 for d in devices if d.free_mb is None or d.free_mb >= share)
    # A device's limit is free + reserved while it has room; a full one's is at most
    # what it holds: counted as that, so that a claim that may wait is not ruled out.
    could = sum(1 for d in devices if d.free_mb is None or d.free_mb + d.reserved_mb >= share)
    return DeviceFit(gpus, share, fitting, could, tuple(devices))


def largest_free_mb(devices: Sequence[DeviceHeadroom]) -> int | None:
    """MiB free on the emptiest device; None when there are none or one is unlimited."""
    if not devices or any(d.free_mb is None for d in devices):
        return None
    return max(d.free_mb or 0 for d in devices)


def spread_over(vram_mb: int, gpus: int | None) -> int:
    """Over how many devices a claim's VRAM goes per device: 0 when it is not admitted
    per device (no VRAM, or ``gpus: 0``, the node-wide sum only)."""
    if vram_mb <= 0:
        return 0
    return 1 if gpus is None else gpus
