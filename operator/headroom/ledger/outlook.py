"""The outlook of a reservation: what :meth:`Ledger.reserve_or_wait` would decide now.

Asked of the leader's ledger when a Reservation is created (the admission webhook's
warnings), changing nothing: no hold, no wait, no counter. It must say exactly what
the decision would be if nothing else changed first, so it is made of the same
refusal, the same waitable reasons and the same queue position the decision uses
(a property test holds the two together).
"""

from __future__ import annotations

from datetime import datetime

from headroom.api.constants import MAX_MB
from headroom.api.outlook import Outlook, Verdict
from headroom.ledger import devices as device_math
from headroom.ledger.decisions import WAITABLE
from headroom.ledger.entry import Entry
from headroom.ledger.ledger import Ledger


def outlook(
    ledger: Ledger, entry: Entry, now: datetime, until: datetime | None, *, strict: bool = False
) -> Outlook:
    """What deciding ``entry`` now would give: admitted (with the room it leaves), queued
    (with its position), or rejected (with the reason and the numbers)."""
    refusal = ledger.refusal(entry, now, strict=strict)
    if refusal is None:
        return Outlook(Verdict.ADMITTED, _room(ledger, entry), node=entry.node)
    reason, message = refusal
    if until is not None and until > now and reason in WAITABLE:
        return Outlook(
            Verdict.QUEUED,
            message,
            node=entry.node,
            reason=str(reason),
            position=ledger.waiting.place(entry),
        )
    return Outlook(Verdict.REJECTED, message, node=entry.node, reason=str(reason))


def _room(ledger: Ledger, entry: Entry) -> str:
    free = ledger.allocatable_ram(entry.node)
    text = (
        f"{entry.ram_mb} of {free} MiB RAM free"
        if free < MAX_MB
        else f"{entry.ram_mb} MiB RAM, not limited on this node"
    )
    devices = ledger.devices_for(entry)
    if devices:
        text += f"; {entry.vram_mb} MiB VRAM on {device_math.describe(devices)}"
    elif entry.vram_mb:
        text += f"; {entry.vram_mb} MiB VRAM"
    return text
