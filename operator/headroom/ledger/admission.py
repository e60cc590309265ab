"""Deciding one claim: admit it, queue it, or refuse it; or hold a running pod's anyway.

The three ways a claim comes to the ledger differ only in what happens after the
same refusal (``headroom.ledger.refusals``): a reservation (:meth:`Ledger.reserve`)
is admitted or refused; one with a wait (:meth:`Ledger.reserve_or_wait`) may queue
instead; a pod the scheduler already placed (:meth:`Ledger.record`) runs whatever
the ledger says, so it is held even over the limit and said to be over-committed.
Admitting gives the claim its devices (binpack or spread over the node's GPUs)
and, without an expiry of its own, the lifetime its quota gives; holding it is
``headroom.ledger.holdings``'s. Every refusal is counted, in ``failures``.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from headroom.api.reasons import Reason
from headroom.ledger import devices as device_math
from headroom.ledger.cluster import Cluster
from headroom.ledger.decisions import QUOTA_WAITABLE, WAITABLE, Decision
from headroom.ledger.entry import Entry
from headroom.ledger.holdings import Holdings
from headroom.ledger.queue import WaitQueues
from headroom.ledger.quotas import Quotas
from headroom.ledger.refusals import Refusals
from headroom.ledger.waiters import Waiters

#: Refusals a pod already running on the node is held despite: over-committed.
_RUNS_ANYWAY = (
    Reason.INSUFFICIENT_RAM,
    Reason.INSUFFICIENT_VRAM,
    Reason.TOO_MANY_ENTRIES,
    Reason.ALREADY_EXPIRED,
    Reason.NODE_UNKNOWN,
    *QUOTA_WAITABLE,
    Reason.NODE_NOT_ALLOWED,
    Reason.LIFETIME_TOO_LONG,
    Reason.WAIT_TOO_LONG,
)


class Admission:
    """Decisions on claims to the ``cluster``'s nodes, held in ``holdings``."""

    def __init__(
        self,
        cluster: Cluster,
        holdings: Holdings,
        quotas: Quotas,
        refusals: Refusals,
        waiting: WaitQueues,
        waiters: Waiters,
        failures: Counter[Reason],
    ) -> None:
        self._cluster = cluster
        self._holdings = holdings
        self._quotas = quotas
        self._refusals = refusals
        self._waiting = waiting
        self._waiters = waiters
        self._failures = failures

    def reserve(self, entry: Entry, now: datetime) -> Decision:
        """:meth:`Ledger.reserve`."""
        refusal = self._refusals.of(entry, now)
        if refusal is not None:
            reason, message = refusal
            if not entry.provisional:
                self._failures[reason] += 1
            return Decision(False, reason, message, entry)
        state = self._cluster.node(entry.node)
        chosen = state.choose(entry) if state.on_devices(entry) else {}
        assert isinstance(chosen, dict), "a claim that fits has devices"
        entry.devices = chosen
        self._give_expiry(entry)
        # Admitted under its id, it waits no more: nor does a predecessor of the same name
        # (a replaced reservation whose deletion is not seen yet), which would otherwise be
        # refused DuplicateID at every pass over the queue.
        self._waiting.remove(entry.id)
        self._holdings.add(state, entry)
        limit = state.limit_ram_mb()
        message = (
            f"node {entry.node}: reserved {entry.ram_mb} MiB RAM"
            + (f" and {entry.vram_mb} MiB VRAM" if entry.vram_mb else "")
            + (f" on {device_math.describe(chosen)}" if chosen else "")
            + (
                f"; {limit - state.reserved_ram_mb} MiB still allocatable"
                if limit is not None
                else "; RAM not limited on this node"
            )
        )
        return Decision(True, Reason.FITS, message, entry)

    def reserve_or_wait(
        self, entry: Entry, now: datetime, until: datetime | None, strict: bool
    ) -> Decision:
        """:meth:`Ledger.reserve_or_wait`: under strict FIFO nothing goes ahead of a
        reservation already waiting on the node, so a newcomer waits behind it (or,
        without a wait, is refused)."""
        refusal, for_room = self._refusals.admission(entry, now, strict)
        if refusal is None:
            return self.reserve(entry, now)
        reason, message = refusal
        if until is not None and until > now and reason in WAITABLE:
            position = self._waiters.add(
                entry,
                until,
                # Refused by its quota, or waiting only behind others of its quota.
                for_quota=reason in QUOTA_WAITABLE
                or (reason == Reason.WAITERS_AHEAD and not for_room),
            )
            return Decision(
                False, reason, f"{message}; waits until {until.isoformat()}", entry, position
            )
        self._failures[reason] += 1
        return Decision(False, reason, message, entry)

    def record(self, entry: Entry, now: datetime) -> Decision:
        """:meth:`Ledger.record`: never refused for room (the pod runs there whatever the
        ledger says): admitted with reason Fits when it fits, OverCommitted with the
        numbers when it does not, so the node's summary shows the over-commitment
        instead of hiding it. What is wrong with the claim itself (a duplicate id, a bad
        size) is refused as usual."""
        refusal = self._refusals.of(entry, now)
        if refusal is None:
            return self.reserve(entry, now)
        reason, message = refusal
        if reason not in _RUNS_ANYWAY:
            self._failures[reason] += 1
            return Decision(False, reason, message, entry)
        state = self._cluster.node(entry.node)
        entry.devices = state.forced_assignment(entry) if state.on_devices(entry) else {}
        self._give_expiry(entry)
        self._holdings.add(state, entry)
        return Decision(
            True, Reason.OVER_COMMITTED, f"already running there, over the limit: {message}", entry
        )

    def _give_expiry(self, entry: Entry) -> None:
        """An entry admitted without an expiry lives as long as its quota gives."""
        if entry.expires_at is None:
            entry.expires_at = entry.given_expiry = self._quotas.expiry(entry)
