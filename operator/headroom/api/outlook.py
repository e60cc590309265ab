"""What the ledger would do with a reservation created now: its outlook, and its words.

The operator answers every Reservation create (``kubectl apply``, ``--dry-run=server``,
a program's create) with the outlook as admission warnings, before the object is
stored; the asynchronous decision in ``status`` stays the truth. The words are the
API: people read them on kubectl's stderr, and the library and ``kubectl headroom``
read them back (:func:`parse_warning`) from a server-side dry run. So they are made
and parsed here, in one place, and a unit test round-trips every form.

The forms (one warning each)::

    would be admitted on gpu-1: 8192 of 14336 MiB RAM free
    would wait: position 3 on gpu-1 (InsufficientRAM: node gpu-1: requested ...)
    would be rejected InsufficientRAM: node gpu-1: requested 8192 MiB, allocatable ...
    no outlook: this replica does not lead; the decision is left to the operator's ...

Node names are DNS subdomains (no ``:``, no spaces), reasons CamelCase words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    """What would happen: the phase the decision would give, or unknown."""

    ADMITTED = "Admitted"
    QUEUED = "Queued"
    REJECTED = "Rejected"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class Outlook:
    """One reservation's outlook. ``detail``: the numbers (admitted), or the ledger's
    message (queued, rejected), or why there is no outlook (unknown)."""

    verdict: Verdict
    detail: str
    node: str | None = None
    reason: str | None = None
    position: int | None = None

    def warning(self) -> str:
        """The admission warning that says it (:func:`parse_warning` reads it back)."""
        detail = " ".join(self.detail.split())  # one line: warnings are HTTP headers
        if self.verdict is Verdict.ADMITTED:
            return f"would be admitted on {self.node}: {detail}"
        if self.verdict is Verdict.QUEUED:
            return f"would wait: position {self.position} on {self.node} ({self.reason}: {detail})"
        if self.verdict is Verdict.REJECTED:
            return f"would be rejected {self.reason}: {detail}"
        return f"{NO_OUTLOOK}{detail}"


NO_OUTLOOK = "no outlook: "
#: Said beside an outlook that later decisions may change (reservations created
#: earlier, not decided yet, are decided first).
CAVEAT = "outlook may change: "

_ADMITTED = re.compile(r"would be admitted on (?P<node>[^\s:]+): (?P<detail>.*)", re.DOTALL)
_QUEUED = re.compile(
    r"would wait: position (?P<position>\d+) on (?P<node>[^\s:]+) "
    r"\((?P<reason>[A-Za-z]+): (?P<detail>.*)\)",
    re.DOTALL,
)
_REJECTED = re.compile(r"would be rejected (?P<reason>[A-Za-z]+): (?P<detail>.*)", re.DOTALL)


def parse_warning(text: str) -> Outlook | None:
    """The outlook a warning says, or None if it is not one (another webhook's, a caveat)."""
    if match := _ADMITTED.fullmatch(text):
        return Outlook(Verdict.ADMITTED, match["detail"], node=match["node"])
    if match := _QUEUED.fullmatch(text):
        return Outlook(
            Verdict.QUEUED,
            match["detail"],
            node=match["node"],
            reason=match["reason"],
            position=int(match["position"]),
        )
    if match := _REJECTED.fullmatch(text):
        return Outlook(Verdict.REJECTED, match["detail"], reason=match["reason"])
    if text.startswith(NO_OUTLOOK):
        return Outlook(Verdict.UNKNOWN, text[len(NO_OUTLOOK) :])
    return None
