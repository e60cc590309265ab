"""What the ledger holds, and where each held entry counts: the accounting of admissions.

Deciding whether an entry may be held is ``admission``'s; once held, it counts in
several places at once, and they must move together or the ledger lies: on its
node (``NodeState``), against its namespace's quotas, against its owner pod's
memory request on that node (``Cluster.claimed``), and in the reclaim deadlines.
This is the one place where an entry is added to or taken from all of them, like
kueue's cache assuming and forgetting a workload apart from the scheduler that
admitted it; and where the counters of what came and went are kept.

Also here: the claims of pods that run with no entry held for them yet (their
reservation was missed or not decided), which count against their namespace's
quotas until their own entry replaces them.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from headroom.api.reasons import Reason
from headroom.ledger.cluster import Cluster
from headroom.ledger.deadlines import Deadlines
from headroom.ledger.decisions import UnknownEntryError
from headroom.ledger.entry import Entry
from headroom.ledger.node import NodeState
from headroom.ledger.quotas import Quotas
from headroom.ledger.summary import Metrics


class Holdings:
    """The held ``entries`` (by id) on the ``cluster``'s nodes, under ``quotas``, their
    ``deadlines``, and the pods' ``running`` claims; the ledger reads the mappings and
    asks the deadlines what is due, and changes them all here."""

    def __init__(self, cluster: Cluster, quotas: Quotas) -> None:
        self._cluster = cluster
        self._nodes = cluster.nodes
        self._quotas = quotas
        self.entries: dict[str, Entry] = {}
        self.deadlines = Deadlines(self.entries, self._nodes)  # (ledger.deadlines)
        #: Claims of pods that run without an entry here yet (entry id -> the claim):
        #: counted against their namespace's quotas until their own entry replaces them.
        self.running: dict[str, Entry] = {}
        self._reserved_mb = self._released_mb = self._reclaimed_mb = 0
        self._restored_mb = 0  # held again at a start, not admitted by this ledger

    def add(self, state: NodeState, entry: Entry, *, restored: bool = False) -> None:
        """Hold ``entry`` on its node's ``state``, admitted now or (``restored``) before a
        start."""
        self.set_running_claim(entry.id, None)  # its entry counts it from now on
        state.add(entry)
        self._quotas.add(entry)
        self.entries[entry.id] = entry
        if restored:
            self._restored_mb += entry.ram_mb
        else:
            self._reserved_mb += _counted_mb(entry)
        self.deadlines.schedule(entry)
        self._cluster.claimed(entry, +1)

    def release(self, entry_id: str) -> Entry:
        """:meth:`Ledger.release`."""
        entry = self._remove(entry_id)
        self._released_mb += _counted_mb(entry)
        return entry

    def reclaim(self, entry_id: str) -> Entry:
        """:meth:`Ledger.reclaim_entry`."""
        entry = self._remove(entry_id)
        self._reclaimed_mb += _counted_mb(entry)
        return entry

    def _remove(self, entry_id: str) -> Entry:
        if entry_id not in self.entries:
            raise UnknownEntryError(entry_id)
        entry = self.entries.pop(entry_id)
        self.deadlines.forget(entry_id)
        state = self._nodes[entry.node]
        state.remove(entry_id)
        self._quotas.remove(entry)
        self._cluster.claimed(entry, -1)
        if not state.entries and not state.known:
            del self._nodes[entry.node]
        return entry

    def heartbeat(self, entry_id: str, at: datetime) -> Entry:
        """:meth:`Ledger.heartbeat`."""
        entry = self.entries.get(entry_id)
        if entry is None:
            raise UnknownEntryError(entry_id)
        if at > entry.last_heartbeat:
            entry.last_heartbeat = at
        if entry_id not in self.deadlines:  # it was due: watch its deadline again
            self.deadlines.schedule(entry)
        return entry

    def postpone(self, entry_id: str, until: datetime) -> None:
        """:meth:`Ledger.postpone`."""
        entry = self.entries.get(entry_id)
        if entry is None:
            raise UnknownEntryError(entry_id)
        self.deadlines.schedule(entry, at=until)

    def set_running_claim(self, entry_id: str, claim: Entry | None) -> bool:
        """A pod runs on a claim the ledger holds no entry ``entry_id`` for yet (its
        reservation not made or not decided: a webhook missed it, the operator was
        down): counted against its namespace's quotas, so that nothing is admitted into
        room the pod already uses, until that entry replaces it (:meth:`Ledger.record`)
        or ``claim`` is None (it ended, went, or its reservation was decided). Never
        counted against its own entry's decision. Whether its namespace's usage moved."""
        if claim is not None and entry_id in self.entries:
            claim = None  # its entry is held: that counts it
        before = self.running.pop(entry_id, None)
        if before is not None:
            self._quotas.remove(before)
        if claim is not None:
            self.running[entry_id] = claim
            self._quotas.add(claim)
        return _usage(before) != _usage(claim)

    def metrics(self, failures: Counter[Reason]) -> Metrics:
        """:meth:`Ledger.metrics`, with the ledger's count of refusals."""
        return Metrics(
            reserved_mb=self._reserved_mb,
            released_mb=self._released_mb,
            reclaimed_mb=self._reclaimed_mb,
            restored_mb=self._restored_mb,
            reserve_failures=sum(failures.values()),
            active_entries=len(self.entries),
            active_mb=sum(s.reserved_ram_mb for s in self._nodes.values()),
            failures_by_reason=dict(failures),
        )


def _usage(entry: Entry | None) -> tuple[int, int] | None:
    return (entry.ram_mb, entry.vram_mb) if entry is not None else None


def _counted_mb(entry: Entry) -> int:
    """What ``entry`` adds to the process's MiB counters: a provisional hold nothing (its
    reservation's own decision counts it)."""
    return 0 if entry.provisional else entry.ram_mb
