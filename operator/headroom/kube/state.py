"""The operator's in-memory state: the ledger plus what ties it to API objects.

The ledger knows entries by id (``namespace/name``); this adds what only the
operator needs: which incarnation (uid) of the object an entry belongs to, which
owner pod heartbeats it, which rejections were already decided, and which nodes
need their NodeHeadroom rewritten. Everything here is synchronous: each change
happens between two ``await`` points, so no other task ever sees it half done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from headroom.api.limits import Limits
from headroom.kube.stamp import Stamper
from headroom.ledger import Entry, Ledger


@dataclass(slots=True)
class Tracked:
    """An admitted reservation's link to its API object."""

    uid: str
    namespace: str
    name: str
    node: str
    pod: str | None
    written_heartbeat: datetime | None
    bad_heartbeat: str | None = None
    tracked_at: float = field(default_factory=time.monotonic)


class State:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.ledger = Ledger(limits)
        self.tracked: dict[str, Tracked] = {}
        self.rejected: set[str] = set()  # uids decided Rejected (or found invalid)
        self.pod_owned: dict[tuple[str, str], set[str]] = {}  # (namespace, pod) -> ids
        self.node_uids: dict[str, str] = {}
        self.dirty_nodes: set[str] = set()
        self.on_admitted: Callable[[Entry], None] = lambda entry: None
        self.stamper = Stamper(None)  # replaced at start when a decision key is configured

    def track(self, entry: Entry, tracked: Tracked) -> None:
        """Link an entry the ledger just admitted (or rebuilt) to its object."""
        self.tracked[entry.id] = tracked
        if tracked.pod:
            self.pod_owned.setdefault((tracked.namespace, tracked.pod), set()).add(entry.id)
        self.dirty_nodes.add(entry.node)
        self.on_admitted(entry)

    def untrack(self, entry_id: str) -> Tracked | None:
        """Drop the link (the ledger entry is already gone or is being removed)."""
        tracked = self.tracked.pop(entry_id, None)
        if tracked is not None:
            self.dirty_nodes.add(tracked.node)
            if tracked.pod:
                owned = self.pod_owned.get((tracked.namespace, tracked.pod))
                if owned is not None:
                    owned.discard(entry_id)
                    if not owned:
                        del self.pod_owned[(tracked.namespace, tracked.pod)]
        return tracked

    def holds(self, entry_id: str, uid: str) -> bool:
        """Whether the ledger holds this very incarnation of the reservation."""
        tracked = self.tracked.get(entry_id)
        return tracked is not None and tracked.uid == uid

    def release(self, entry_id: str, uid: str | None = None) -> Tracked | None:
        """Return an admitted entry's capacity; ``uid`` guards against a namesake."""
        tracked = self.tracked.get(entry_id)
        if tracked is None or (uid is not None and tracked.uid != uid):
            return None
        self.ledger.release(entry_id)
        return self.untrack(entry_id)
