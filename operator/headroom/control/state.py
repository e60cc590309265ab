"""The operator's in-memory truth: the ledger, and what it decided about each object.

The ledger knows admitted entries by id (``namespace/name``). A :class:`Record`
adds, per Reservation *incarnation* (uid), what only the operator knows: the
decision its status must carry (admitted, rejected or reclaimed), whether the
object is known to carry it yet, which owner pod heartbeats it, and the last
heartbeat values it saw. Records live as long as their object; that is what
makes every path level-triggered — an object is always compared with its record.

Everything here is synchronous: each change happens between two ``await``
points, so no other task ever sees it half done.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from headroom.api.limits import Limits
from headroom.api.reasons import Phase
from headroom.ledger import Ledger
from headroom.objects.stamp import Stamper
from headroom.objects.status import Decision

RESERVATION, POD = "reservation", "pod"  # heartbeat sources


@dataclass(slots=True)
class Record:
    """What this operator decided about one Reservation incarnation."""

    uid: str
    namespace: str
    name: str
    node: str
    decision: Decision
    pod: str | None = None
    changed_at: float = 0.0  # monotonic time ``decision`` was last set
    confirmed: bool = False  # the object is known to carry ``decision``
    announced: bool = False  # its Event was posted and its metrics counted
    beats: dict[str, str | None] = field(default_factory=dict)  # source -> last value seen
    bad_beat: str | None = None  # the last malformed heartbeat reported, once
    written_beat: datetime | None = None  # the lastHeartbeat last put in status
    seen_at: float = 0.0  # monotonic time the record was made (resync's guard)
    confirmed_at: float = 0.0  # monotonic time the object was last seen carrying it
    seen_monotonic: float = 0.0  # when the object was first seen (admission latency)

    @property
    def entry_id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def held(self) -> bool:
        return self.decision.phase == Phase.ADMITTED


class State:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.ledger = Ledger(limits)
        self.records: dict[str, Record] = {}  # uid -> record
        self.holders: dict[str, str] = {}  # ledger entry id -> uid of the incarnation held
        self.pods: dict[tuple[str, str], str | None] = {}  # labelled pods -> heartbeat value
        self.owned: dict[tuple[str, str], set[str]] = {}  # (namespace, pod) -> held uids
        self.node_uids: dict[str, str] = {}
        self.dirty_nodes: set[str] = set()
        self.stamper = Stamper(None)  # replaced at start when a decision key is configured

    # -- records ---------------------------------------------------------------------------

    def remember(self, record: Record) -> None:
        """Keep a decision; an admitted one must already be in the ledger."""
        self.records[record.uid] = record
        if record.held:
            self.holders[record.entry_id] = record.uid
            self.dirty_nodes.add(record.node)
            if record.pod:
                self.owned.setdefault((record.namespace, record.pod), set()).add(record.uid)

    def held_record(self, entry_id: str) -> Record | None:
        uid = self.holders.get(entry_id)
        return self.records.get(uid) if uid is not None else None

    def unhold(self, record: Record) -> None:
        """Drop the ledger-side links of an admitted record (its entry already left the ledger)."""
        if self.holders.get(record.entry_id) == record.uid:
            del self.holders[record.entry_id]
        self.dirty_nodes.add(record.node)
        if record.pod:
            key = (record.namespace, record.pod)
            owned = self.owned.get(key)
            if owned is not None:
                owned.discard(record.uid)
                if not owned:
                    del self.owned[key]

    def holds(self, record: Record) -> bool:
        """Whether the ledger holds this incarnation's capacity (admitted, or reclaimed
        but not yet shown as Reclaimed on its object)."""
        return self.holders.get(record.entry_id) == record.uid

    def release(self, record: Record) -> None:
        """Return a record's capacity, if the ledger holds it (its object is gone)."""
        if self.holds(record):
            self.ledger.release(record.entry_id)
            self.unhold(record)

    def forget(self, uid: str) -> Record | None:
        """The object is gone: release what it held and drop its record."""
        record = self.records.pop(uid, None)
        if record is not None:
            self.release(record)
        return record

    def held_records(self) -> Iterator[Record]:
        for uid in list(self.holders.values()):
            record = self.records.get(uid)
            if record is not None:
                yield record
