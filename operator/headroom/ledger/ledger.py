"""The reservation ledger (seed: Ledger): pure, exact, O(1) per reserve/release/heartbeat.

No I/O and no clock: every method that needs the time takes ``now``. The
operator owns the only instance and calls it from one thread, so there are no
locks; callers serialize.

Costs: reserve, release and heartbeat touch one entry and one node's running
totals. Reclaim pops a heap of deadlines (one item per entry); a heartbeat does
not touch the heap — a popped item whose entry has since heartbeated is pushed
back at its new deadline — so reclaim costs O(log n) per entry it examines, and
it only examines entries whose recorded deadline has passed.

Reclaiming is two steps for the operator: :meth:`Ledger.due` reports entries whose
deadline passed but keeps holding them, so that the operator can confirm against
the API that the owner is really silent before it gives the capacity away (a
heartbeat it missed must not cost a live reservation); then it either
:meth:`reclaim_entry` or spares it (:meth:`heartbeat`, :meth:`postpone`). An entry
that is due has no live heap item, so it is reported once. :meth:`reclaim` does
both steps at once (the seed's Reclaim).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from functools import partial

from headroom.api.gpus import GpuDevice
from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.ledger import devices as device_math
from headroom.ledger.decisions import (
    QUOTA_REASONS,
    QUOTA_WAITABLE,
    WAITABLE,
    Decision,
    Reclaimed,
    RestoreResult,
    UnknownEntryError,
)
from headroom.ledger.entry import Entry
from headroom.ledger.external import ClaimKey, DraClaim, ExternalHoldings
from headroom.ledger.node import NodeState
from headroom.ledger.podrequests import PodKey, PodRequests
from headroom.ledger.queue import Waiting, WaitingView, WaitQueues
from headroom.ledger.quotas import QuotaRules, Quotas, QuotaView, namespace_of
from headroom.ledger.summary import ClusterSummary, Metrics, NodeSummary, allocatable, summarize


class Ledger:
    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._nodes: dict[str, NodeState] = {}
        self._entries: dict[str, Entry] = {}
        self._deadlines: list[tuple[datetime, int, str]] = []
        self._live: dict[str, int] = {}  # entry id -> sequence of its one live heap item
        self._sequence = itertools.count()
        self._reserved_mb = self._released_mb = self._reclaimed_mb = 0
        self._restored_mb = 0  # held again at a start, not admitted by this ledger
        self._failures: Counter[Reason] = Counter()
        self._waiting = WaitQueues()
        self._pod_requests = PodRequests()
        self._external = ExternalHoldings()  # GPUs held outside Headroom (ledger.external)
        self._quotas = Quotas()
        #: Claims of pods that run without an entry here yet (entry id -> the claim):
        #: counted against their namespace's quotas until their own entry replaces them.
        self._running: dict[str, Entry] = {}
        self._quota_changes_seen = 0  # Quotas.changes when pods' waiters were last looked at

    # -- nodes (seed: SetNodeCapacity) ---------------------------------------------------

    def _node(self, name: str) -> NodeState:
        state = self._nodes.get(name)
        if state is None:
            state = self._nodes[name] = NodeState(name, self._limits, external=self._external)
            state.pod_requests_mb = self._pod_requests.on(name)
        return state

    # -- pods placed by the scheduler (headroom.ledger.podrequests) ------------------------

    def set_pod_request(self, key: PodKey, node: str, request_mb: int) -> set[str]:
        """A pod bound to ``node`` requests ``request_mb``; the nodes whose limit moved."""
        return self._apply(self._pod_requests.set_pod(key, node, request_mb))

    def remove_pod_request(self, key: PodKey) -> set[str]:
        return self._apply(self._pod_requests.remove_pod(key))

    def _apply(self, nodes: set[str]) -> set[str]:
        for node in nodes:
            state = self._nodes.get(node)
            if state is not None:
                state.pod_requests_mb = self._pod_requests.on(node)
        return nodes

    # -- GPUs held outside Headroom (headroom.ledger.external) ----------------------------

    def set_resource_claim(self, key: ClaimKey, claim: DraClaim | None) -> set[str]:
        """A DRA ResourceClaim's allocation (None: deallocated or gone); the nodes it moved."""
        return self._touch(self._external.set_claim(key, claim))

    def set_device_plugin_pod(self, key: PodKey, node: str | None, gpus: int) -> set[str]:
        """A pod bound to ``node`` holds ``gpus`` device-plugin GPUs (None or 0: none)."""
        return self._touch(self._external.set_pod(key, node, gpus))

    def set_running_claim(self, entry_id: str, claim: Entry | None) -> bool:
        """A pod runs on a claim the ledger holds no entry ``entry_id`` for yet (its
        reservation not made or not decided: a webhook missed it, the operator was
        down): counted against its namespace's quotas, so that nothing is admitted into
        room the pod already uses, until that entry replaces it (:meth:`record`) or
        ``claim`` is None (it ended, went, or its reservation was decided). Never
        counted against its own entry's decision. Whether its namespace's usage moved."""
        if claim is not None and entry_id in self._entries:
            claim = None  # its entry is held: that counts it
        before = self._running.pop(entry_id, None)
        if before is not None:
            self._quotas.remove(before)
        if claim is not None:
            self._running[entry_id] = claim
            self._quotas.add(claim)
        return _usage(before) != _usage(claim)

    def running_claims(self) -> int:
        """How many running pods' claims count against quotas without an entry."""
        return len(self._running)

    def bound_pods(self) -> int:
        """How many pods the scheduler bound count here with their memory requests."""
        return len(self._pod_requests)

    def pods_with_gpus(self) -> int:
        """How many pods hold device-plugin GPUs."""
        return self._external.pods_with_gpus()

    def claims_allocated(self) -> int:
        """How many DRA ResourceClaims hold devices."""
        return self._external.claims_allocated()

    def _touch(self, nodes: set[str]) -> set[str]:
        for node in nodes:
            state = self._nodes.get(node)
            if state is not None:
                state.changed()
        return nodes

    def _claimed(self, entry: Entry, sign: int) -> None:
        if entry.owner.pod:
            namespace = entry.id.split("/", 1)[0]
            key = (namespace, entry.owner.pod)
            self._apply(self._pod_requests.claim(key, entry.node, sign * entry.ram_mb))

    def set_node_capacity(
        self,
        node: str,
        total_ram_mb: int,
        vram_mb: int | None = None,
        limits: Limits | None = None,
    ) -> None:
        """Node added or resized. Never evicts: a shrink below reserved is over-commitment."""
        state = self._node(node)
        old_window = state.limits.heartbeat_stale_window
        state.total_ram_mb, state.vram_mb = total_ram_mb, vram_mb
        state.limits = limits or self._limits
        state.changed()
        if state.limits.heartbeat_stale_window < old_window:
            for entry in state.entries.values():  # deadlines moved earlier
                self._schedule(entry)

    def set_node_devices(self, node: str, devices: tuple[GpuDevice, ...] | None) -> None:
        """The node's GPU inventory changed (None: it has none, or it cannot be read).

        Never moves an assignment: what admitted claims hold stays on its device ids,
        and a device gone or shrunk shows in :meth:`over_committed_devices`. Entries
        that hold VRAM per device but were admitted without an assignment (before
        the node had an inventory, or before the upgrade that brought devices) are
        placed now, oldest first, so that new claims see them.
        """
        self._external.set_devices(node, devices)
        self._node(node).set_devices(devices)

    def set_node_labels(self, node: str, labels: Mapping[str, str] | None) -> None:
        """The Node's labels, for the quotas' nodeSelectors (None: the Node is gone)."""
        self._quotas.set_node_labels(node, labels)

    # -- quotas (headroom.ledger.quotas) ------------------------------------------------------

    @property
    def quotas(self) -> QuotaView:
        """The quotas and what their namespaces hold, read-only: the methods below change them."""
        return self._quotas

    def set_quota(self, rules: QuotaRules) -> None:
        """A HeadroomQuota created or changed (:meth:`Quotas.set_quota`)."""
        self._quotas.set_quota(rules)
        self._lifetimes_changed()

    def remove_quota(self, name: str) -> bool:
        """A HeadroomQuota deleted, or unusable; whether it was there."""
        removed = self._quotas.remove_quota(name)
        if removed:
            self._lifetimes_changed()
        return removed

    def set_namespace(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """A Namespace seen with these labels; whether what governs it changed."""
        changed = self._quotas.set_namespace(namespace, labels)
        if changed:
            self._lifetimes_changed()
        return changed

    def remove_namespace(self, namespace: str) -> None:
        """The Namespace is gone (:meth:`Quotas.remove_namespace`)."""
        self._quotas.remove_namespace(namespace)
        self._lifetimes_changed()

    def _lifetimes_changed(self) -> None:
        """What governs some namespace changed, so may the lifetime its quotas give: what
        waits without an expiry of its own is refused ``AlreadyExpired`` when the lifetime
        they give now runs out (:meth:`wait_over`), not when the one they gave when it
        began waiting would have."""
        if len(self._waiting):
            self._waiting.set_deadlines(self._quotas.expiry)

    def set_deny_unselected(self, deny: bool) -> None:
        """Whether a namespace no quota selects may hold nothing (else: no limit)."""
        self._quotas.deny_unselected = deny

    def over_committed_devices(self, node: str) -> list[device_math.OverCommit]:
        """Devices of ``node`` holding more than their limit, or gone while held."""
        state = self._nodes.get(node)
        return state.over_committed_devices() if state is not None else []

    def remove_node(self, node: str) -> None:
        """Capacity becomes unknown. Active entries stay until released or reclaimed.

        Per-node limits go with the Node object they came from; the entries left
        behind fall back to the defaults (as they would after a restart).
        """
        state = self._nodes.get(node)
        if state is None:
            return
        self._external.set_devices(node, None)
        if state.entries:
            old_window = state.limits.heartbeat_stale_window
            state.total_ram_mb = state.vram_mb = state.devices = None
            state.limits = self._limits
            state.changed()
            if state.limits.heartbeat_stale_window < old_window:
                for entry in state.entries.values():
                    self._schedule(entry)
        else:
            del self._nodes[node]

    def quota_waiters(self, namespace: str | None = None) -> set[str]:
        """Nodes whose waiters may fit now that ``namespace`` released memory, or (None) a
        quota or a namespace's labels changed: those waiting for a quota it shares."""
        if not self._waiting.any_for_quota:
            return set()
        if namespace is None:
            return self._waiting.for_quota()
        return self._waiting.for_quota(partial(self._quotas.share, namespace))

    @property
    def waiting(self) -> WaitingView:
        """What waits for room, read-only: :meth:`reserve_or_wait`, :meth:`requeue`,
        :meth:`stop_waiting` and the ledger's own decisions change it."""
        return self._waiting

    def requeue(self, entry: Entry, until: datetime, *, for_quota: bool = False) -> int:
        """Put back in its node's queue, waiting until ``until``, a reservation that waited
        before a start (not decided again); its position there (1 is next). The lifetime
        its quota gives ends its wait as before the start, not its wait alone."""
        given = self._quotas.expiry(entry) if entry.expires_at is None else None
        return self._waiting.add(entry, until, for_quota=for_quota, expires=given)

    def stop_waiting(self, entry_id: str) -> Entry | None:
        """The reservation waits no more (decided by its owner, or gone); its entry, if
        it waited."""
        return self._waiting.remove(entry_id)

    def knows(self, node: str) -> bool:
        """Whether the node's capacity is known, so that admission can be decided on it."""
        state = self._nodes.get(node)
        return state is not None and state.known

    def capacity(self, node: str) -> tuple[int | None, int | None]:
        """The node's total RAM and VRAM in MiB (None: unknown)."""
        state = self._nodes.get(node)
        return (state.total_ram_mb, state.vram_mb) if state is not None else (None, None)

    @property
    def limits(self) -> Limits:
        """The default limits: a node's own, if any, are :meth:`limits_for` it."""
        return self._limits

    def limits_for(self, node: str) -> Limits:
        state = self._nodes.get(node)
        return state.limits if state is not None else self._limits

    def nodes(self) -> list[str]:
        return list(self._nodes)

    # -- reserve / release / heartbeat -----------------------------------------------------

    def reserve(self, entry: Entry, now: datetime) -> Decision:
        """Admit ``entry`` iff it fits (seed: Reserve). A refusal changes nothing but counters."""
        refusal = self._refusal(entry, now)
        if refusal is not None:
            reason, message = refusal
            self._failures[reason] += 1
            return Decision(False, reason, message, entry)
        state = self._node(entry.node)
        chosen = state.choose(entry) if state.on_devices(entry) else {}
        assert isinstance(chosen, dict), "a claim that fits has devices"
        entry.devices = chosen
        self._give_expiry(entry)
        # Admitted under its id, it waits no more: nor does a predecessor of the same name
        # (a replaced reservation whose deletion is not seen yet), which would otherwise be
        # refused DuplicateID at every pass over the queue.
        self._waiting.remove(entry.id)
        self._add(state, entry)
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
        self, entry: Entry, now: datetime, until: datetime | None, *, strict: bool = False
    ) -> Decision:
        """Admit ``entry`` if it fits; else, if it may wait until ``until``, queue it.

        Under strict FIFO nothing goes ahead of a reservation already waiting on the
        node: a newcomer waits behind it (or, without a wait, is refused).
        """
        refusal, for_room = self._admission_refusal(entry, now, strict)
        if refusal is None:
            return self.reserve(entry, now)
        reason, message = refusal
        if until is not None and until > now and reason in WAITABLE:
            given = self._quotas.expiry(entry) if entry.expires_at is None else None
            position = self._waiting.add(
                entry,
                until,
                # Refused by its quota, or waiting only behind others of its quota.
                for_quota=reason in QUOTA_WAITABLE
                or (reason == Reason.WAITERS_AHEAD and not for_room),
                expires=given,
            )
            return Decision(
                False, reason, f"{message}; waits until {until.isoformat()}", entry, position
            )
        self._failures[reason] += 1
        return Decision(False, reason, message, entry)

    def _admission_refusal(
        self, entry: Entry, now: datetime, strict: bool
    ) -> tuple[tuple[Reason, str] | None, int]:
        """Why ``entry`` is refused now (waiters ahead under strict FIFO included), and how
        many of those waiters wait for the node's room (not only for their quota's)."""
        return self._behind_waiters(entry, self._refusal(entry, now), strict)

    def _behind_waiters(
        self, entry: Entry, refusal: tuple[Reason, str] | None, strict: bool
    ) -> tuple[tuple[Reason, str] | None, int]:
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

    def record(self, entry: Entry, now: datetime) -> Decision:
        """Account memory already in use: a pod the scheduler placed without asking.

        Never refused for room (the pod runs there whatever the ledger says): admitted
        with reason Fits when it fits, OverCommitted with the numbers when it does not,
        so the node's summary shows the over-commitment instead of hiding it. What is
        wrong with the claim itself (a duplicate id, a bad size) is refused as usual.
        """
        refusal = self._refusal(entry, now)
        if refusal is None:
            return self.reserve(entry, now)
        reason, message = refusal
        if reason not in (
            Reason.INSUFFICIENT_RAM,
            Reason.INSUFFICIENT_VRAM,
            Reason.TOO_MANY_ENTRIES,
            Reason.ALREADY_EXPIRED,
            Reason.NODE_UNKNOWN,
            *QUOTA_WAITABLE,
            Reason.NODE_NOT_ALLOWED,
            Reason.LIFETIME_TOO_LONG,
            Reason.WAIT_TOO_LONG,
        ):
            self._failures[reason] += 1
            return Decision(False, reason, message, entry)
        state = self._node(entry.node)
        entry.devices = state.forced_assignment(entry) if state.on_devices(entry) else {}
        self._give_expiry(entry)
        self._add(state, entry)
        return Decision(
            True, Reason.OVER_COMMITTED, f"already running there, over the limit: {message}", entry
        )

    def could_hold(self, entry: Entry) -> bool:
        """Whether ``entry.node`` would have room for ``entry`` once its other claims
        went (:meth:`NodeState.could_hold`); a node the ledger does not know: no."""
        state = self._nodes.get(entry.node)
        return state is not None and state.known and state.could_hold(entry)

    def devices_for(self, entry: Entry) -> dict[str, int]:
        """The devices :meth:`reserve` would give ``entry`` now, changing nothing; none
        when it is not admitted per device there (or has no fit)."""
        state = self._nodes.get(entry.node)
        if state is None or not state.on_devices(entry):
            return {}
        chosen = state.choose(entry)
        return chosen if isinstance(chosen, dict) else {}

    def room_refusal(self, entry: Entry) -> tuple[Reason, str] | None:
        """Why ``entry.node`` has no room for ``entry`` now (its entry cap, RAM, VRAM, and
        devices after what is held outside Headroom), or None; its quotas are not asked.
        A node the ledger does not know has no room."""
        state = self._nodes.get(entry.node)
        if state is None or not state.known:
            return Reason.NODE_UNKNOWN, f"node {entry.node} is not known yet"
        return state.room_refusal(entry)

    def refusal(
        self, entry: Entry, now: datetime, *, strict: bool = False
    ) -> tuple[Reason, str] | None:
        """Why ``entry`` would be refused now, or None if it fits (no change, no counter);
        ``strict``: as :meth:`reserve_or_wait` under strict FIFO, waiters ahead refuse it."""
        return self._admission_refusal(entry, now, strict)[0]

    def refusals(
        self, entry: Entry, nodes: Iterable[str], now: datetime, *, strict: bool = False
    ) -> dict[str, tuple[Reason, str] | None]:
        """:meth:`refusal` of ``entry`` on each of ``nodes``, each the same as asked alone
        (``entry.node`` is left as it was). What does not depend on the node (the entry
        itself; its quotas and the lifetime they give, unless one has a nodeSelector) is
        worked out once: a scheduler's filter asks it of a thousand nodes per pod."""
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

    def admit_waiting(
        self,
        now: datetime,
        nodes: Iterable[str],
        *,
        strict: bool = False,
        undecided: Mapping[str, tuple[datetime, str]] | None = None,
    ) -> list[Decision]:
        """Admit, in order, what waits on ``nodes`` and fits now (room may have appeared).

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
                refusal = self._refusal(entry, now)
                if refusal is None:
                    self._waiting.remove(entry.id)
                    admitted.append(self.reserve(entry, now))
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
            refusal = self._refusal(waiting.entry, now)
            if refusal is not None:
                self._waiting.still_refused(
                    waiting.entry_id,
                    for_quota=refusal[0] in QUOTA_REASONS or refusal[0] == Reason.ALREADY_EXPIRED,
                )

    def wait_over(self, now: datetime) -> list[Decision]:
        """Waiting reservations whose wait, or hard expiry, ran out: refused now."""
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
                why = self._refusal(entry, now)  # NodeUnknown's words if the node is gone
                message = (
                    f"waited until {waiting.until.isoformat()} for room on node {entry.node}"
                    + (f": {why[1]}" if why else "")
                )
            self._failures[reason] += 1
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
                    self._failures[refusal[0]] += 1
                    refused.append(Decision(False, refusal[0], refusal[1], entry))
        return refused

    def _refusal(self, entry: Entry, now: datetime) -> tuple[Reason, str] | None:
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

    def _entry_refusal(self, entry: Entry, now: datetime) -> tuple[Reason, str] | None:
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

    def _quota_refusal(self, entry: Entry, now: datetime) -> tuple[Reason, str] | None:
        """Why its namespace's quotas refuse it, or the lifetime they give ran out. The
        running claim it is to replace (:meth:`set_running_claim`) does not count."""
        running = self._running.get(entry.id)
        if running is not None:
            self._quotas.remove(running)
        try:
            return self._quota_refusal_now(entry, now)
        finally:
            if running is not None:
                self._quotas.add(running)

    def _quota_refusal_now(self, entry: Entry, now: datetime) -> tuple[Reason, str] | None:
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

    def _give_expiry(self, entry: Entry) -> None:
        """An entry admitted without an expiry lives as long as its quota gives."""
        if entry.expires_at is None:
            entry.expires_at = entry.given_expiry = self._quotas.expiry(entry)

    def _add(self, state: NodeState, entry: Entry, *, restored: bool = False) -> None:
        self.set_running_claim(entry.id, None)  # its entry counts it from now on
        state.add(entry)
        self._quotas.add(entry)
        self._entries[entry.id] = entry
        if restored:
            self._restored_mb += entry.ram_mb
        else:
            self._reserved_mb += entry.ram_mb
        self._schedule(entry)
        self._claimed(entry, +1)

    def _schedule(self, entry: Entry, at: datetime | None = None) -> None:
        if len(self._deadlines) > 2 * len(self._live) + 1024:
            self._compact()
        sequence = next(self._sequence)
        self._live[entry.id] = sequence
        if at is None:
            at = entry.deadline(self._nodes[entry.node].limits.heartbeat_stale_window)
        heapq.heappush(self._deadlines, (at, sequence, entry.id))

    def _compact(self) -> None:
        """Drop heap items of released entries (amortized O(1) per reserve)."""
        self._deadlines = [item for item in self._deadlines if self._live.get(item[2]) == item[1]]
        heapq.heapify(self._deadlines)

    def _remove(self, entry_id: str) -> Entry:
        entry = self._entries.pop(entry_id)
        self._live.pop(entry_id, None)
        state = self._nodes[entry.node]
        state.remove(entry_id)
        self._quotas.remove(entry)
        self._claimed(entry, -1)
        if not state.entries and not state.known:
            del self._nodes[entry.node]
        return entry

    def release(self, entry_id: str) -> Entry:
        """Return an entry's capacity (seed: Release). UnknownEntryError changes nothing."""
        if entry_id not in self._entries:
            raise UnknownEntryError(entry_id)
        entry = self._remove(entry_id)
        self._released_mb += entry.ram_mb
        return entry

    def heartbeat(self, entry_id: str, at: datetime) -> Entry:
        """Refresh liveness (seed: Heartbeat); never moves it backwards."""
        entry = self._entries.get(entry_id)
        if entry is None:
            raise UnknownEntryError(entry_id)
        if at > entry.last_heartbeat:
            entry.last_heartbeat = at
        if entry_id not in self._live:  # it was due: watch its deadline again
            self._schedule(entry)
        return entry

    # -- reclaim (seed: Reclaim, Reconcile) ----------------------------------------------------

    def due(self, now: datetime) -> list[Reclaimed]:
        """Entries stale or expired at ``now``, still held (expiry wins when both apply).

        Each is reported once: the caller then calls :meth:`reclaim_entry`, or spares
        it with :meth:`heartbeat` or :meth:`postpone`.
        """
        found: list[Reclaimed] = []
        not_yet: list[Entry] = []  # rescheduled after the loop, so the loop always ends
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, sequence, entry_id = heapq.heappop(heap)
            if self._live.get(entry_id) != sequence:
                continue  # released, rescheduled by a newer item, or already due
            entry = self._entries[entry_id]
            window = self._nodes[entry.node].limits.heartbeat_stale_window
            if entry.is_expired(now):
                reason = Reason.EXPIRED
                message = f"expired at {entry.expires_at.isoformat() if entry.expires_at else ''}"
            elif entry.is_stale(now, window):
                reason = Reason.HEARTBEAT_STALE
                message = (
                    f"no heartbeat since {entry.last_heartbeat.isoformat()}, "
                    f"window {int(window.total_seconds())}s"
                )
            else:
                not_yet.append(entry)  # heartbeated since it was scheduled
                continue
            del self._live[entry_id]
            found.append(Reclaimed(entry, reason, message))
        for entry in not_yet:
            self._schedule(entry)
        return found

    def reclaim_entry(self, entry_id: str) -> Entry:
        """Remove an entry reported by :meth:`due` (or any held entry) as reclaimed."""
        if entry_id not in self._entries:
            raise UnknownEntryError(entry_id)
        entry = self._remove(entry_id)
        self._reclaimed_mb += entry.ram_mb
        return entry

    def postpone(self, entry_id: str, until: datetime) -> None:
        """Look at a due entry again at ``until`` (its owner could not be checked now)."""
        entry = self._entries.get(entry_id)
        if entry is None:
            raise UnknownEntryError(entry_id)
        self._schedule(entry, at=until)

    def reclaim(self, now: datetime) -> list[Reclaimed]:
        """Remove every stale or expired entry (seed: Reclaim): :meth:`due`, then reclaimed."""
        due = self.due(now)
        for reclaimed in due:
            self.reclaim_entry(reclaimed.entry.id)
        return due

    def next_deadline(self) -> datetime | None:
        """No entry can go stale or expire, and no wait run out, before this (it may be
        earlier than needed)."""
        heap = self._deadlines
        while heap and self._live.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        deadlines = [heap[0][0]] if heap else []
        if (waiting := self._waiting.next_deadline()) is not None:
            deadlines.append(waiting)
        return min(deadlines, default=None)

    # -- start-up ------------------------------------------------------------------------------

    def restore(self, entries: Iterable[Entry]) -> RestoreResult:
        """Put back entries admitted before a restart, without re-deciding them.

        Entries that no longer fit (limits or capacity changed meanwhile) are kept and
        reported, oldest first kept within the limit, so the operator can surface them.
        What is put back counts as restored, not reserved: the counters are of what this
        ledger admitted, so a restart does not count every held reservation again.
        """
        touched: set[str] = set()
        for entry in sorted(entries, key=lambda e: (e.created_at, e.id)):
            if entry.id in self._entries:
                continue
            self._add(self._node(entry.node), entry, restored=True)
            touched.add(entry.node)
        over: list[Entry] = []
        for node in touched:
            state = self._nodes[node]
            if state.devices is not None:
                state.place_unassigned()
                crowded = {o.device_id for o in state.over_committed_devices()}
                over.extend(e for e in state.entries.values() if crowded.intersection(e.devices))
            limit, vram_limit = state.limit_ram_mb(), state.limit_vram_mb()
            ram = vram = 0
            for entry in sorted(state.entries.values(), key=lambda e: (e.created_at, e.id)):
                ram, vram = ram + entry.ram_mb, vram + entry.vram_mb
                if (limit is not None and ram > limit) or (
                    vram_limit is not None and vram > vram_limit
                ):
                    over.append(entry)
        unique = {entry.id: entry for entry in over}
        return RestoreResult(sorted(unique.values(), key=lambda e: (e.created_at, e.id)))

    @classmethod
    def rebuild(
        cls,
        limits: Limits,
        nodes: Iterable[tuple[str, int, int | None, Limits | None]],
        entries: Iterable[Entry],
    ) -> tuple[Ledger, RestoreResult]:
        """A ledger from node capacities and admitted entries (seed: Load)."""
        ledger = cls(limits)
        for name, total, vram, node_limits in nodes:
            ledger.set_node_capacity(name, total, vram, node_limits)
        return ledger, ledger.restore(entries)

    # -- queries (seed: AllocatableRAM, NodeSummaryFor, Summary, Entries, Metrics) --------------

    def get(self, entry_id: str) -> Entry | None:
        return self._entries.get(entry_id)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries.values())

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def entries_for_node(self, node: str) -> list[Entry]:
        state = self._nodes.get(node)
        return list(state.entries.values()) if state else []

    def allocatable_ram(self, node: str) -> int:
        state = self._nodes.get(node)
        return allocatable(state) if state else 0

    def node_summary(self, node: str, now: datetime) -> NodeSummary:
        summary = summarize(self._nodes.get(node) or NodeState(node, self._limits), now)
        queued, queued_mb = self._waiting.totals(node)
        return replace(summary, queued_entries=queued, queued_ram_mb=queued_mb)

    def summary(self, now: datetime) -> ClusterSummary:
        nodes = [self.node_summary(name, now) for name in sorted(self._nodes)]
        return ClusterSummary(
            nodes=nodes,
            total_reserved_mb=sum(n.reserved_ram_mb for n in nodes),
            total_vram_mb=sum(n.reserved_vram_mb for n in nodes),
            active_entries=len(self._entries),
            stale_entries=sum(n.stale_entries for n in nodes),
        )

    def metrics(self) -> Metrics:
        return Metrics(
            reserved_mb=self._reserved_mb,
            released_mb=self._released_mb,
            reclaimed_mb=self._reclaimed_mb,
            restored_mb=self._restored_mb,
            reserve_failures=sum(self._failures.values()),
            active_entries=len(self._entries),
            active_mb=sum(s.reserved_ram_mb for s in self._nodes.values()),
            failures_by_reason=dict(self._failures),
        )


def _usage(entry: Entry | None) -> tuple[int, int] | None:
    return (entry.ram_mb, entry.vram_mb) if entry is not None else None


def _node_unknown(node: str) -> tuple[Reason, str]:
    return Reason.NODE_UNKNOWN, (
        f"node {node}: capacity unknown (no such Node, or it reports no memory)"
    )
