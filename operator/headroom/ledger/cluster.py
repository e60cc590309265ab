"""The nodes as the ledger knows them, and what holds their memory and GPUs besides it.

The ledger decides on facts the operator's watches feed in: each Node's capacity,
limits, labels and GPU inventory, the memory requests of pods the scheduler bound
(``headroom.ledger.podrequests``) and the GPUs that DRA ResourceClaims and
device-plugin pods hold (``headroom.ledger.external``). Those facts arrive in any
order and in bursts (a resync lists every pod), and each must reach the running
totals of the nodes it moves, and only those, in O(1). Kept here, apart from the
decisions, like kueue's cache apart from its quota arithmetic: nothing here admits,
refuses or keeps time; what changes a node's heartbeat window hands back the
entries whose deadlines moved, for the ledger to watch again.

A node's state (``NodeState``) is made when a Node or an entry on it is first
seen, and the ledger drops it once it is neither known nor holds an entry.
"""

from __future__ import annotations

from collections.abc import Iterable

from headroom.api.gpus import GpuDevice
from headroom.api.limits import Limits
from headroom.ledger.entry import Entry
from headroom.ledger.external import ClaimKey, DraClaim, ExternalHoldings
from headroom.ledger.node import NodeState
from headroom.ledger.podrequests import PodKey, PodRequests


class Cluster:
    """The nodes' states (``nodes``, which the ledger reads and adds entries to), under
    the default ``limits`` unless a Node has its own."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self.nodes: dict[str, NodeState] = {}
        self._pod_requests = PodRequests()
        self._external = ExternalHoldings()  # GPUs held outside Headroom (ledger.external)

    def node(self, name: str) -> NodeState:
        """The node's state, made (capacity unknown) if it had none."""
        state = self.nodes.get(name)
        if state is None:
            state = self.nodes[name] = NodeState(name, self._limits, external=self._external)
            state.pod_requests_mb = self._pod_requests.on(name)
        return state

    def set_capacity(
        self, node: str, total_ram_mb: int, vram_mb: int | None, limits: Limits | None
    ) -> Iterable[Entry]:
        """:meth:`Ledger.set_node_capacity`; the entries whose deadlines moved earlier."""
        state = self.node(node)
        old_window = state.limits.heartbeat_stale_window
        state.total_ram_mb, state.vram_mb = total_ram_mb, vram_mb
        state.limits = limits or self._limits
        state.changed()
        if state.limits.heartbeat_stale_window < old_window:
            return state.entries.values()  # deadlines moved earlier
        return ()

    def set_devices(self, node: str, devices: tuple[GpuDevice, ...] | None) -> None:
        """The node's GPU inventory changed (None: it has none, or it cannot be read).

        Never moves an assignment: what admitted claims hold stays on its device ids,
        and a device gone or shrunk shows in :meth:`NodeState.over_committed_devices`.
        Entries that hold VRAM per device but were admitted without an assignment
        (before the node had an inventory, or before the upgrade that brought devices)
        are placed now, oldest first, so that new claims see them.
        """
        self._external.set_devices(node, devices)
        self.node(node).set_devices(devices)

    def remove(self, node: str) -> Iterable[Entry]:
        """Capacity becomes unknown; the entries whose deadlines moved earlier. Held
        entries stay until released or reclaimed.

        Per-node limits go with the Node object they came from; the entries left
        behind fall back to the defaults (as they would after a restart).
        """
        state = self.nodes.get(node)
        if state is None:
            return ()
        self._external.set_devices(node, None)
        if state.entries:
            old_window = state.limits.heartbeat_stale_window
            state.total_ram_mb = state.vram_mb = state.devices = None
            state.limits = self._limits
            state.changed()
            if state.limits.heartbeat_stale_window < old_window:
                return state.entries.values()
        else:
            del self.nodes[node]
        return ()

    # -- pods placed by the scheduler (headroom.ledger.podrequests) ------------------------

    def set_pod_request(self, key: PodKey, node: str, request_mb: int) -> set[str]:
        """A pod bound to ``node`` requests ``request_mb``; the nodes whose limit moved."""
        return self._apply(self._pod_requests.set_pod(key, node, request_mb))

    def remove_pod_request(self, key: PodKey) -> set[str]:
        return self._apply(self._pod_requests.remove_pod(key))

    def claimed(self, entry: Entry, sign: int) -> None:
        """An entry admitted (``sign`` +1) or gone (-1): its owner pod's request on its
        node counts that much less (or more) beside it."""
        if entry.owner.pod:
            namespace = entry.id.split("/", 1)[0]
            key = (namespace, entry.owner.pod)
            self._apply(self._pod_requests.claim(key, entry.node, sign * entry.ram_mb))

    def bound_pods(self) -> int:
        return len(self._pod_requests)

    def _apply(self, nodes: set[str]) -> set[str]:
        for node in nodes:
            state = self.nodes.get(node)
            if state is not None:
                state.pod_requests_mb = self._pod_requests.on(node)
        return nodes

    # -- GPUs held outside Headroom (headroom.ledger.external) ----------------------------

    def set_resource_claim(self, key: ClaimKey, claim: DraClaim | None) -> set[str]:
        return self._touch(self._external.set_claim(key, claim))

    def set_device_plugin_pod(self, key: PodKey, node: str | None, gpus: int) -> set[str]:
        return self._touch(self._external.set_pod(key, node, gpus))

    def pods_with_gpus(self) -> int:
        return self._external.pods_with_gpus()

    def claims_allocated(self) -> int:
        return self._external.claims_allocated()

    def _touch(self, nodes: set[str]) -> set[str]:
        for node in nodes:
            state = self.nodes.get(node)
            if state is not None:
                state.changed()
        return nodes
