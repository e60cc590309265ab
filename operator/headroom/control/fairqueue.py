"""A fair queue: round robin over tenants, then over their nodes, first in first out within.

Why: the operator's status writes share one connection pool and one API server.
Served first come first served, a tenant that creates 3,000 reservations at once
puts 3,000 writes in front of another tenant's one, which then waits for all of
them. API Priority and Fairness solves the same problem in the API server by
queueing per flow and serving the flows in turn; this is that idea at the
operator's own scale: a *flow* is a namespace, and within it a *lane* is a node,
so one tenant's backlog on some nodes never delays its own work on an idle one
either. Within a lane, items leave in the order they came.

Pure and synchronous (no I/O, no clock): callers decide when to pop. Each key is
queued at most once; pushing a queued key again keeps its place (a status write
reads the newest truth when it is sent, so a later push adds nothing).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class FairQueue(Generic[K]):
    """Keys queued per (flow, lane); :meth:`pop` serves flows in turn, then lanes in turn."""

    def __init__(self) -> None:
        self._flows: OrderedDict[str, OrderedDict[str, deque[K]]] = OrderedDict()
        self._where: dict[K, tuple[str, str]] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def push(self, flow: str, lane: str, key: K) -> bool:
        """Queue ``key`` last in its lane; False (and no change) if it is queued already."""
        if key in self._where:
            return False
        self._where[key] = (flow, lane)
        lanes = self._flows.setdefault(flow, OrderedDict())
        lanes.setdefault(lane, deque()).append(key)
        return True

    def pop(self) -> K | None:
        """The first key of the next lane of the next flow, or None when empty.

        The flow served goes to the back of the flows, and the lane served to the
        back of its flow's lanes: each flow gets one turn per round, whatever its
        backlog, and each of its lanes one turn per turn of the flow.
        """
        while self._flows:
            flow, lanes = next(iter(self._flows.items()))
            lane, keys = next(iter(lanes.items()))
            key = keys.popleft()
            if keys:
                lanes.move_to_end(lane)
            else:
                del lanes[lane]
            if lanes:
                self._flows.move_to_end(flow)
            else:
                del self._flows[flow]
            if self._where.get(key) == (flow, lane):
                del self._where[key]
                return key
            # else: discarded while queued (a stale place): not served
        return None

    def discard(self, key: K) -> None:
        """Forget ``key``; its place is skipped when reached (O(1) now)."""
        self._where.pop(key, None)

    def flows(self) -> int:
        """How many flows hold a place (discarded places included until reached)."""
        return len(self._flows)
