"""The pure ledger: admission arithmetic with no I/O and no clock.

Everything the operator decides is decided here, from integers and exact
fractions, with ``now`` passed in, so it can be proven by property tests and
measured in microseconds. See ``ledger.py`` for the costs.
"""

from headroom.ledger.decisions import Decision, Reclaimed, RestoreResult, UnknownEntryError
from headroom.ledger.entry import Entry, Owner
from headroom.ledger.ledger import Ledger
from headroom.ledger.ratio import format_ratio
from headroom.ledger.summary import ClusterSummary, Metrics, NodeSummary

__all__ = [
    "ClusterSummary",
    "Decision",
    "Entry",
    "Ledger",
    "Metrics",
    "NodeSummary",
    "Owner",
    "Reclaimed",
    "RestoreResult",
    "UnknownEntryError",
    "format_ratio",
]
