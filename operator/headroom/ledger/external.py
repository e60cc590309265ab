"""GPU memory held outside Headroom: allocated DRA ResourceClaims and device-plugin pods.

A GPU that kube-scheduler gave to a pod through a DRA ResourceClaim or through the
device plugin (``nvidia.com/gpu``) is not free for Headroom's claims, just as a
pod's memory request is not free RAM (``headroom.ledger.podrequests``). This keeps who
holds what outside the ledger, and works out per device what that leaves:

* A DRA allocation result holds its device by its ``consumedCapacity`` memory
  where the driver publishes consumable memory, else the whole device; one on a
  dynamic MIG partition of a GPU holds the GPU whole, since a GPU in MIG mode runs
  nothing outside its MIG instances, and one on a static MIG device's parent GPU
  holds each of its MIG devices whole (``GpuDevice.held_whole_by``). Results
  are keyed by the device's DRA name ``driver/pool/device`` (``GpuDevice.ref``),
  so a claim seen before its node's ResourceSlices counts as soon as they are read.
* A device-plugin pod bound to a node holds ``k`` whole GPUs there. The API does
  not say which (only the kubelet knows), so they are taken as the devices on
  which least is held (admitted claims plus DRA holdings; ties by device id): a
  device-plugin pod has a GPU to itself, so a consistent cluster gave it devices
  nobody else used. This is an assumption, recomputed from the current holdings.
* No double counting, as for RAM: a pod's own admitted claims on the node it runs
  on offset what it holds outside, each MiB once. A ResourceClaim reserved for a
  pod that holds a claim on the same device counts only beyond that claim's share;
  a device-plugin pod counts only beyond the number of devices its claims hold
  there that no ResourceClaim of it has used as an offset.
* What is held outside a device is never counted as more than the device.

A device held whole (by a device-plugin pod, or by a DRA allocation without
consumed capacity) has no free memory for anyone else, whatever the VRAM ratio;
other holdings are taken off the device's limit, as pods' requests are taken off
a node's RAM limit. Pure: the holders are kept here, the per-device figures are
computed from them, the node's devices and what admitted claims hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from headroom.api.gpus import GpuDevice

PodKey = tuple[str, str]  # (namespace, name)
ClaimKey = tuple[str, str]  # a ResourceClaim's (namespace, name)
#: MiB a DRA allocation consumes on a device; None: the whole device.
Amount = int | None


@dataclass(frozen=True, slots=True)
class Outside:
    """What is held outside Headroom on one device."""

    mb: int  # MiB counted (after the holders' own claims are offset)
    whole: bool  # someone else has the whole device: nothing of it is free
    plugin: bool = False  # held by a device-plugin pod (the emptiest-device guess)


@dataclass(frozen=True, slots=True)
class DraClaim:
    """An allocated ResourceClaim: per device (by DRA name) what it consumes, and the
    pods it is reserved for (whose own claims offset it)."""

    amounts: Mapping[str, Amount]
    pods: frozenset[PodKey] = frozenset()


class ExternalHoldings:
    """Every holder outside the ledger. Changes return the nodes whose devices' figures
    may have moved (the ledger re-reads those nodes)."""

    def __init__(self) -> None:
        self._claims: dict[ClaimKey, DraClaim] = {}
        self._by_ref: dict[str, set[ClaimKey]] = {}  # device's DRA name -> claims on it
        self._ref_nodes: dict[str, str] = {}  # device's DRA name -> its node
        self._node_refs: dict[str, frozenset[str]] = {}  # node -> its devices' DRA names
        self._pods: dict[PodKey, tuple[str, int]] = {}  # device-plugin pod -> (node, GPUs)
        self._pods_by_node: dict[str, dict[PodKey, int]] = {}

    # -- what the ledger tells -------------------------------------------------------------

    def set_devices(self, node: str, devices: Iterable[GpuDevice] | None) -> None:
        """The node's inventory: which DRA names are its devices."""
        for ref in self._node_refs.pop(node, frozenset()):
            if self._ref_nodes.get(ref) == node:
                del self._ref_nodes[ref]
        refs = frozenset(ref for device in devices or () for ref in _refs(device))
        if refs:
            self._node_refs[node] = refs
            for ref in refs:
                self._ref_nodes[ref] = node

    # -- DRA claims --------------------------------------------------------------------------

    def set_claim(self, key: ClaimKey, claim: DraClaim | None) -> set[str]:
        """A claim's allocation (None, or no amounts: it holds nothing)."""
        old = self._claims.pop(key, None)
        moved = self._nodes_of(old.amounts) if old is not None else set()
        if old is not None:
            for ref in old.amounts:
                keys = self._by_ref.get(ref)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._by_ref[ref]
        if claim is not None and claim.amounts:
            self._claims[key] = claim
            for ref in claim.amounts:
                self._by_ref.setdefault(ref, set()).add(key)
            moved |= self._nodes_of(claim.amounts)
        return moved

    def _nodes_of(self, refs: Iterable[str]) -> set[str]:
        return {node for ref in refs if (node := self._ref_nodes.get(ref)) is not None}

    # -- device-plugin pods ------------------------------------------------------------------

    def set_pod(self, key: PodKey, node: str | None, gpus: int) -> set[str]:
        """A pod bound to ``node`` with ``gpus`` device-plugin GPUs (None or 0: it holds none,
        as when it ended or is not bound)."""
        new = (node, gpus) if node is not None and gpus > 0 else None
        old = self._pods.get(key)
        if old == new:
            return set()
        moved: set[str] = set()
        if old is not None:
            del self._pods[key]
            on_node = self._pods_by_node[old[0]]
            del on_node[key]
            if not on_node:
                del self._pods_by_node[old[0]]
            moved.add(old[0])
        if new is not None:
            self._pods[key] = new
            self._pods_by_node.setdefault(new[0], {})[key] = new[1]
            moved.add(new[0])
        return moved

    def pods_with_gpus(self) -> int:
        return len(self._pods)

    def claims_allocated(self) -> int:
        return len(self._claims)

    # -- per device ----------------------------------------------------------------------------

    def plugin_gpus(
        self, node: str, devices: Iterable[GpuDevice], own: Mapping[PodKey, Mapping[str, int]]
    ) -> int:
        """GPUs device-plugin pods on ``node`` hold beyond the devices their own claims hold
        (claims not already spent offsetting the pods' DRA claims)."""
        return self._plugin_wanted(node, self._dra(devices, own)[2])

    def outside(
        self,
        node: str,
        devices: Iterable[GpuDevice],
        held: Mapping[str, int],
        own: Mapping[PodKey, Mapping[str, int]],
    ) -> dict[str, Outside]:
        """Per device id of ``node``, what is held outside Headroom (devices with nothing
        held outside are left out).

        ``held``: device id -> MiB admitted claims hold; ``own``: per pod, device id ->
        MiB its admitted claims on this node hold (what offsets its outside holdings).
        """
        devices = list(devices)
        mb, whole, left = self._dra(devices, own)
        plugin: set[str] = set()
        wanted = self._plugin_wanted(node, left)
        if wanted:
            emptiest = sorted(devices, key=lambda d: (held.get(d.id, 0) + mb.get(d.id, 0), d.id))
            plugin = {d.id for d in emptiest[:wanted]}
        return {
            device.id: Outside(
                device.memory_mb if device.id in plugin else mb.get(device.id, 0),
                device.id in whole or device.id in plugin,
                device.id in plugin,
            )
            for device in devices
            if device.id in mb or device.id in plugin
        }

    def _dra(
        self, devices: Iterable[GpuDevice], own: Mapping[PodKey, Mapping[str, int]]
    ) -> tuple[dict[str, int], set[str], dict[PodKey, dict[str, int]]]:
        """What DRA claims hold per device (never more than the device), the devices they
        hold whole, and what of each pod's own claims is left once spent as offsets: an
        own claim offsets its pod's outside holdings once, not once per holder."""
        mb: dict[str, int] = {}
        whole: set[str] = set()
        left = {pod: dict(assignment) for pod, assignment in own.items()}
        for device in devices:
            for ref in _refs(device):
                for key in sorted(self._by_ref.get(ref, ())):
                    claim = self._claims[key]
                    # Another name (a MIG partition, a MIG parent) holds it whole.
                    amount = claim.amounts[ref] if ref == device.ref else None
                    counted = device.memory_mb if amount is None else amount
                    for pod in sorted(claim.pods):
                        mine = left.get(pod, {})
                        offset = min(counted, mine.get(device.id, 0))
                        if offset:
                            mine[device.id] -= offset
                            counted -= offset
                    mb[device.id] = min(device.memory_mb, mb.get(device.id, 0) + counted)
                    if amount is None:
                        whole.add(device.id)
        return mb, whole, left

    def _plugin_wanted(self, node: str, left: Mapping[PodKey, Mapping[str, int]]) -> int:
        pods = self._pods_by_node.get(node, {})
        return sum(max(0, k - _devices_held(left.get(pod))) for pod, k in pods.items())

    def any_on(self, node: str, devices: Iterable[GpuDevice]) -> bool:
        """Whether anything is held outside on ``node`` (a fast path for the common case)."""
        if node in self._pods_by_node:
            return True
        return bool(self._by_ref) and any(
            ref in self._by_ref for device in devices for ref in _refs(device)
        )


def _refs(device: GpuDevice) -> list[str]:
    """The DRA names an allocation holds ``device`` by: its own, and the others' that
    hold it whole (its dynamic MIG partitions, or a static MIG device's parent)."""
    own = [device.ref] if device.ref else []
    return own + list(device.held_whole_by)


def _devices_held(assignment: Mapping[str, int] | None) -> int:
    return sum(1 for mib in (assignment or {}).values() if mib > 0)
