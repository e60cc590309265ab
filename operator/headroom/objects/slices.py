"""Read a node's GPU devices from DRA ResourceSlices (``resource.k8s.io/v1``).

What the format promises (``k8s.io/api/resource/v1/types.go``): a slice names
its ``spec.driver``, ``spec.nodeName`` and ``spec.pool{name, generation,
resourceSliceCount}``; a pool may span several slices; a consumer must use only
the slices of a pool's highest generation, and should wait while fewer than
``resourceSliceCount`` of them are present. A slice holds at most 128 devices,
each ``{name, attributes, capacity, consumesCounters, taints}``, an attribute
being ``{"string"|"int"|"bool"|"version": value}`` and a capacity ``{value}``.
Attribute names may be qualified with the driver's domain (``gpu.nvidia.com/uuid``).

What NVIDIA's driver publishes (``gpu.nvidia.com``, k8s-dra-driver-gpu): per
full GPU ``type: gpu``, ``uuid``, ``productName`` and ``capacity.memory`` (a
binary quantity of bytes, ``80Gi``); per MIG device ``type: mig``, ``uuid``,
``parentUUID``, ``profile`` and its own ``capacity.memory``. ``index`` and
``minor`` are not read (removed by the driver in 2025).

Decisions:

* Only node-local slices count (``spec.nodeName`` is this node), of the
  configured drivers. Devices of another ``type`` (not ``gpu``/``mig``) are not
  GPU memory and are skipped; a device without ``type`` counts as a full GPU.
* A pool whose newest generation has fewer slices than it declares is
  *pending*, not wrong: a driver rewriting its slices passes through that state.
  The node's inventory is then "not yet complete" and the caller keeps the last
  complete one (older generations are never used instead: the format forbids it).
  More slices than declared, or slices of one generation that disagree on the
  count, are problems.
* A device with a ``NoSchedule`` or ``NoExecute`` taint (how DRA drivers mark
  an unhealthy device) is not counted.
* No memory is counted twice. A static MIG device's parent GPU, if also
  published, is dropped (its memory is the MIG devices'). A device that consumes
  shared counters (KEP-4815 partitionable devices, e.g. dynamic MIG) is one of
  several overlapping *possible* partitions: such a MIG device is dropped in
  favour of its parent GPU, and if its parent is not published the node's VRAM
  is unknown, since overlapping partitions cannot be summed. What is dropped is
  kept as a DRA name (``GpuDevice.held_whole_by``): a ResourceClaim allocated on
  a dynamic partition holds its parent GPU whole, and one allocated on a static
  MIG device's parent holds each of its MIG devices whole.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from headroom.api.constants import (
    MAX_DEVICE_NAME,
    MAX_DEVICES_PER_SLICE,
    MAX_GPUS,
    MAX_SLICES_PER_NODE,
)
from headroom.api.gpus import DeviceKind, GpuDevice
from headroom.api.parse import InvalidValueError, memory_mib, parse_int, shown

_MAX_GENERATION = (1 << 63) - 1
_UNHEALTHY_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True, slots=True)
class SliceReading:
    """What a node's ResourceSlices say. ``found``: some slice of a configured
    driver names this node, so this source takes precedence."""

    found: bool
    devices: tuple[GpuDevice, ...] = ()
    problems: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Slice:
    label: str  # "ResourceSlice <name>", for problems
    driver: str
    pool: str
    generation: int
    count: int
    spec: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class _Found:
    device: GpuDevice
    partition: bool  # consumes shared counters: one of several overlapping partitions


def slice_devices(slices: object, node: str, drivers: Collection[str]) -> SliceReading:
    """The GPU devices the configured drivers publish for ``node``; never raises."""
    if not isinstance(slices, list | tuple):
        return SliceReading(False)
    ours = [
        item
        for item in slices
        if isinstance(item, dict)
        and isinstance(spec := item.get("spec"), dict)
        and spec.get("nodeName") == node
        and isinstance(spec.get("driver"), str)
        and spec["driver"] in drivers
    ]
    if not ours:
        return SliceReading(False)
    if len(ours) > MAX_SLICES_PER_NODE:
        problem = (
            f"ResourceSlices of node {node}: {len(ours)} slices, at most {MAX_SLICES_PER_NODE}"
        )
        return SliceReading(True, problems=(problem,))
    problems: list[str] = []
    pools: dict[tuple[str, str], list[_Slice]] = {}
    for item in ours:
        try:
            read = _read_slice(item)
        except InvalidValueError as error:
            problems.append(str(error))
            continue
        pools.setdefault((read.driver, read.pool), []).append(read)
    pending: list[str] = []
    found: list[_Found] = []
    for (driver, pool), members in sorted(pools.items()):
        newest = max(member.generation for member in members)
        current = [member for member in members if member.generation == newest]
        counts = sorted({member.count for member in current})
        where = f"pool {driver}/{pool} generation {newest}"
        if len(counts) > 1:
            problems.append(f"{where}: its slices disagree on resourceSliceCount: {counts}")
        elif len(current) > counts[0]:
            problems.append(
                f"{where}: {len(current)} slices, but spec.pool.resourceSliceCount is {counts[0]}"
            )
        elif len(current) < counts[0]:
            pending.append(f"{where}: {len(current)} of {counts[0]} ResourceSlices seen")
        else:
            for member in sorted(current, key=lambda member: member.label):
                found.extend(_slice_devices(member, problems))
    devices = _without_double_counting(found, problems)
    if len(devices) > MAX_GPUS:
        problems.append(
            f"ResourceSlices of node {node}: {len(devices)} devices, at most {MAX_GPUS}"
        )
    seen: set[str] = set()
    for device in devices:
        if device.id in seen:
            problems.append(f"ResourceSlices of node {node}: device {device.id!r} appears twice")
        seen.add(device.id)
    return SliceReading(True, tuple(devices), tuple(problems), tuple(pending))


def _name(value: object, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_DEVICE_NAME:
        raise InvalidValueError(
            f"{field}: a name of 1 .. {MAX_DEVICE_NAME} characters, got {shown(value)}"
        )
    return value


def _read_slice(item: Mapping[str, Any]) -> _Slice:
    metadata = item.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    label = f"ResourceSlice {name if isinstance(name, str) else shown(name)}"
    spec = item["spec"]
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        raise InvalidValueError(f"{label}: spec.pool: not an object: {shown(pool)}")
    return _Slice(
        label=label,
        driver=spec["driver"],
        pool=_name(pool.get("name"), f"{label}: spec.pool.name"),
        generation=parse_int(
            pool.get("generation"), f"{label}: spec.pool.generation", 0, _MAX_GENERATION
        ),
        count=parse_int(
            pool.get("resourceSliceCount"),
            f"{label}: spec.pool.resourceSliceCount",
            1,
            MAX_SLICES_PER_NODE,
        ),
        spec=spec,
    )


def _slice_devices(member: _Slice, problems: list[str]) -> list[_Found]:
    raw = member.spec.get("devices")
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.append(f"{member.label}: spec.devices: not a list: {shown(raw)}")
        return []
    if len(raw) > MAX_DEVICES_PER_SLICE:
        problems.append(
            f"{member.label}: spec.devices: {len(raw)} devices, at most {MAX_DEVICES_PER_SLICE}"
        )
        return []
    found: list[_Found] = []
    for index, device in enumerate(raw):
        try:
            read = _read_device(device, member, f"{member.label}: spec.devices[{index}]")
        except InvalidValueError as error:
            problems.append(str(error))
            continue
        if read is not None:
            found.append(read)
    return found


def _read_device(device: object, member: _Slice, field: str) -> _Found | None:
    """One published device; None when it is not GPU memory or is unhealthy."""
    if not isinstance(device, dict):
        raise InvalidValueError(f"{field}: not an object: {shown(device)}")
    name = _name(device.get("name"), f"{field}.name")
    field = f"{field} ({name})"
    attributes = {} if device.get("attributes") is None else device["attributes"]
    capacity = {} if device.get("capacity") is None else device["capacity"]
    if not isinstance(attributes, dict) or not isinstance(capacity, dict):
        raise InvalidValueError(f"{field}: attributes and capacity must be objects")
    kind_text = _string_attribute(attributes, member.driver, "type", field)
    if kind_text not in (None, "gpu", "mig"):
        return None
    kind = DeviceKind.MIG if kind_text == "mig" else DeviceKind.GPU
    if _unhealthy(device.get("taints"), field):
        return None
    memory = capacity.get("memory", capacity.get(f"{member.driver}/memory"))
    if not isinstance(memory, dict) or "value" not in memory:
        raise InvalidValueError(f"{field}.capacity.memory: no {{value}}: {shown(memory)}")
    memory_mb = memory_mib(memory["value"], f"{field}.capacity.memory")
    uuid = _string_attribute(attributes, member.driver, "uuid", field)
    parent = _string_attribute(attributes, member.driver, "parentUUID", field)
    model = _string_attribute(attributes, member.driver, "productName", field) or ""
    counters = device.get("consumesCounters")
    ref = f"{member.driver}/{member.pool}/{name}"
    device_id = uuid if uuid else ref
    return _Found(
        GpuDevice(
            device_id, memory_mb, kind, parent if kind is DeviceKind.MIG else None, model, ref
        ),
        partition=isinstance(counters, list) and len(counters) > 0,
    )


def _string_attribute(
    attributes: Mapping[str, Any], driver: str, name: str, field: str
) -> str | None:
    raw = attributes.get(name, attributes.get(f"{driver}/{name}"))
    if raw is None:
        return None
    value = raw.get("string") if isinstance(raw, dict) else None
    if not isinstance(value, str) or len(value) > MAX_DEVICE_NAME:
        raise InvalidValueError(
            f"{field}.attributes.{name}: a string of at most {MAX_DEVICE_NAME} characters, "
            f"got {shown(raw)}"
        )
    return value


def _unhealthy(taints: object, field: str) -> bool:
    if taints is None:
        return False
    if not isinstance(taints, list):
        raise InvalidValueError(f"{field}.taints: not a list: {shown(taints)}")
    return any(
        isinstance(taint, dict) and taint.get("effect") in _UNHEALTHY_EFFECTS for taint in taints
    )


def _without_double_counting(found: list[_Found], problems: list[str]) -> list[GpuDevice]:
    """Drop a static MIG device's parent, and partitions whose parent GPU is counted."""
    gpus = {entry.device.id for entry in found if entry.device.kind is DeviceKind.GPU}
    carved = {
        entry.device.parent
        for entry in found
        if entry.device.kind is DeviceKind.MIG and not entry.partition
    }
    partitions: dict[str, list[str]] = {}  # parent GPU id -> its partitions' DRA names
    carved_refs: dict[str, str] = {}  # a dropped static-MIG parent's id -> its DRA name
    devices: list[GpuDevice] = []
    for entry in found:
        device = entry.device
        if device.kind is DeviceKind.GPU and device.id in carved:
            if device.ref:
                carved_refs[device.id] = device.ref
            continue
        if device.kind is DeviceKind.MIG and entry.partition:
            if device.parent not in gpus:
                problems.append(
                    f"device {device.id!r}: a MIG partition that consumes shared counters, "
                    f"whose parent GPU {device.parent!r} is not published: overlapping "
                    f"partitions cannot be summed"
                )
            elif device.parent is not None and device.ref:
                partitions.setdefault(device.parent, []).append(device.ref)
            continue
        devices.append(device)
    return [_held_whole_by(device, partitions, carved_refs) for device in devices]


def _held_whole_by(
    device: GpuDevice, partitions: Mapping[str, list[str]], carved_refs: Mapping[str, str]
) -> GpuDevice:
    """A GPU with its dynamic partitions, a static MIG device with its parent: DRA names
    that are no device here, but whose allocation holds this one whole."""
    if device.kind is DeviceKind.GPU and device.id in partitions:
        return replace(device, held_whole_by=tuple(sorted(partitions[device.id])))
    parent_ref = carved_refs.get(device.parent or "")
    if device.kind is DeviceKind.MIG and parent_ref is not None:
        return replace(device, held_whole_by=(parent_ref,))
    return device
