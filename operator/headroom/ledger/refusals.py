"""Why a claim is refused: the one chain of checks every decision and every question uses.

A reservation decided (:meth:`Ledger.reserve`), one that may wait
(:meth:`Ledger.reserve_or_wait`), one only asked about (the webhook's outlook,
the scheduler's filter over a thousand nodes) and a waiter tried again must be
refused for the same reason with the same words, or the operator would promise
what it then refuses. So the order lives here once: what is wrong with the entry
wherever it goes (its size, its id, its expiry); then its node (unknown: no
room); then its namespace's quotas and the lifetime they give; then the node's
room (entry cap, RAM, VRAM, devices after what is held outside Headroom); and,
under strict FIFO, the waiters ahead of it.

Read-only: nothing here admits, queues or counts. The one exception is brief:
a pod's running claim (:meth:`Ledger.set_running_claim`) is taken out of its
quotas while its own entry is asked about, and put back, so that a pod never
competes with itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import partial

from headroom.api.reasons import Reason
from headroom.ledger.decisions import WAITABLE
from headroom.ledger.entry import Entry
from headroom.ledger.node import NodeState
from headroom.ledger.queue import WaitQueues
from headroom.ledger.quotas import Quotas, namespace_of

Refusal = tuple[Reason, str]


class Refusals:
    """The refusals of the ledger whose held ``entries``, ``nodes``, ``quotas``, pods'
    ``running`` claims and ``waiting`` queues these are (read here, changed only by
    the ledger)."""

    def __init__(
        self,
        entries: Mapping[str, Entry],
        nodes: Mapping[str, NodeState],
        quotas: Quotas,
        running: Mapping[str, Entry],
        waiting: WaitQueues,
    ) -> None:
        self._entries = entries
        self._nodes = nodes
        self._quotas = quotas
        self._running = running
        self._waiting = waiting

    def of(self, entry: Entry, now: datetime) -> Refusal | None:
        """Why ``entry`` is refused now (waiters ahead aside), or None if it fits."""
        refusal = self._entry_refusal(entry, now)
        if refusal is not None:
            return refusal
        state = self._nodes.get(entry.node)
        if state is None or not state.known:
            return _node_unknown(entry.node)
        refusal = self._quota_refusal(entry, now)
        if refusal is not None:
            return refusal
        return state.room_refusal(entry)

    def admission(self, entry: Entry, now: datetime, strict: bool) -> tuple[Refusal | None, int]:
        """Why ``entry`` is refused now (waiters ahead under strict FIFO included), and how
        many of those waiters wait for the node's room (not only for their quota's)."""
        return self._behind_waiters(entry, self.of(entry, now), strict)

    def on_nodes(
        self, entry: Entry, nodes: Iterable[str], now: datetime, strict: bool
    ) -> dict[str, Refusal | None]:
        """:meth:`admission`'s refusal of ``entry`` on each of ``nodes``, each the same as
        asked alone (``entry.node`` is left as it was). What does not depend on the node
        (the entry itself; its quotas and the lifetime they give, unless one has a
        nodeSelector) is worked out once: a scheduler's filter asks it of a thousand
        nodes per pod."""
        home, out = entry.node, {}
        before_node = self._entry_refusal(entry, now)
        alike = self._quotas.node_independent(namespace_of(entry.id))
        by_quota = self._quota_refusal(entry, now) if before_node is None and alike else None
        try:
            for node in nodes:
                entry.node = node
                state = self._nodes.get(node)
                refusal = before_node
                if refusal is None and (state is None or not state.known):
                    refusal = _node_unknown(node)
                elif refusal is None and state is not None:
                    refusal = by_quota if alike else self._quota_refusal(entry, now)
                    if refusal is None:
                        refusal = state.room_refusal(entry)
                out[node] = self._behind_waiters(entry, refusal, strict)[0]
        finally:
            entry.node = home
        return out

    def room(self, entry: Entry) -> Refusal | None:
        """Why ``entry.node`` has no room for ``entry`` now (its entry cap, RAM, VRAM, and
        devices after what is held outside Headroom), or None; its quotas are not asked.
        A node the ledger does not know has no room."""
        state = self._nodes.get(entry.node)
        if state is None or not state.known:
            return Reason.NODE_UNKNOWN, f"node {entry.node} is not known yet"
        return state.room_refusal(entry)

    def _behind_waiters(
        self, entry: Entry, refusal: Refusal | None, strict: bool
    ) -> tuple[Refusal | None, int]:
        for_room = for_quota = 0
        if strict:
            shares = partial(self._quotas.share, namespace_of(entry.id))
            for_room, for_quota = self._waiting.ahead_of(entry, shares)
        ahead = for_room + for_quota
        # Waiters ahead make it wait too, unless it is refused for good: then it is
        # refused at once (a wait would only run out).
        if ahead and (refusal is None or refusal[0] in WAITABLE):
            refusal = (
                Reason.WAITERS_AHEAD,
                f"node {entry.node}: {ahead} reservations wait ahead of this one (strict FIFO)",
            )
        return refusal, for_room

    def _entry_refusal(self, entry: Entry, now: datetime) -> Refusal | None:
        """What is wrong with the entry wherever it goes: its size, its id, its expiry."""
        if entry.ram_mb < 0 or entry.vram_mb < 0 or entry.ram_mb + entry.vram_mb == 0:
            return Reason.INVALID_SPEC, (
                f"ramMB {entry.ram_mb} and vramMB {entry.vram_mb}: at least one must be above 0 "
                "and neither below 0"
            )
        if entry.id in self._entries:
            return Reason.DUPLICATE_ID, f"reservation {entry.id} already holds an entry"
        if entry.expires_at is not None and entry.expires_at <= now:
            return Reason.ALREADY_EXPIRED, (
                f"expiresAt {entry.expires_at.isoformat()} is not after now ({now.isoformat()})"
            )
        return None

    def _quota_refusal(self, entry: Entry, now: datetime) -> Refusal | None:
        """Why its namespace's quotas refuse it, or the lifetime they give ran out. The
        running claim it is to replace (:meth:`Ledger.set_running_claim`) does not count."""
        running = self._running.get(entry.id)
        if running is not None:
            self._quotas.remove(running)
        try:
            return self._quota_refusal_now(entry, now)
        finally:
            if running is not None:
                self._quotas.add(running)

    def _quota_refusal_now(self, entry: Entry, now: datetime) -> Refusal | None:
        refused_by_quota = self._quotas.refusal(entry)
        if refused_by_quota is not None:
            return refused_by_quota
        given = self._quotas.expiry(entry) if entry.expires_at is None else None
        if given is not None and given <= now:
            return Reason.ALREADY_EXPIRED, (
                f"the lifetime its quota gives ran out at {given.isoformat()} "
                f"(now {now.isoformat()})"
            )
        return None


def _node_unknown(node: str) -> Refusal:
    return Reason.NODE_UNKNOWN, (
        f"node {node}: capacity unknown (no such Node, or it reports no memory)"
    )
