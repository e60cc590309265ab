"""GPU devices as the ledger sees them: an identity, a memory capacity and a kind.

A node's VRAM is not one number. A claim runs on devices, and each device has
its own memory: three 50 GiB claims do not fit on 2 × 80 GiB GPUs although
150 GiB < 160 GiB. So the inventory (read by ``headroom.objects.gpus``) is a
list of these devices, and admission (``headroom.ledger.devices``) chooses some
of them by a :class:`GpuPolicy`. Both sides import these types from here, the
one layer they share.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class DeviceKind(StrEnum):
    """A whole GPU, or a MIG device carved out of one (its own, isolated memory)."""

    GPU = "gpu"
    MIG = "mig"


class GpuPolicy(StrEnum):
    """How a claim's devices are chosen among those with room for its share.

    ``binpack`` takes the fullest device that fits (HAMi's default), keeping
    whole devices free for large claims; ``spread`` takes the emptiest, keeping
    neighbours apart. Ties go to the smaller device id, so a decision is the
    same in every replica and at every rebuild.
    """

    BINPACK = "binpack"
    SPREAD = "spread"


class InventorySource(StrEnum):
    """Where a node's devices were read, in order of precedence."""

    DRA = "ResourceSlice"
    HAMI = "HAMi"
    GFD = "GFD"


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One device a claim's share may be placed on.

    ``id`` is the device's UUID where the source has one (``GPU-…``, ``MIG-…``,
    what ``CUDA_VISIBLE_DEVICES`` takes), else a stable synthetic name (a
    ResourceSlice's ``<driver>/<pool>/<device>``, or ``gfd-0``… for labels).
    ``memory_mb`` is whole MiB, rounded down. ``parent`` is a MIG device's GPU
    UUID when the source says it. ``ref`` is a ResourceSlice device's DRA name,
    ``<driver>/<pool>/<device>``, as a ResourceClaim's allocation names it (empty for
    other sources): what ties a DRA allocation to this device. ``held_whole_by`` are
    other DRA names an allocation of which holds this device whole: for a GPU, the
    dynamic MIG partitions (KEP-4815 partitionable devices) that may be carved from it,
    not devices of their own (a GPU in MIG mode runs nothing outside its MIG
    instances); for a static MIG device, its parent GPU, not a device of its own here.
    """

    id: str
    memory_mb: int
    kind: DeviceKind = DeviceKind.GPU
    parent: str | None = None
    model: str = ""
    ref: str = ""
    held_whole_by: tuple[str, ...] = ()
