"""When each held entry must be looked at again: the reclaim deadlines, in one heap.

Kept apart from the ledger's arithmetic because it is the only part that keeps
time: what a node holds and what fits never depend on it, and a heartbeat, the
commonest call, must not cost a heap operation. So a heartbeat only moves the
entry's ``last_heartbeat``; the heap keeps one *live* item per watched entry
(the one whose sequence ``_live`` records), and a popped item whose entry has
heartbeated since is pushed back at its new deadline. Released entries leave
their items behind, dropped when popped or when the heap is compacted (once it
holds more than twice the live items): O(log n) per entry examined, and only
entries whose recorded deadline has passed are examined.

Reclaiming is two steps for the operator: :meth:`Deadlines.due` reports entries
whose deadline passed but keeps holding them, so that the operator can confirm
against the API that the owner is really silent before it gives the capacity
away (a heartbeat it missed must not cost a live reservation); then the ledger
either reclaims the entry or spares it (a heartbeat, or a postponement, watches
it again). An entry that is due has no live item, so it is reported once.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from datetime import datetime

from headroom.api.reasons import Reason
from headroom.ledger.decisions import Reclaimed
from headroom.ledger.entry import Entry
from headroom.ledger.node import NodeState


class Deadlines:
    """The deadlines of the ledger's held entries (``entries``, on ``nodes``: the
    ledger's own mappings, read here, changed only by the ledger)."""

    def __init__(self, entries: Mapping[str, Entry], nodes: Mapping[str, NodeState]) -> None:
        self._entries = entries
        self._nodes = nodes
        self._heap: list[tuple[datetime, int, str]] = []
        self._live: dict[str, int] = {}  # entry id -> sequence of its one live heap item
        self._sequence = itertools.count()

    def __contains__(self, entry_id: str) -> bool:
        """Whether the entry's deadline is watched: not once it was reported due."""
        return entry_id in self._live

    def schedule(self, entry: Entry, at: datetime | None = None) -> None:
        """Watch ``entry`` until ``at`` (by default its deadline under its node's
        heartbeat window), instead of any earlier time it was watched until."""
        if len(self._heap) > 2 * len(self._live) + 1024:
            self._compact()
        sequence = next(self._sequence)
        self._live[entry.id] = sequence
        if at is None:
            at = entry.deadline(self._nodes[entry.node].limits.heartbeat_stale_window)
        heapq.heappush(self._heap, (at, sequence, entry.id))

    def forget(self, entry_id: str) -> None:
        """The entry is held no more: its item, dead now, is dropped when it surfaces."""
        self._live.pop(entry_id, None)

    def _compact(self) -> None:
        """Drop heap items of released entries (amortized O(1) per reserve)."""
        self._heap = [item for item in self._heap if self._live.get(item[2]) == item[1]]
        heapq.heapify(self._heap)

    def due(self, now: datetime) -> list[Reclaimed]:
        """Entries stale or expired at ``now``, still held (expiry wins when both apply);
        each is watched no more until it is scheduled again."""
        found: list[Reclaimed] = []
        not_yet: list[Entry] = []  # rescheduled after the loop, so the loop always ends
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, sequence, entry_id = heapq.heappop(heap)
            if self._live.get(entry_id) != sequence:
                continue  # released, rescheduled by a newer item, or already due
            entry = self._entries[entry_id]
            window = self._nodes[entry.node].limits.heartbeat_stale_window
            if entry.is_expired(now):
                reason = Reason.EXPIRED
                message = f"expired at {entry.expires_at.isoformat() if entry.expires_at else ''}"
            elif entry.is_stale(now, window):
                reason = Reason.HEARTBEAT_STALE
                message = (
                    f"no heartbeat since {entry.last_heartbeat.isoformat()}, "
                    f"window {int(window.total_seconds())}s"
                )
            else:
                not_yet.append(entry)  # heartbeated since it was scheduled
                continue
            del self._live[entry_id]
            found.append(Reclaimed(entry, reason, message))
        for entry in not_yet:
            self.schedule(entry)
        return found

    def earliest(self) -> datetime | None:
        """The earliest deadline watched (None: none is); dead items on top are dropped."""
        heap = self._heap
        while heap and self._live.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None
