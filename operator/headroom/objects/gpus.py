"""A node's GPU inventory: its devices, read from the best source it has.

Precedence, decided by *presence*, not by whether the source reads well:

1. DRA ResourceSlices of the configured drivers (``headroom.objects.slices``):
   per-device identity and memory, kept current by the driver, MIG-aware.
2. HAMi's ``hami.io/node-nvidia-register`` annotation: per-device UUID and
   memory, from HAMi's device plugin.
3. GPU Feature Discovery labels: one label set per node, no device identity;
   N identical devices named ``gfd-0``…

A source that is present but has a bad value makes the node's VRAM unknown
(with a problem naming the source, the field and the value, for a Warning on
the Node); it never falls back to a lower source, which would change the device
ids under admitted claims and could read the very labels that double count.

HAMi (``pkg/device``, ``DeviceInfo`` and ``DecodeNodeDevices``): JSON since
v2.4, a list of ``{id, index, count, devmem, devcore, type, numa, mode,
health}`` with every field ``omitempty``: an absent ``health`` is false (the
device is excluded), an absent ``devmem`` is 0. ``devmem`` is MiB, already
multiplied by HAMi's ``deviceMemoryScaling`` (so above the physical memory when
that is above 1). HAMi reads JSON first and falls back to the older format,
``UUID,count,devmem,devcore,type,numa,health`` (or 9 fields, adding ``index,
mode``) per device, each ended by ``:``; so does this module.

GFD (``gpu-feature-discovery``, ``internal/lm/resource.go``): ``gpu.count`` and
``gpu.memory`` (MiB per GPU); under MIG ``single`` they describe the MIG
devices (product ``…-MIG-<profile>``, or ``…-MIG-INVALID`` with count 0);
under ``mixed`` each profile has ``mig-<profile>.count`` and ``.memory``, but
``gpu.count`` still counts the MIG-enabled GPUs, with ``gpu.replicas`` 0 when
the (winning) model's GPUs are all MIG-enabled. So under ``mixed``: replicas 0
means no full GPU is usable and the devices are the MIG profiles; MIG profiles
next to replicas ≥ 1 (or no replicas label) cannot be told apart from full GPUs
and are a problem rather than a guess. Time-slicing and MPS replicas do not
multiply memory: the devices are the physical GPUs.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from headroom.api.constants import (
    DEFAULT_DRA_DRIVERS,
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_REPLICAS_LABEL,
    HAMI_REGISTER_ANNOTATION,
    MAX_DEVICE_NAME,
    MAX_GPU_REPLICAS,
    MAX_GPUS,
    MAX_INVENTORY_TEXT,
    MAX_MB,
    MIG_LABEL_PREFIX,
    MIG_STRATEGY_LABEL,
)
from headroom.api.gpus import DeviceKind, GpuDevice, InventorySource
from headroom.api.parse import InvalidValueError, parse_int, shown
from headroom.objects.slices import slice_devices

#: A Warning lists at most this many problems of one node.
MAX_PROBLEMS = 8
_HAMI = f"annotation {HAMI_REGISTER_ANNOTATION}"
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """A node's GPU devices and where they were read.

    ``source`` None: the node has no inventory, and its VRAM is handled as
    before. ``devices`` None with a source: unknown, because of ``problems``
    (each ends "VRAM not enforced", for a Warning), or not yet complete
    (``pending``: a ResourceSlice pool mid-update; keep the last complete
    inventory, no Warning). Devices are ordered by id.
    """

    source: InventorySource | None
    devices: tuple[GpuDevice, ...] | None = None
    problems: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()

    @property
    def total_mb(self) -> int | None:
        return None if self.devices is None else sum(d.memory_mb for d in self.devices)


def gpu_inventory(
    node: object, slices: object = (), drivers: Collection[str] = DEFAULT_DRA_DRIVERS
) -> GpuInventory:
    """Read a Node (and the ResourceSlices that may name it) into an inventory; never raises."""
    metadata = _mapping(node.get("metadata") if isinstance(node, dict) else None)
    name = metadata.get("name")
    labels = _mapping(metadata.get("labels"))
    annotations = _mapping(metadata.get("annotations"))
    dra = slice_devices(slices, name, drivers) if isinstance(name, str) else None
    if dra is not None and dra.found:
        return _inventory(InventorySource.DRA, list(dra.devices), list(dra.problems), dra.pending)
    if HAMI_REGISTER_ANNOTATION in annotations:
        devices, problems = hami_devices(annotations[HAMI_REGISTER_ANNOTATION])
        return _inventory(InventorySource.HAMI, devices, problems)
    gfd = gfd_devices(labels)
    if gfd is not None:
        return _inventory(InventorySource.GFD, *gfd)
    return GpuInventory(None)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _inventory(
    source: InventorySource,
    devices: list[GpuDevice],
    problems: list[str],
    pending: tuple[str, ...] = (),
) -> GpuInventory:
    if problems:
        shown_problems = [f"{problem}; VRAM not enforced" for problem in problems[:MAX_PROBLEMS]]
        if len(problems) > MAX_PROBLEMS:
            shown_problems.append(f"and {len(problems) - MAX_PROBLEMS} more problems")
        return GpuInventory(source, None, tuple(shown_problems), pending)
    if pending:
        return GpuInventory(source, None, (), pending)
    return GpuInventory(source, tuple(sorted(devices, key=lambda device: device.id)))


# -- HAMi -----------------------------------------------------------------------------------


def hami_devices(value: object) -> tuple[list[GpuDevice], list[str]]:
    """The healthy devices in HAMi's annotation (JSON, or the older text), and problems."""
    if isinstance(value, str) and len(value) > MAX_INVENTORY_TEXT:
        return [], [f"{_HAMI}: {len(value)} characters, at most {MAX_INVENTORY_TEXT}"]
    if not isinstance(value, str) or not value.strip():
        return [], [f"{_HAMI}: not a device list: {shown(value)}"]
    text = value.strip()
    if text.startswith("["):
        try:
            entries = json.loads(text)
        except (ValueError, RecursionError):
            return [], [f"{_HAMI}: not valid JSON: {shown(value)}"]
        read = _hami_json
    else:
        entries = [piece for piece in text.split(":") if piece.strip()]
        read = _hami_text
    if len(entries) > MAX_GPUS:
        return [], [f"{_HAMI}: {len(entries)} devices, at most {MAX_GPUS}"]
    devices: list[GpuDevice] = []
    problems: list[str] = []
    for index, entry in enumerate(entries):
        try:
            device = read(entry, f"{_HAMI}: device {index}")
        except InvalidValueError as error:
            problems.append(str(error))
            continue
        if device is not None:
            devices.append(device)
    problems.extend(_duplicates(devices, _HAMI))
    return devices, problems


