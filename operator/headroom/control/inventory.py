"""A node's GPU inventory into the ledger, with a Warning when it cannot be read or no
longer holds what was admitted on it.

The inventory (``headroom.objects.gpus``) comes from the Node (HAMi's annotation,
GFD's labels) and from its ResourceSlices, so it is read again whenever either
changes. What the ledger is told:

* no source: no VRAM figure and no devices (VRAM is tracked, not enforced), as
  for any node without GPUs;
* devices: the devices, and their sum as the node's VRAM;
* a pool mid-update (``pending``): what the node had before, unchanged and
  without a Warning; a driver rewriting its slices passes through this;
* problems: no VRAM figure and no devices (not enforced), and a Warning
  ``BadGpuInventory`` on the Node naming each bad value.

Devices that vanish or shrink under admitted claims never move or reclaim them
(the ledger keeps their holdings); a Warning ``OverCommitted`` on the Node says
which devices hold more than they have. Each Warning is posted once per node and
distinct set of messages, as ``BadHeadroomSettings`` is.
"""

from __future__ import annotations

from collections.abc import Collection

from headroom.api.gpus import GpuDevice
from headroom.api.reasons import EventReason, Reason
from headroom.api.refs import ObjectRef
from headroom.control.state import State
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON
from headroom.objects.gpus import gpu_inventory
from headroom.objects.nodes import NodeCapacity

Devices = tuple[GpuDevice, ...] | None


class GpuInventories:
    def __init__(self, state: State, events: EventRecorder, drivers: Collection[str]) -> None:
        self._state, self._events, self._drivers = state, events, tuple(drivers)
        self._applied: dict[str, tuple[int | None, Devices]] = {}  # node -> (vram, devices)
        self._bad: dict[str, tuple[str, ...]] = {}  # node -> problems last warned about
        self._over: dict[str, tuple[str, ...]] = {}  # node -> over-commitments last warned

    def apply(self, ref: ObjectRef, node: JSON, capacity: NodeCapacity) -> None:
        """Read the node's inventory and give the ledger its capacity with it.

        ``node`` needs only its metadata (name, labels, annotations); ``capacity``
        is what :func:`headroom.objects.nodes.node_capacity` read of the same Node.
        """
        name = ref.name
        state = self._state
        names = sorted(state.slices_by_node.get(name, ()))
        inventory = gpu_inventory(node, [state.slices[s] for s in names], self._drivers)
        if inventory.problems and inventory.problems != self._bad.get(name):
            problems = "; ".join(inventory.problems)
            self._events.record(ref, EventReason.BAD_GPU_INVENTORY, problems, "Warning")
        self._bad[name] = inventory.problems
        vram: int | None = None
        devices: Devices = None
        state.set_gpu_source(name, inventory.source.value if inventory.source is not None else None)
        if inventory.devices is not None:
            vram, devices = inventory.total_mb, inventory.devices
        elif inventory.source is not None and inventory.pending and not inventory.problems:
            vram, devices = self._applied.get(name, (None, None))  # keep the last complete one
        if capacity.total_ram_mb is None:  # the whole node is unknown, its devices too
            state.ledger.remove_node(name)
            self._applied.pop(name, None)
            self._over.pop(name, None)
            return
        state.ledger.set_node_capacity(name, capacity.total_ram_mb, vram, capacity.limits)
        state.ledger.set_node_devices(name, devices)
        self._applied[name] = (vram, devices)
        over = tuple(o.message(name) for o in state.ledger.over_committed_devices(name))
        if over and over != self._over.get(name):
            self._events.record(ref, Reason.OVER_COMMITTED, "; ".join(over), "Warning")
        self._over[name] = over

    def forget(self, name: str) -> None:
        """The Node is gone."""
        self._state.set_gpu_source(name, None)
        self._applied.pop(name, None)
        self._bad.pop(name, None)
        self._over.pop(name, None)
