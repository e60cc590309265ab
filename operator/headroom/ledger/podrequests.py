"""Memory the scheduler already gave away: pods' requests outside the ledger, per node.

kube-scheduler books a pod's memory request on its node whether or not the ledger
knows of it, so a node's RAM counted as if the ledger owned all of its allocatable
memory is booked twice. This keeps, per node, the sum over its bound, running pods
of what they requested *beyond* what they hold in the ledger —
``max(0, request − held claims)`` — so that a pod holding a reservation counts only
by the excess of its request over its claim, and a pod without one counts whole.

Only claims on the node the pod runs on offset its request there: a launcher that
reserves on node Y for workers while itself running on X holds nothing on X, and
its request on X must still count (the scheduler booked it there, not on Y).

Pure and O(1) per change: a pod's request, a claim of it admitted or released.
Each change returns the nodes whose figure moved, for the ledger to apply.
"""

from __future__ import annotations

PodKey = tuple[str, str]  # (namespace, name)


class PodRequests:
    def __init__(self) -> None:
        self._pods: dict[PodKey, tuple[str, int]] = {}  # bound pod -> (node, request MiB)
        self._claims: dict[tuple[PodKey, str], int] = {}  # (pod, node) -> MiB held there
        self._by_node: dict[str, int] = {}  # node -> sum of the excesses

    def on(self, node: str) -> int:
        """MiB requested on ``node`` by pods beyond what they hold in the ledger."""
        return self._by_node.get(node, 0)

    def __len__(self) -> int:
        return len(self._pods)

    def set_pod(self, key: PodKey, node: str, request_mb: int) -> set[str]:
        """A pod bound to ``node`` requests ``request_mb``; the nodes whose figure moved."""
        if self._pods.get(key) == (node, request_mb):
            return set()
        moved = self.remove_pod(key)
        self._pods[key] = (node, request_mb)
        self._shift(node, self._excess(key))
        return moved | {node}

    def remove_pod(self, key: PodKey) -> set[str]:
        """The pod ended, was deleted or is not bound: it requests nothing any more."""
        placed = self._pods.get(key)
        if placed is None:
            return set()
        self._shift(placed[0], -self._excess(key))
        del self._pods[key]
        return {placed[0]}

    def claim(self, key: PodKey, node: str, delta_mb: int) -> set[str]:
        """The pod holds ``delta_mb`` more (or, negative, less) on ``node`` in the ledger."""
        placed = self._pods.get(key)
        here = placed is not None and placed[0] == node
        before = self._excess(key) if here else 0
        held = self._claims.get((key, node), 0) + delta_mb
        if held:
            self._claims[(key, node)] = held
        else:
            self._claims.pop((key, node), None)
        if not here:  # not bound, or bound elsewhere: nothing it requested moves
            return set()
        self._shift(node, self._excess(key) - before)
        return {node}

    def _excess(self, key: PodKey) -> int:
        node, request = self._pods[key]
        return max(0, request - self._claims.get((key, node), 0))

    def _shift(self, node: str, delta: int) -> None:
        total = self._by_node.get(node, 0) + delta
        if total:
            self._by_node[node] = total
        else:
            self._by_node.pop(node, None)
