"""Per-node aggregates, kept incrementally so admission is O(1).

The limit is ``floor(total × ratio) − system reserve`` in integer MiB, with the
ratio an exact Fraction: the only rounding anywhere is that one floor, and it
rounds against admission.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from headroom.api.limits import Limits
from headroom.ledger.entry import Entry


@dataclass(slots=True)
class NodeState:
    name: str
    limits: Limits
    total_ram_mb: int | None = None  # None: capacity unknown
    vram_mb: int | None = None  # None: VRAM unknown, tracked but not enforced
    reserved_ram_mb: int = 0
    pod_requests_mb: int = 0  # requested by pods beyond their claims (headroom.ledger.pods)
    reserved_vram_mb: int = 0
    entries: dict[str, Entry] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        return self.total_ram_mb is not None

    def limit_ram_mb(self) -> int | None:
        """Most RAM that may be reserved: ``floor(total × ratio) − reserve − memory pods
        requested beyond their claims``; None when unlimited (ratio 0) or unknown."""
        if self.total_ram_mb is None or self.limits.unlimited:
            return None
        ratio = self.limits.max_overcommit_ratio
        scaled = self.total_ram_mb * ratio.numerator // ratio.denominator
        return max(scaled - self.limits.system_reserve_mb - self.pod_requests_mb, 0)

    def add(self, entry: Entry) -> None:
        self.entries[entry.id] = entry
        self.reserved_ram_mb += entry.ram_mb
        self.reserved_vram_mb += entry.vram_mb

    def remove(self, entry_id: str) -> Entry:
        entry = self.entries.pop(entry_id)
        self.reserved_ram_mb -= entry.ram_mb
        self.reserved_vram_mb -= entry.vram_mb
        return entry


def format_ratio(ratio: Fraction) -> str:
    """Exact decimal when it terminates (``1.5``), else ``n/d``."""
    if ratio.denominator == 1:
        return str(ratio.numerator)
    denominator = ratio.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    if denominator != 1:
        return f"{ratio.numerator}/{ratio.denominator}"
    digits = 0
    while (ratio * 10**digits).denominator != 1:
        digits += 1
    scaled = ratio.numerator * 10**digits // ratio.denominator
    text = str(scaled).rjust(digits + 1, "0")
    return f"{text[:-digits]}.{text[-digits:]}"
