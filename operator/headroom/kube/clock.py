"""Time, injected: the wall clock for statuses and the ledger, a monotonic one for waits.

Production reads the system; the deterministic simulation passes a clock driven by
its virtual-time event loop, so that hours of heartbeats, lease renewals and
retries run in milliseconds and replay exactly from a seed.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall-clock time, aware UTC: what statuses say and the ledger compares."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps: leases, backoff, "how long since"."""
        ...


class SystemClock:
    """The machine's clocks (``time.monotonic`` is also asyncio's loop clock)."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()
