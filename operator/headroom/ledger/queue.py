"""Reservations waiting for room (``spec.wait``): one queue per node, in creation order.

A waiting reservation holds no capacity and does not count towards the entry
cap. The ledger tries the queue of a node whenever room may have appeared there
(a release, a reclaim, a node that grew or whose limits changed):

- best-effort FIFO (Kueue's default): each waiting reservation, oldest first, is
  admitted if it fits; one that does not fit does not stop the ones behind it;
- strict FIFO: the oldest blocks the ones behind it until it fits or leaves.

Each waits until its deadline (creation + wait; or its hard expiry, if earlier),
kept in a heap so that the sweeper finds the next one without scanning.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from headroom.ledger.entry import Entry


@dataclass(order=True, slots=True)
class Waiting:
    """One waiting reservation; ordered by creation, then by namespace/name.

    creationTimestamp has whole seconds, so ties are common; breaking them by name
    (not by when this process saw them) gives every replica and every restart the
    same order.
    """

    created_at: datetime
    entry_id: str
    sequence: int = field(compare=False)
    entry: Entry = field(compare=False)
    until: datetime = field(compare=False)  # creation + wait
    #: It waits for its quota (refused by it, or behind one that is), not for the node's
    #: room: under strict FIFO it holds back no other tenant's claim on the node.
    for_quota: bool = field(default=False, compare=False)

    @property
    def key(self) -> tuple[datetime, str]:
        """Its place in creation order."""
        return (self.created_at, self.entry_id)


class WaitingView(Protocol):
    """What waits, read-only: the ledger alone queues and dequeues."""

    def __len__(self) -> int: ...
    def __contains__(self, entry_id: str) -> bool: ...
    def get(self, entry_id: str) -> Waiting | None: ...
    def on(self, node: str) -> list[Waiting]: ...
    def by_namespace(self) -> dict[str, tuple[int, int]]: ...
    def nodes(self) -> list[str]: ...
    def position(self, entry_id: str) -> int | None: ...
    def place(self, entry: Entry) -> int: ...
    def next_deadline(self) -> datetime | None: ...
    def totals(self, node: str) -> tuple[int, int]: ...
    def oldest(self) -> datetime | None: ...


class WaitQueues:
    def __init__(self) -> None:
        self._queues: dict[str, list[Waiting]] = {}  # node -> waiting, in order
        self._by_id: dict[str, Waiting] = {}
        self._for_quota: dict[str, Waiting] = {}  # those waiting for their quota, by id
        self._deadlines: list[tuple[datetime, int, str]] = []  # (until or expiry, seq, id)
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._by_id

    def add(
        self,
        entry: Entry,
        until: datetime,
        *,
        for_quota: bool = False,
        expires: datetime | None = None,
    ) -> int:
        """Start waiting (until ``until``, or its expiry: its own, else ``expires``, the one
        its quota gives); returns the entry's position on its node (1 is next). One wait
        per id: a new incarnation of a reservation (the same name, its predecessor's
        deletion not seen yet) takes the place of the old one's, which would otherwise
        stay in its node's queue, ahead of everyone, for ever."""
        self.remove(entry.id)
        waiting = Waiting(entry.created_at, entry.id, next(self._sequence), entry, until, for_quota)
        queue = self._queues.setdefault(entry.node, [])
        bisect.insort(queue, waiting)
        self._by_id[entry.id] = waiting
        if waiting.for_quota:
            self._for_quota[entry.id] = waiting
        expiry = entry.expires_at or expires
        deadline = min(until, expiry) if expiry else until
        heapq.heappush(self._deadlines, (deadline, waiting.sequence, entry.id))
        return queue.index(waiting) + 1

    def place(self, entry: Entry) -> int:
        """The position :meth:`add` would give ``entry`` on its node now (1 is next),
        changing nothing. A wait of the same id would be replaced: it is not counted."""
        key = (entry.created_at, entry.id)
        queue = self._queues.get(entry.node, [])
        before = bisect.bisect_left(queue, key, key=lambda w: w.key)
        replaced = self._by_id.get(entry.id)
        if replaced is not None and replaced.entry.node == entry.node and replaced.key < key:
            before -= 1
        return before + 1

    def remove(self, entry_id: str) -> Entry | None:
        waiting = self._by_id.pop(entry_id, None)
        if waiting is None:
            return None
        self._for_quota.pop(entry_id, None)
        queue = self._queues[waiting.entry.node]
        queue.pop(bisect.bisect_left(queue, waiting))
        if not queue:
            del self._queues[waiting.entry.node]
        return waiting.entry

    def get(self, entry_id: str) -> Waiting | None:
        return self._by_id.get(entry_id)

    def ahead_of(self, entry: Entry, shares: Callable[[str], bool]) -> tuple[int, int]:
        """How many wait on ``entry``'s node, created before it (creation key), for room
        on the node; and how many for a quota of a namespace that ``shares`` one with it.
        Another tenant waiting for its own quota waits for something else."""
        queue = self._queues.get(entry.node, [])
        before = bisect.bisect_left(queue, (entry.created_at, entry.id), key=lambda w: w.key)
        for_room = for_quota = 0
        for waiting in queue[:before]:
            if not waiting.for_quota:
                for_room += 1
            elif shares(waiting.entry_id.split("/", 1)[0]):
                for_quota += 1
        return for_room, for_quota

    @property
    def any_for_quota(self) -> bool:
        return bool(self._for_quota)

    def for_quota(self, shares: Callable[[str], bool] | None = None) -> set[str]:
        """Nodes where someone waits for a quota (of a namespace that ``shares``; None:
        any)."""
        return {
            waiting.entry.node
            for waiting in self._for_quota.values()
            if shares is None or shares(waiting.entry_id.split("/", 1)[0])
        }

    def still_refused(self, entry_id: str, *, for_quota: bool) -> None:
        """A waiting reservation was tried again and still does not fit (for its quota)."""
        waiting = self._by_id.get(entry_id)
        if waiting is None:
            return
        waiting.for_quota = for_quota
        if for_quota:
            self._for_quota[entry_id] = waiting
        else:
            self._for_quota.pop(entry_id, None)

    def on(self, node: str) -> list[Waiting]:
        """The node's queue, oldest first (a copy)."""
        return list(self._queues.get(node, ()))

    def by_namespace(self) -> dict[str, tuple[int, int]]:
        """Per namespace: how many wait, and the RAM they ask for."""
        counts: dict[str, tuple[int, int]] = {}
        for waiting in self._by_id.values():
            namespace = waiting.entry_id.split("/", 1)[0]
            count, ram = counts.get(namespace, (0, 0))
            counts[namespace] = (count + 1, ram + waiting.entry.ram_mb)
        return counts

    def nodes(self) -> list[str]:
        return sorted(self._queues)

    def position(self, entry_id: str) -> int | None:
        waiting = self._by_id.get(entry_id)
        if waiting is None:
            return None
        return bisect.bisect_left(self._queues[waiting.entry.node], waiting) + 1

    def due(self, now: datetime) -> list[Waiting]:
        """Waiting reservations whose wait (or expiry) ran out; removed from their queue."""
        found = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, sequence, entry_id = heapq.heappop(self._deadlines)
            waiting = self._by_id.get(entry_id)
            if waiting is not None and waiting.sequence == sequence:
                self.remove(entry_id)
                found.append(waiting)
        return found

    def set_deadlines(self, expiry: Callable[[Entry], datetime | None]) -> None:
        """The lifetimes quotas give changed: each wait ends at ``expiry`` (an entry's
        own, else the one its quotas give now) or its ``until``, whichever comes first.
        A deadline left as the old lifetime set it would keep a reservation waiting, and
        ahead of others, past the end of a lifetime shortened since."""
        deadlines = []
        for waiting in self._by_id.values():
            ends = expiry(waiting.entry)
            deadline = min(waiting.until, ends) if ends else waiting.until
            deadlines.append((deadline, waiting.sequence, waiting.entry_id))
        heapq.heapify(deadlines)
        self._deadlines = deadlines

    def next_deadline(self) -> datetime | None:
        heap = self._deadlines
        while heap:
            _, sequence, entry_id = heap[0]
            waiting = self._by_id.get(entry_id)
            if waiting is not None and waiting.sequence == sequence:
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def totals(self, node: str) -> tuple[int, int]:
        """(waiting reservations, RAM they ask for) on ``node``."""
        queue = self._queues.get(node, ())
        return len(queue), sum(w.entry.ram_mb for w in queue)

    def oldest(self) -> datetime | None:
        """The creation time of the oldest reservation waiting, on any node (None: none)."""
        return min((queue[0].created_at for queue in self._queues.values()), default=None)
