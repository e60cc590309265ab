"""The reservation ledger (seed: Ledger): pure, exact, O(1) per reserve/release/heartbeat.

No I/O and no clock: every method that needs the time takes ``now``. The
operator owns the only instance and calls it from one thread, so there are no
locks; callers serialize.

``Ledger`` is the one object the operator owns and calls, and the place where its
parts are wired: each part gets the others' state it reads, and nothing else. The
nodes and what holds them besides the ledger are ``cluster``; the held entries
and where each counts, ``holdings``, with their reclaim ``deadlines``; why a
claim is refused, ``refusals``; deciding it, ``admission``; what waits,
``queue`` and ``waiters``; HeadroomQuotas, ``quotas``; a restart, ``restore``.

Costs: reserve, release and heartbeat touch one entry and one node's running
totals; reclaim costs O(log n) per entry whose recorded deadline has passed, and
reclaiming is two steps for the operator (:meth:`Ledger.due`, then
:meth:`Ledger.reclaim_entry` or a reprieve), both in ``deadlines``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime

from headroom.api.gpus import GpuDevice
from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.ledger import devices as device_math
from headroom.ledger.admission import Admission
from headroom.ledger.cluster import Cluster
from headroom.ledger.decisions import Decision, Reclaimed, RestoreResult
from headroom.ledger.entry import Entry
from headroom.ledger.external import ClaimKey, DraClaim
from headroom.ledger.holdings import Holdings
from headroom.ledger.node import NodeState
from headroom.ledger.podrequests import PodKey
from headroom.ledger.queue import WaitingView, WaitQueues
from headroom.ledger.quotas import QuotaRules, Quotas, QuotaView
from headroom.ledger.refusals import Refusals
from headroom.ledger.restore import over_committed
from headroom.ledger.summary import (
    ClusterSummary,
    Metrics,
    NodeSummary,
    allocatable,
    cluster_summary,
    summarize,
)
from headroom.ledger.waiters import Waiters


class Ledger:
    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._cluster = Cluster(limits)  # the nodes, and what else holds them (ledger.cluster)
        self._nodes = self._cluster.nodes
        self._quotas = Quotas()
        self._holdings = Holdings(self._cluster, self._quotas)  # what it holds (ledger.holdings)
        self._entries = self._holdings.entries
        self._deadlines = self._holdings.deadlines
        self._running = self._holdings.running
        self._failures: Counter[Reason] = Counter()
        self._waiting = WaitQueues()
        self._refusals = Refusals(  # (ledger.refusals)
            self._entries, self._nodes, self._quotas, self._running, self._waiting
        )
        self._waiters = Waiters(self._waiting, self._quotas, self._refusals)  # (ledger.waiters)
        self._admission = Admission(  # (ledger.admission)
            self._cluster,
            self._holdings,
            self._quotas,
            self._refusals,
            self._waiting,
            self._waiters,
            self._failures,
        )

    # -- nodes, and what holds them besides the ledger (ledger.cluster) --------------------

    def set_node_capacity(
        self,
        node: str,
        total_ram_mb: int,
        vram_mb: int | None = None,
        limits: Limits | None = None,
    ) -> None:
        """Node added or resized. Never evicts: a shrink below reserved is over-commitment."""
        for entry in self._cluster.set_capacity(node, total_ram_mb, vram_mb, limits):
            self._deadlines.schedule(entry)  # its deadline moved earlier

    def set_node_devices(self, node: str, devices: tuple[GpuDevice, ...] | None) -> None:
        """The node's GPU inventory changed (None: it has none, or it cannot be read);
        assignments never move (:meth:`Cluster.set_devices`)."""
        self._cluster.set_devices(node, devices)

    def set_node_labels(self, node: str, labels: Mapping[str, str] | None) -> None:
        """The Node's labels, for the quotas' nodeSelectors (None: the Node is gone)."""
        self._quotas.set_node_labels(node, labels)

    def remove_node(self, node: str) -> None:
        """Capacity becomes unknown; held entries stay, under the default limits, until
        released or reclaimed (:meth:`Cluster.remove`)."""
        for entry in self._cluster.remove(node):
            self._deadlines.schedule(entry)  # its deadline moved earlier

    def set_pod_request(self, key: PodKey, node: str, request_mb: int) -> set[str]:
        """A pod bound to ``node`` requests ``request_mb``; the nodes whose limit moved."""
        return self._cluster.set_pod_request(key, node, request_mb)

    def remove_pod_request(self, key: PodKey) -> set[str]:
        return self._cluster.remove_pod_request(key)

    def set_resource_claim(self, key: ClaimKey, claim: DraClaim | None) -> set[str]:
        """A DRA ResourceClaim's allocation (None: deallocated or gone); the nodes it moved."""
        return self._cluster.set_resource_claim(key, claim)

    def set_device_plugin_pod(self, key: PodKey, node: str | None, gpus: int) -> set[str]:
        """A pod bound to ``node`` holds ``gpus`` device-plugin GPUs (None or 0: none)."""
        return self._cluster.set_device_plugin_pod(key, node, gpus)

    def set_running_claim(self, entry_id: str, claim: Entry | None) -> bool:
        """A pod runs on a claim the ledger holds no entry ``entry_id`` for yet, counted
        against its quotas until that entry replaces it (:meth:`Holdings.set_running_claim`)
        or ``claim`` is None; whether its namespace's usage moved."""
        return self._holdings.set_running_claim(entry_id, claim)

    def running_claims(self) -> int:
        """How many running pods' claims count against quotas without an entry."""
        return len(self._running)

    def bound_pods(self) -> int:
        """How many pods the scheduler bound count here with their memory requests."""
        return self._cluster.bound_pods()

    def pods_with_gpus(self) -> int:
        """How many pods hold device-plugin GPUs."""
        return self._cluster.pods_with_gpus()

    def claims_allocated(self) -> int:
        """How many DRA ResourceClaims hold devices."""
        return self._cluster.claims_allocated()

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

    def over_committed_devices(self, node: str) -> list[device_math.OverCommit]:
        """Devices of ``node`` holding more than their limit, or gone while held."""
        state = self._nodes.get(node)
        return state.over_committed_devices() if state is not None else []

    # -- quotas (ledger.quotas) ------------------------------------------------------------

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

    # -- decisions (seed: Reserve; ledger.admission, ledger.refusals) ----------------------

    def reserve(self, entry: Entry, now: datetime) -> Decision:
        """Admit ``entry`` iff it fits (seed: Reserve). A refusal changes nothing but counters."""
        return self._admission.reserve(entry, now)

    def reserve_or_wait(
        self, entry: Entry, now: datetime, until: datetime | None, *, strict: bool = False
    ) -> Decision:
        """Admit ``entry`` if it fits; else, if it may wait until ``until``, queue it.
        Under strict FIFO a newcomer waits behind those waiting on the node (or, without
        a wait, is refused)."""
        return self._admission.reserve_or_wait(entry, now, until, strict)

    def record(self, entry: Entry, now: datetime) -> Decision:
        """Account memory already in use: a pod the scheduler placed without asking; never
        refused for room, but held over the limit (:meth:`Admission.record`)."""
        return self._admission.record(entry, now)

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
        return self._refusals.room(entry)

    def refusal(
        self, entry: Entry, now: datetime, *, strict: bool = False
    ) -> tuple[Reason, str] | None:
        """Why ``entry`` would be refused now, or None if it fits (no change, no counter);
        ``strict``: as :meth:`reserve_or_wait` under strict FIFO, waiters ahead refuse it."""
        return self._refusals.admission(entry, now, strict)[0]

    def refusals(
        self, entry: Entry, nodes: Iterable[str], now: datetime, *, strict: bool = False
    ) -> dict[str, tuple[Reason, str] | None]:
        """:meth:`refusal` of ``entry`` on each of ``nodes``, each the same as asked alone
        (``entry.node`` is left as it was). What does not depend on the node (the entry
        itself; its quotas and the lifetime they give, unless one has a nodeSelector) is
        worked out once: a scheduler's filter asks it of a thousand nodes per pod."""
        return self._refusals.on_nodes(entry, nodes, now, strict)

    # -- waiting for room (ledger.queue, ledger.waiters) -----------------------------------

    @property
    def waiting(self) -> WaitingView:
        """What waits for room, read-only: :meth:`reserve_or_wait`, :meth:`requeue`,
        :meth:`stop_waiting` and the ledger's own decisions change it."""
        return self._waiting

    def quota_waiters(self, namespace: str | None = None) -> set[str]:
        """Nodes whose waiters may fit now that ``namespace`` released memory, or (None) a
        quota or a namespace's labels changed: those waiting for a quota it shares."""
        return self._waiters.for_quota(namespace)

    def requeue(self, entry: Entry, until: datetime, *, for_quota: bool = False) -> int:
        """Put back in its node's queue, waiting until ``until``, a reservation that waited
        before a start (not decided again); its position there (1 is next). The lifetime
        its quota gives ends its wait as before the start, not its wait alone."""
        return self._waiters.add(entry, until, for_quota=for_quota)

    def stop_waiting(self, entry_id: str) -> Entry | None:
        """The reservation waits no more (decided by its owner, or gone); its entry, if
        it waited."""
        return self._waiting.remove(entry_id)

    def admit_waiting(
        self,
        now: datetime,
        nodes: Iterable[str],
        *,
        strict: bool = False,
        undecided: Mapping[str, tuple[datetime, str]] | None = None,
    ) -> list[Decision]:
        """Admit, in order, what waits on ``nodes`` and fits now (room may have appeared);
        under strict FIFO none younger than ``undecided`` (:meth:`Waiters.admit`)."""
        return self._waiters.admit(now, nodes, self.reserve, strict=strict, undecided=undecided)

    def wait_over(self, now: datetime) -> list[Decision]:
        """Waiting reservations whose wait, or hard expiry, ran out: refused now; and gated
        pods' ones that their quotas, changed since, refuse for good (:meth:`Waiters.over`)."""
        refused = self._waiters.over(now)
        for decision in refused:
            self._failures[decision.reason] += 1
        return refused

    # -- release, heartbeat, reclaim (ledger.holdings, ledger.deadlines) -------------------

    def release(self, entry_id: str) -> Entry:
        """Return an entry's capacity (seed: Release). UnknownEntryError changes nothing."""
        return self._holdings.release(entry_id)

    def heartbeat(self, entry_id: str, at: datetime) -> Entry:
        """Refresh liveness (seed: Heartbeat); never moves it backwards."""
        return self._holdings.heartbeat(entry_id, at)

    def due(self, now: datetime) -> list[Reclaimed]:
        """Entries stale or expired at ``now``, still held, each reported once: the caller
        then calls :meth:`reclaim_entry`, or spares it (:meth:`heartbeat`, :meth:`postpone`)."""
        return self._deadlines.due(now)

    def reclaim_entry(self, entry_id: str) -> Entry:
        """Remove an entry reported by :meth:`due` (or any held entry) as reclaimed."""
        return self._holdings.reclaim(entry_id)

    def postpone(self, entry_id: str, until: datetime) -> None:
        """Look at a due entry again at ``until`` (its owner could not be checked now)."""
        self._holdings.postpone(entry_id, until)

    def reclaim(self, now: datetime) -> list[Reclaimed]:
        """Remove every stale or expired entry (seed: Reclaim): :meth:`due`, then reclaimed."""
        due = self.due(now)
        for reclaimed in due:
            self.reclaim_entry(reclaimed.entry.id)
        return due

    def next_deadline(self) -> datetime | None:
        """No entry can go stale or expire, and no wait run out, before this (it may be
        earlier than needed)."""
        held = self._deadlines.earliest()
        deadlines = [held] if held is not None else []
        if (waiting := self._waiting.next_deadline()) is not None:
            deadlines.append(waiting)
        return min(deadlines, default=None)

    # -- start-up (ledger.restore) ---------------------------------------------------------

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
            self._holdings.add(self._cluster.node(entry.node), entry, restored=True)
            touched.add(entry.node)
        return over_committed(self._nodes[node] for node in touched)

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

    # -- queries (seed: AllocatableRAM, NodeSummaryFor, Summary, Entries, Metrics) ---------

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
        return cluster_summary(nodes, len(self._entries))

    def metrics(self) -> Metrics:
        return self._holdings.metrics(self._failures)