def _hami_json(entry: object, field: str) -> GpuDevice | None:
    if not isinstance(entry, dict):
        raise InvalidValueError(f"{field}: not an object: {shown(entry)}")
    device_id = _device_id(entry.get("id"), f"{field}.id")
    field = f"{field} ({device_id})"
    memory = parse_int(entry.get("devmem", 0), f"{field}.devmem", 0, MAX_MB)
    health = entry.get("health", False)  # omitempty: absent is false
    if not isinstance(health, bool):
        raise InvalidValueError(f"{field}.health: not true or false: {shown(health)}")
    model = entry.get("type", "")
    return GpuDevice(device_id, memory, model=_model(model)) if health else None


def _hami_text(entry: object, field: str) -> GpuDevice | None:
    parts = str(entry).split(",")
    if len(parts) not in (7, 9):
        raise InvalidValueError(
            f"{field}: {len(parts)} fields, expected UUID,count,devmem,devcore,type,numa,health"
            f"[,index,mode]: {shown(entry)}"
        )
    device_id = _device_id(parts[0].strip(), f"{field} UUID")
    field = f"{field} ({device_id})"
    memory = parse_int(parts[2], f"{field} devmem", 0, MAX_MB)
    health = parts[6].strip()
    if health not in _GO_TRUE | _GO_FALSE:
        raise InvalidValueError(f"{field} health: not true or false: {shown(parts[6])}")
    return GpuDevice(device_id, memory, model=_model(parts[4])) if health in _GO_TRUE else None


