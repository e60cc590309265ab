"""What the ledger answers: decisions, reclaims and restore results (plain values).

Kept apart from the modules that compute them (``admission``, ``waiters``,
``deadlines``, ``restore``) so that callers and tests can name the answers without
the machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headroom.api.reasons import Reason
from headroom.ledger.entry import Entry


class UnknownEntryError(LookupError):
    """No active entry has this id (never reserved, released or reclaimed)."""


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    reason: Reason
    message: str
    entry: Entry
    position: int | None = None  # not admitted, but waiting: its place in its node's queue

    @property
    def queued(self) -> bool:
        return self.position is not None


#: Refusals made by a namespace's quota: waited out in the quota, not on the node, so
#: (under strict FIFO) they hold back no one else's claim on the node.
QUOTA_WAITABLE = frozenset({Reason.QUOTA_EXCEEDED, Reason.NO_QUOTA, Reason.QUOTA_INVALID})
#: Every refusal a quota makes. A waiter gets a final one when its quota changes under it
#: (a nodeSelector, maxLifetime or maxWait it no longer passes): it stays until its wait
#: runs out or the quota lets it go again, and meanwhile, like one waiting for its
#: quota's room, it holds back no one else's claim on the node.
QUOTA_REASONS = QUOTA_WAITABLE | {
    Reason.NODE_NOT_ALLOWED,
    Reason.LIFETIME_TOO_LONG,
    Reason.WAIT_TOO_LONG,
}
#: Refusals a reservation may wait out (room may appear); the others are final.
WAITABLE = QUOTA_WAITABLE | {
    Reason.NODE_UNKNOWN,
    Reason.INSUFFICIENT_RAM,
    Reason.INSUFFICIENT_VRAM,
    Reason.TOO_MANY_ENTRIES,
    Reason.WAITERS_AHEAD,
}


@dataclass(frozen=True, slots=True)
class Reclaimed:
    entry: Entry
    reason: Reason  # HEARTBEAT_STALE or EXPIRED
    message: str


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """Entries restored at start-up that no longer fit their node; kept, not dropped."""

    over_committed: list[Entry] = field(default_factory=list)
