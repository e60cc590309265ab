"""What waits, looked at again: the passes over the queues that admit or refuse waiters.

``queue.py`` keeps the queues (creation order, each wait's deadline); this module
holds the policy of going through them, which is where strict and best-effort
FIFO differ and where quotas change who holds back whom:

- when room may have appeared, waiters are tried oldest first on each node; under
  strict FIFO the first that does not fit for the node's room stops the ones
  behind it, while one refused by its quota holds back only the waiters of the
  namespaces that share that quota (other tenants do not wait for it);
- when waits run out, or a quota changed so that a gated pod's reservation can
  never be admitted, those waiters are refused.

Admitting is the ledger's (:meth:`Ledger.reserve`, passed in), and so is counting
refusals; what is decided here, and in which order, is exactly what the ledger
decided before this was a module of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import partial

from headroom.api.reasons import Reason
from headroom.ledger.decisions import QUOTA_REASONS, Decision
from headroom.ledger.entry import Entry
from headroom.ledger.queue import Waiting, WaitQueues
from headroom.ledger.quotas import Quotas, namespace_of
from headroom.ledger.refusals import Refusals


class Waiters:
    """The passes over the ledger's ``waiting`` queues, under its ``quotas``, refused as
    its ``refusals`` say."""

    def __init__(self, waiting: WaitQueues, quotas: Quotas, refusals: Refusals) -> None:
        self._waiting = waiting
        self._quotas = quotas
        self._refusals = refusals
        self._quota_changes_seen = 0  # Quotas.changes when pods' waiters were last looked at

    def add(self, entry: Entry, until: datetime, *, for_quota: bool) -> int:
        """Queue ``entry`` until ``until`` (or until the lifetime its quota gives ends, if
        it has no expiry of its own); its position on its node (1 is next)."""
        given = self._quotas.expiry(entry) if entry.expires_at is None else None
        return self._waiting.add(entry, until, for_quota=for_quota, expires=given)

    def for_quota(self, namespace: str | None) -> set[str]:
        """Nodes whose waiters may fit now that ``namespace`` released memory, or (None) a
        quota or a namespace's labels changed: those waiting for a quota it shares."""
        if not self._waiting.any_for_quota:
            return set()
        if namespace is None:
            return self._waiting.for_quota()
        return self._waiting.for_quota(partial(self._quotas.share, namespace))

    def admit(
        self,
        now: datetime,
        nodes: Iterable[str],
        reserve: Callable[[Entry, datetime], Decision],
        *,
        strict: bool,
        undecided: Mapping[str, tuple[datetime, str]] | None,
    ) -> list[Decision]:
        """Take out of the queues of ``nodes``, in order, each waiter that fits now and
        admit it by ``reserve`` before the next is looked at (:meth:`Ledger.admit_waiting`).

        ``undecided`` gives, per node, the creation key (time, id) of the oldest
        reservation not decided yet (seen during an outage, say): under strict FIFO no
        waiter younger than it goes first; it is decided, in its turn, before them.
        """
        admitted: list[Decision] = []
        passed: list[Waiting] = []  # refused, left waiting, in a best-effort look
        before_last_admission = 0  # how many of ``passed`` were passed before an admission
        for node in sorted(set(nodes)):
            oldest_undecided = (undecided or {}).get(node)
            held_back: list[str] = []  # namespaces whose quota's head waits on this node
            for waiting in self._waiting.on(node):
                entry = waiting.entry
                namespace = namespace_of(entry.id)
                if any(self._quotas.share(namespace, head) for head in held_back):
                    # Behind the head of its own quota: it waits for that quota too.
                    self._waiting.still_refused(entry.id, for_quota=True)
                    continue
                if strict and oldest_undecided and oldest_undecided < waiting.key:
                    break  # an older one, not decided yet, goes first
                refusal = self._refusals.of(entry, now)
                if refusal is None:
                    self._waiting.remove(entry.id)
                    admitted.append(reserve(entry, now))
                    before_last_admission = len(passed)
                    continue
                # Refused by its quota (even for good, as it changed since), or found
                # expired: it holds back no one on the node.
                self._waiting.still_refused(
                    entry.id,
                    for_quota=refusal[0] in QUOTA_REASONS or refusal[0] == Reason.ALREADY_EXPIRED,
                )
                if not strict or refusal[0] == Reason.ALREADY_EXPIRED:
                    passed.append(waiting)
                    continue
                if not waiting.for_quota:
                    break  # the oldest blocks the ones behind it
                # ... of its own quotas only: other tenants do not wait for that quota.
                held_back.append(namespace)
        self._why_still_waiting(passed[:before_last_admission], now)
        return admitted

    def _why_still_waiting(self, passed: list[Waiting], now: datetime) -> None:
        """A best-effort look admitted later ones: those it passed may now be refused by
        their quota (a later one used it up) rather than the node's room, and so hold
        back fewer under strict FIFO. Say so now, as a fresh look would."""
        for waiting in passed:
            refusal = self._refusals.of(waiting.entry, now)
            if refusal is not None:
                self._waiting.still_refused(
                    waiting.entry_id,
                    for_quota=refusal[0] in QUOTA_REASONS or refusal[0] == Reason.ALREADY_EXPIRED,
                )

    def over(self, now: datetime) -> list[Decision]:
        """Waiting reservations whose wait, or hard expiry, ran out, and gated pods' ones
        their quotas now refuse for good: taken out of the queues, refused (uncounted)."""
        refused = []
        for waiting in self._waiting.due(now):
            entry = waiting.entry
            expiry = entry.expires_at or self._quotas.expiry(entry)  # its own, or its quota's
            if expiry is not None and expiry <= now:
                reason, message = (
                    Reason.ALREADY_EXPIRED,
                    f"expired at {expiry.isoformat()} while waiting for room",
                )
            elif waiting.until > now:  # its quota gives a longer lifetime now: waits on
                self._waiting.add(entry, waiting.until, for_quota=waiting.for_quota, expires=expiry)
                continue
            else:
                reason = Reason.WAIT_TIMEOUT
                why = self._refusals.of(entry, now)  # NodeUnknown's words if the node is gone
                message = (
                    f"waited until {waiting.until.isoformat()} for room on node {entry.node}"
                    + (f": {why[1]}" if why else "")
                )
            refused.append(Decision(False, reason, message, entry))
        if self._quotas.changes != self._quota_changes_seen:
            self._quota_changes_seen = self._quotas.changes
            refused.extend(self._pods_refused_for_good())
        return refused

    def _pods_refused_for_good(self) -> list[Decision]:
        """Gated pods' reservations that wait, but that their quotas now refuse for good
        (changed since they queued: a nodeSelector without their node, a maxWait under
        their wait): refused now, so the operator places the pod again or says why,
        rather than leave it gated for its whole wait (24 h by default) for what cannot
        come. Other waiters wait on: their owners chose the node and the wait."""
        refused = []
        for node in self._waiting.nodes():
            for waiting in self._waiting.on(node):
                entry = waiting.entry
                refusal = self._quotas.final_refusal(entry) if entry.pod_lifetime else None
                if refusal is not None:
                    self._waiting.remove(entry.id)
                    refused.append(Decision(False, refusal[0], refusal[1], entry))
        return refused