def _device_id(value: object, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_DEVICE_NAME:
        raise InvalidValueError(
            f"{field}: a device id of 1 .. {MAX_DEVICE_NAME} characters, got {shown(value)}"
        )
    return value


def _model(value: object) -> str:
    return value if isinstance(value, str) and len(value) <= MAX_DEVICE_NAME else ""


def _duplicates(devices: list[GpuDevice], source: str) -> list[str]:
    seen: set[str] = set()
    problems = []
    for device in devices:
        if device.id in seen:
            problems.append(f"{source}: device {device.id!r} appears twice")
        seen.add(device.id)
    return problems


# -- GPU Feature Discovery ------------------------------------------------------------------


def gfd_devices(labels: Mapping[str, Any]) -> tuple[list[GpuDevice], list[str]] | None:
    """N identical devices from GFD labels, and problems; None when there are no such labels."""
    strategy = labels.get(MIG_STRATEGY_LABEL, "none")
    profiles = sorted(
        key[len(MIG_LABEL_PREFIX) : -len(".count")]
        for key in labels
        if isinstance(key, str) and key.startswith(MIG_LABEL_PREFIX) and key.endswith(".count")
    )
    if GPU_MEMORY_LABEL not in labels and not (strategy == "mixed" and profiles):
        return None
    try:
        if strategy not in ("none", "single", "mixed"):
            raise InvalidValueError(
                f"label {MIG_STRATEGY_LABEL}: not none, single or mixed: {shown(strategy)}"
            )
        devices = _gfd_gpus(labels, strategy)
        if strategy == "mixed":
            devices = _gfd_mixed(labels, devices, profiles)
    except InvalidValueError as error:
        return [], [str(error)]
    if len(devices) > MAX_GPUS:
        return [], [f"GFD labels: {len(devices)} devices, at most {MAX_GPUS}"]
    return devices, []


def _gfd_gpus(labels: Mapping[str, Any], strategy: str) -> list[GpuDevice]:
    """The devices ``gpu.count`` × ``gpu.memory`` describe: full GPUs, or MIG under single."""
    if GPU_MEMORY_LABEL not in labels:
        return []
    memory = parse_int(labels[GPU_MEMORY_LABEL], f"label {GPU_MEMORY_LABEL}", 0, MAX_MB)
    count = parse_int(labels.get(GPU_COUNT_LABEL, "1"), f"label {GPU_COUNT_LABEL}", 0, MAX_GPUS)
    kind = DeviceKind.GPU
    product = labels.get(GPU_PRODUCT_LABEL, "")
    if strategy == "single" and isinstance(product, str) and "-MIG-" in product:
        if product.endswith("-MIG-INVALID"):
            raise InvalidValueError(
                f"label {GPU_PRODUCT_LABEL}: GFD found an invalid MIG single setup: "
                f"{shown(product)}"
            )
        kind = DeviceKind.MIG
    model = _model(product)
    return [GpuDevice(f"gfd-{index}", memory, kind, model=model) for index in range(count)]


def _gfd_mixed(
    labels: Mapping[str, Any], gpus: list[GpuDevice], profiles: list[str]
) -> list[GpuDevice]:
    """Under MIG mixed: the MIG profiles' devices, plus full GPUs only when unambiguous."""
    replicas = None
    if GPU_REPLICAS_LABEL in labels:
        replicas = parse_int(
            labels[GPU_REPLICAS_LABEL], f"label {GPU_REPLICAS_LABEL}", 0, MAX_GPU_REPLICAS
        )
    if replicas == 0:
        gpus = []  # every GPU of this model is MIG-enabled: its memory is the MIG devices'
    elif profiles and gpus:
        raise InvalidValueError(
            f"labels {MIG_STRATEGY_LABEL} 'mixed', {GPU_REPLICAS_LABEL} {shown(replicas)} and "
            f"{MIG_LABEL_PREFIX}{profiles[0]}.count: {GPU_COUNT_LABEL} "
            f"{shown(labels.get(GPU_COUNT_LABEL, '1'))} counts MIG-enabled GPUs too and GFD "
            f"does not say how many (publish the devices through DRA or HAMi)"
        )
    devices = list(gpus)
    for profile in profiles:
        key = f"{MIG_LABEL_PREFIX}{profile}"
        count = parse_int(labels[f"{key}.count"], f"label {key}.count", 0, MAX_GPUS)
        if f"{key}.memory" not in labels:
            raise InvalidValueError(f"label {key}.memory: missing next to {key}.count")
        memory = parse_int(labels[f"{key}.memory"], f"label {key}.memory", 0, MAX_MB)
        if len(devices) + count > MAX_GPUS:
            raise InvalidValueError(f"label {key}.count: more than {MAX_GPUS} devices in all")
        devices.extend(
            GpuDevice(f"gfd-{profile}-{index}", memory, DeviceKind.MIG, model=f"mig-{profile}")
            for index in range(count)
        )
    return devices
