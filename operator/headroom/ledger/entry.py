"""A reservation as the ledger sees it (seed: Entry, IsExpired, IsStale)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from headroom.api.constants import MAX_TIME

#: The deadline of an entry that can neither go stale nor expire.
NEVER = MAX_TIME


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds a reservation (seed: OwnerExecID, OwnerSurface, OwnerPID, OwnerOrigin)."""

    exec_id: str | None = None
    surface: str | None = None
    pid: int | None = None
    origin: str | None = None
    pod: str | None = None


@dataclass(slots=True)
class Entry:
    """One admitted (or requested) reservation. Times are timezone-aware UTC."""

    id: str
    node: str
    ram_mb: int
    created_at: datetime
    last_heartbeat: datetime
    vram_mb: int = 0
    expires_at: datetime | None = None
    owner: Owner = field(default_factory=Owner)
    description: str = ""
    wait_until: datetime | None = None  # may wait for room until then (creation + spec.wait)
    #: Alive as long as its pod (spec.liveness Pod): never stale; released when the pod ends.
    pod_lifetime: bool = False
    #: Over how many GPU devices its VRAM is spread (spec.gpus); 0: the node's sum.
    gpus: int = 1
    #: Its assignment once admitted on a node with devices: device id -> MiB held there.
    devices: dict[str, int] = field(default_factory=dict)
    #: The expiry its namespace's quota gave it (spec.expiresAt absent; status.expiresAt).
    given_expiry: datetime | None = None
    #: A create's room held while it is reviewed (a strict namespace's outlook): it counts
    #: for the node and the quotas as any entry, but in none of the process's counters
    #: (reserved, released, failures): its reservation's own decision is what they count.
    provisional: bool = False

    def is_expired(self, now: datetime) -> bool:
        """The entry has a hard expiry and it has passed."""
        return self.expires_at is not None and self.expires_at <= now

    def is_stale(self, now: datetime, window: timedelta) -> bool:
        """The last heartbeat is older than ``window`` (never, for a pod's lifetime)."""
        return not self.pod_lifetime and now - self.last_heartbeat > window

    def deadline(self, window: timedelta) -> datetime:
        """The first moment the entry is stale or expired, whichever comes first."""
        if self.pod_lifetime:
            return self.expires_at or NEVER
        stale_at = self.last_heartbeat + window
        if self.expires_at is not None and self.expires_at < stale_at:
            return self.expires_at
        return stale_at
