"""Property tests: quotas per tenant (HeadroomQuota) under any history.

A hypothesis state machine drives claims (reserve, reserve_or_wait with either
queueing strategy, release, heartbeat, reclaim, admit_waiting, wait_over), time,
quotas (set, changed, removed, invalid, Deny for unselected namespaces),
namespace labels and node labels and capacities. Which quota governs which
namespace is worked out here from scratch, from the labels and selectors the
machine gave, and after every step it checks:

(a) after every admission (reserve, reserve_or_wait, admit_waiting), every quota
    governing the admitted entry's namespace is valid and within its limits (RAM,
    VRAM, entries), the node is one its nodeSelector picks and the lifetime and
    wait are within its maxima; a quota lowered under what is held admits nothing
    new in its namespaces; a namespace no quota selects admits nothing under Deny;
(b) each quota's usage (Quotas.used) equals the sum over the ledger's entries in
    the namespaces it governs, recounted, and a ledger rebuilt from the admitted
    entries (quotas set before or after them) counts the same;
(c) no admission pushes a node over its limit (the node invariants of
    test_core_properties.py, for the claims quotas now refuse or let through);

and, for the queue: best-effort leaves nothing waiting that fits; under strict
FIFO only a waiter refused on the node's room (not by its quota) holds back
those behind it; quota_waiters finds every node where someone waits for a quota
the namespace shares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.api.selectors import LabelSelector, LabelSelectorRequirement
from headroom.ledger import Decision, Entry, Ledger, Owner
from headroom.ledger.decisions import QUOTA_REASONS, WAITABLE
from headroom.ledger.outlook import outlook
from headroom.ledger.queue import Waiting
from headroom.ledger.quotas import NAME_LABEL, QuotaRules, Usage, namespace_of
from tests.unit.outlook_checks import assert_outlook_says

NODES = ("a", "b", "c")
NAMESPACES = ("ml", "ml-dev", "web", "ops", "loose")
QUOTAS = ("q1", "q2", "q3")
T0 = datetime(2026, 12, 2, tzinfo=UTC)
WINDOW = timedelta(seconds=60)


def _requirement(key: str, operator: str, *values: str) -> LabelSelector:
    return LabelSelector(
        match_expressions=[
            LabelSelectorRequirement(
                key=key,
                operator=operator,  # type: ignore[arg-type]
                values=list(values) if values else None,
            )
        ]
    )


NAMESPACE_SELECTORS = st.sampled_from(
    [
        LabelSelector(),  # every namespace
        LabelSelector(match_labels={"team": "ml"}),
        LabelSelector(match_labels={"team": "web"}),
        LabelSelector(match_labels={"tier": "gold"}),
        _requirement("team", "In", "ml", "web"),
        _requirement("team", "NotIn", "ml"),
        _requirement("team", "DoesNotExist"),
        _requirement(NAME_LABEL, "In", "ml", "ops"),
    ]
)
NODE_SELECTORS = st.sampled_from(
    [
        None,
        None,
        None,
        LabelSelector(match_labels={"pool": "gpu"}),
        _requirement("pool", "Exists"),
        _requirement("pool", "NotIn", "gpu"),
    ]
)
LIMITS_MB = st.none() | st.integers(0, 12_000)
#: Seconds from creation to spec.expiresAt: none, soon (it may expire while it waits), late.
EXPIRIES = st.none() | st.integers(1, 40) | st.integers(1, 900)
#: Often 0: a claim asking for one dimension only must still respect the other's limit.
SIZES = st.integers(1, 6_000) | st.integers(1, 3_000) | st.integers(1, 1_000) | st.just(0)
DURATIONS = st.none() | st.integers(30, 600).map(lambda s: timedelta(seconds=s))


@st.composite
def quota_rules(draw: st.DrawFn, name: str) -> QuotaRules:
    max_lifetime, default_lifetime = draw(DURATIONS), draw(DURATIONS)
    if max_lifetime is not None and default_lifetime is not None:
        default_lifetime = min(default_lifetime, max_lifetime)  # the schema refuses more
    return QuotaRules(
        name=name,
        namespaces=draw(NAMESPACE_SELECTORS),
        ram_mb=draw(LIMITS_MB),
        vram_mb=draw(LIMITS_MB),
        max_entries=draw(st.none() | st.integers(0, 8)),
        nodes=draw(NODE_SELECTORS),
        max_lifetime=max_lifetime,
        default_lifetime=default_lifetime,
        max_wait=draw(
            st.none() | st.none() | st.integers(5, 150).map(lambda s: timedelta(seconds=s))
        ),
        invalid=draw(st.sampled_from([None] * 7 + ["spec.ramMB: not a quantity"])),
    )


NAMESPACE_LABELS = st.fixed_dictionaries(
    {},
    optional={"team": st.sampled_from(["ml", "web", "ops"]), "tier": st.just("gold")},
)
NODE_LABELS = st.none() | st.fixed_dictionaries(
    {}, optional={"pool": st.sampled_from(["gpu", "cpu"])}
)


class QuotaMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.limits = Limits(heartbeat_stale_window=WINDOW, max_entries_per_node=8)
        self.ledger = Ledger(self.limits)
        self.now = T0
        self.ids = 0
        self.capacity: dict[str, tuple[int, int | None, Limits]] = {}
        self.node_labels: dict[str, dict[str, str]] = {}
        self.namespace_labels: dict[str, dict[str, str]] = {}  # as last set; else the name
        self.rules: dict[str, QuotaRules] = {}
        self.shrunk: set[str] = set()  # nodes whose limit was lowered below what they hold
        for node, labels in zip(NODES, ({"pool": "gpu"}, {"pool": "cpu"}, {}), strict=True):
            self._set_capacity(node, 16_000, 8_000, Limits(Fraction(1), 1024, WINDOW, 8))
            self.node_labels[node] = labels
            self.ledger.set_node_labels(node, labels)

    # -- quotas, namespaces, nodes ------------------------------------------------------

    @initialize(
        data=st.data(),
        names=st.lists(st.sampled_from(QUOTAS), min_size=1, max_size=3, unique=True),
        labels=st.lists(st.none() | st.none() | NAMESPACE_LABELS, min_size=len(NAMESPACES)),
    )
    def start(
        self, data: st.DataObject, names: list[str], labels: list[dict[str, str] | None]
    ) -> None:
        """Quotas and labelled namespaces (some not seen yet) before the first claim."""
        for namespace, namespace_labels in zip(NAMESPACES, labels, strict=False):
            if namespace_labels is not None:
                self.label_namespace(namespace, namespace_labels)
        for name in names:
            self.set_quota(data, name)

    @rule(data=st.data(), name=st.sampled_from(QUOTAS))
    def set_quota(self, data: st.DataObject, name: str) -> None:
        rules = data.draw(quota_rules(name))
        self.ledger.set_quota(rules)
        self.rules[name] = rules
        self._settle_quota_change()

    @precondition(lambda self: bool(self.rules))
    @rule(
        data=st.data(),
        dimension=st.sampled_from(["ram_mb", "vram_mb", "max_entries"]),
        percent=st.integers(0, 100),
    )
    def lower_quota(self, data: st.DataObject, dimension: str, percent: int) -> None:
        """A quota lowered to (or under) what its namespaces hold: it reclaims nothing."""
        name = data.draw(st.sampled_from(sorted(self.rules)))
        used = self.ledger.quotas.used(name)
        held = {"ram_mb": used.ram_mb, "vram_mb": used.vram_mb, "max_entries": used.entries}
        rules = replace(self.rules[name], **{dimension: held[dimension] * percent // 100})
        entries = len(self.ledger)
        self.ledger.set_quota(rules)
        self.rules[name] = rules
        assert len(self.ledger) == entries
        assert self.ledger.quotas.used(name) == used, "lowering a quota changed its usage"
        self._settle_quota_change()
        # A claim in one of its namespaces at once: over the new limit, nothing new goes in,
        # not even one asking only for the other dimension (boundaries are where it breaks).
        governed = [namespace for namespace in NAMESPACES if name in self._governing(namespace)]
        if not governed:
            return
        ram, vram = data.draw(SIZES), data.draw(SIZES)
        if dimension == "ram_mb" and data.draw(st.booleans()):
            ram, vram = 0, vram or 1
        elif dimension == "vram_mb" and data.draw(st.booleans()):
            ram, vram = ram or 1, 0
        namespace = data.draw(st.sampled_from(governed))
        self.reserve(namespace, data.draw(st.sampled_from(NODES)), ram, vram, None)

    @rule(name=st.sampled_from(QUOTAS))
    def remove_quota(self, name: str) -> None:
        assert self.ledger.remove_quota(name) is (name in self.rules)
        self.rules.pop(name, None)
        self._settle_quota_change()

    @rule(deny=st.booleans())
    def unselected_namespaces(self, deny: bool) -> None:
        self.ledger.set_deny_unselected(deny)

    @rule(namespace=st.sampled_from(NAMESPACES), labels=NAMESPACE_LABELS)
    def label_namespace(self, namespace: str, labels: dict[str, str]) -> None:
        labels = {NAME_LABEL: namespace, **labels}  # the API server's label, always there
        before = self._governing(namespace)
        changed = self.ledger.set_namespace(namespace, labels)
        self.namespace_labels[namespace] = labels
        assert changed or self._governing(namespace) == before, "a change not reported"
        if changed:
            self._settle_quota_change()

    @rule(namespace=st.sampled_from(NAMESPACES))
    def remove_namespace(self, namespace: str) -> None:
        self.ledger.remove_namespace(namespace)
        self.namespace_labels.pop(namespace, None)

    @rule(node=st.sampled_from(NODES), labels=NODE_LABELS)
    def label_node(self, node: str, labels: dict[str, str] | None) -> None:
        self.ledger.set_node_labels(node, labels)
        if labels is None:
            self.node_labels.pop(node, None)
        else:
            self.node_labels[node] = labels

    @rule(
        node=st.sampled_from(NODES),
        total=st.integers(0, 20_000),
        vram=st.none() | st.integers(0, 8_000),
        reserve=st.integers(0, 2048),
    )
    def set_capacity(self, node: str, total: int, vram: int | None, reserve: int) -> None:
        self._set_capacity(node, total, vram, Limits(Fraction(1), reserve, WINDOW, 8))
        self.ledger.admit_waiting(self.now, [node])  # room may have appeared
        self._check_queue_after_best_effort([node])

    @rule(node=st.sampled_from(NODES))
    def remove_node(self, node: str) -> None:
        self.ledger.remove_node(node)
        self.capacity.pop(node, None)

    # -- claims ---------------------------------------------------------------------------

    @rule(
        namespace=st.sampled_from(NAMESPACES),
        node=st.sampled_from((*NODES, "ghost")),
        ram=SIZES,
        vram=SIZES,
        expires=st.none() | st.integers(-5, 900),
    )
    def reserve(self, namespace: str, node: str, ram: int, vram: int, expires: int | None) -> None:
        entry = self._entry(namespace, node, ram, vram, expires, None)
        before = self._usage_now()
        decision = self.ledger.reserve(entry, self.now)
        if decision.admitted:
            self._check_admitted([decision])
        else:
            assert self._usage_now() == before, "a refusal changed a quota's usage"

    @rule(
        namespace=st.sampled_from(NAMESPACES),
        ram=SIZES,
        vram=SIZES,
        expires=EXPIRIES,
        strict=st.booleans(),
        again=st.booleans(),
    )
    def refusals_over_many_nodes(
        self, namespace: str, ram: int, vram: int, expires: int | None, strict: bool, again: bool
    ) -> None:
        """A scheduler's filter asks of many nodes at once: each answer is the one asked
        alone, whatever the quotas' nodeSelectors (worked out once when none has one)."""
        entry = self._entry(namespace, "home", ram, vram, expires, None)
        if again and len(self.ledger):  # an id the ledger holds: DuplicateID everywhere
            entry.id = next(iter(self.ledger.entries())).id
        nodes = [*NODES, "ghost"]
        many = self.ledger.refusals(entry, nodes, self.now, strict=strict)
        assert entry.node == "home"
        for node in nodes:
            alone = self.ledger.refusal(replace(entry, node=node), self.now, strict=strict)
            assert many[node] == alone, (node, many[node], alone)

    @rule(
        namespace=st.sampled_from(NAMESPACES),
        node=st.sampled_from((*NODES, "ghost")),
        ram=SIZES,
        vram=SIZES,
        expires=EXPIRIES,
        wait=st.integers(1, 150),
        strict=st.booleans(),
    )
    def reserve_or_wait(
        self,
        namespace: str,
        node: str,
        ram: int,
        vram: int,
        expires: int | None,
        wait: int,
        strict: bool,
    ) -> None:
        until = self.now + timedelta(seconds=wait)
        entry = self._entry(namespace, node, ram, vram, expires, until)
        before = self._usage_now()
        foreseen = outlook(self.ledger, entry, self.now, until, strict=strict)
        decision = self.ledger.reserve_or_wait(entry, self.now, until, strict=strict)
        assert_outlook_says(foreseen, decision)
        if decision.admitted:
            self._check_admitted([decision])
            key = (entry.created_at, entry.id)
            older = [w for w in self.ledger.waiting.on(node) if w.key < key]
            blocking = [w for w in older if self._blocks(w, namespace)]
            assert not (strict and blocking), "went ahead of an older room waiter (strict FIFO)"
            return
        assert self._usage_now() == before, "a refusal changed a quota's usage"
        assert decision.queued is (entry.id in self.ledger.waiting)
        assert decision.queued is (decision.reason in WAITABLE), decision
        if decision.queued and self.ledger.knows(node):  # else: NodeUnknown is said first
            forbidden = self._forbidden(entry)
            assert forbidden is None, f"queued ({decision.reason}) though {forbidden}"
        if decision.reason == Reason.WAITERS_AHEAD:
            key = (entry.created_at, entry.id)
            ahead = [w for w in self.ledger.waiting.on(node) if w.key < key]
            assert any(self._blocks(w, namespace) for w in ahead), (
                "WaitersAhead with no one ahead waiting for the node's room"
            )

    @precondition(lambda self: bool(set(self.ledger.waiting.nodes()) & set(NODES)))
    @rule(
        data=st.data(),
        namespace=st.sampled_from(NAMESPACES),
        ram=SIZES,
        vram=SIZES,
        expires=EXPIRIES,
        wait=st.integers(1, 150),
        strict=st.booleans(),
    )
    def claim_behind_waiters(
        self,
        data: st.DataObject,
        namespace: str,
        ram: int,
        vram: int,
        expires: int | None,
        wait: int,
        strict: bool,
    ) -> None:
        """A claim on a node where others wait (strict FIFO decides who goes first)."""
        node = data.draw(st.sampled_from([n for n in self.ledger.waiting.nodes() if n in NODES]))
        self.reserve_or_wait(namespace, node, ram, vram, expires, wait, strict)

    @precondition(lambda self: any(self._governing(namespace) for namespace in NAMESPACES))
    @rule(
        data=st.data(),
        node=st.sampled_from(NODES),
        ram=SIZES,
        vram=SIZES,
        expires=EXPIRIES,
        wait=st.none() | st.integers(1, 150),
        strict=st.booleans(),
    )
    def claim_under_a_quota(
        self,
        data: st.DataObject,
        node: str,
        ram: int,
        vram: int,
        expires: int | None,
        wait: int | None,
        strict: bool,
    ) -> None:
        """A claim in a namespace some quota governs (the others are mostly unlimited)."""
        governed = [namespace for namespace in NAMESPACES if self._governing(namespace)]
        namespace = data.draw(st.sampled_from(governed))
        if wait is None:
            self.reserve(namespace, node, ram, vram, expires)
        else:
            self.reserve_or_wait(namespace, node, ram, vram, expires, wait, strict)

    @precondition(lambda self: len(self.ledger) > 0)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(sorted(self.ledger.entries(), key=lambda e: e.id)))
        self._release(entry, strict=data.draw(st.booleans()))

    @precondition(lambda self: len(self.ledger) > 0 and bool(self.ledger.quota_waiters()))
    @rule(data=st.data())
    def release_where_a_quota_waits(self, data: st.DataObject) -> None:
        """A release in a namespace sharing a quota with someone waiting for it."""
        waiting = {namespace_of(w.entry_id) for w in self._all_waiting() if w.for_quota}
        sharing = sorted(
            (
                e
                for e in self.ledger.entries()
                if any(self._shares_a_quota(namespace_of(e.id), other) for other in waiting)
            ),
            key=lambda e: e.id,
        )
        if sharing:
            self._release(data.draw(st.sampled_from(sharing)), strict=data.draw(st.booleans()))

    def _release(self, entry: Entry, *, strict: bool) -> None:
        self.ledger.release(entry.id)
        self._settle(entry.node)
        # The operator then tries the node's queue and the waiters of the namespace's quotas.
        namespace = namespace_of(entry.id)
        expected = {
            w.entry.node
            for w in self._all_waiting()
            if w.for_quota and self._shares_a_quota(namespace, namespace_of(w.entry_id))
        }
        nodes = self.ledger.quota_waiters(namespace)
        assert expected <= nodes, "a quota waiter the release may let in was not found"
        self._admit({entry.node} | nodes, strict=strict)

    @precondition(lambda self: len(self.ledger) > 0)
    @rule(data=st.data(), back=st.integers(-30, 0))
    def heartbeat(self, data: st.DataObject, back: int) -> None:
        entry = data.draw(st.sampled_from(sorted(self.ledger.entries(), key=lambda e: e.id)))
        self.ledger.heartbeat(entry.id, self.now + timedelta(seconds=back))

    @rule(seconds=st.integers(0, 90))
    def advance(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def reclaim(self) -> None:
        for item in self.ledger.reclaim(self.now):
            self._settle(item.entry.node)

    @rule(strict=st.booleans(), which=st.sampled_from(["queues", "quotas"]))
    def admit_waiting(self, strict: bool, which: str) -> None:
        nodes = self.ledger.waiting.nodes() if which == "queues" else self.ledger.quota_waiters()
        self._admit(nodes, strict=strict)

    @rule()
    def waits_run_out(self) -> None:
        for decision in self.ledger.wait_over(self.now):
            assert not decision.admitted
            assert decision.entry.id not in self.ledger.waiting
            assert decision.reason in (Reason.WAIT_TIMEOUT, Reason.ALREADY_EXPIRED)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def governance_is_what_the_labels_and_selectors_say(self) -> None:
        quotas = self.ledger.quotas
        assert quotas.names() == sorted(self.rules)
        for namespace in NAMESPACES:
            governing = [rules.name for rules in quotas.governing(namespace)]
            assert governing == self._governing(namespace), namespace
        for name in self.rules:
            assert quotas.rules(name) == self.rules[name]

    @invariant()
    def usage_equals_a_recount(self) -> None:
        for name in QUOTAS:
            assert self.ledger.quotas.used(name) == self._recount(name), name
        for namespace in NAMESPACES:
            held = [e for e in self.ledger.entries() if namespace_of(e.id) == namespace]
            assert self.ledger.quotas.used_by(namespace) == _sum(held)

    @invariant()
    def a_rebuilt_ledger_counts_the_same(self) -> None:
        for quotas_first in (True, False):
            rebuilt = Ledger(self.limits)
            for node, (total, vram, limits) in self.capacity.items():
                rebuilt.set_node_capacity(node, total, vram, limits)
            if quotas_first:
                self._configure(rebuilt)
            rebuilt.restore(_copies(self.ledger.entries()))
            if not quotas_first:
                self._configure(rebuilt)
            for name in QUOTAS:
                assert rebuilt.quotas.used(name) == self.ledger.quotas.used(name)

    @invariant()
    def never_overcommitted_by_admission(self) -> None:
        for node in self.capacity:
            if node not in self.shrunk:
                assert not self._over(node)

    @invariant()
    def waiting_ones_hold_nothing(self) -> None:
        for waiting in self._all_waiting():
            assert self.ledger.get(waiting.entry_id) is None

    # -- checks -----------------------------------------------------------------------------

    def _check_admitted(self, decisions: Iterable[Decision]) -> None:
        """(a) and (c) for entries just admitted (usage only grew since each one)."""
        for decision in decisions:
            entry = decision.entry
            assert decision.admitted
            assert self.ledger.get(entry.id) is entry
            namespace = namespace_of(entry.id)
            governing = [self.rules[name] for name in self._governing(namespace)]
            if not governing:
                assert not self.ledger.quotas.deny_unselected, "admitted under Deny"
            for rules in governing:
                assert rules.invalid is None, f"admitted under invalid quota {rules.name}"
                used = self._recount(rules.name)
                assert _within(rules, used), f"{rules.name} over after admitting {entry.id}"
                if rules.nodes is not None:
                    assert rules.nodes.matches(self.node_labels.get(entry.node, {}))
                if rules.max_lifetime is not None:
                    assert entry.expires_at is not None, "no expiry under a maxLifetime"
                    assert entry.expires_at - entry.created_at <= rules.max_lifetime
                if rules.max_wait is not None and entry.wait_until is not None:
                    assert entry.wait_until - entry.created_at <= rules.max_wait
            given = [r.lifetime_given for r in governing if r.lifetime_given is not None]
            if entry.given_expiry is not None:
                assert given
                assert entry.given_expiry == entry.created_at + min(given)
                assert entry.expires_at == entry.given_expiry
            assert entry.expires_at is None or entry.expires_at > self.now
            summary = self.ledger.node_summary(entry.node, self.now)
            assert summary.capacity_known
            if entry.ram_mb:
                assert not self._over(entry.node), f"admission pushed {entry.node} over"
            if entry.vram_mb and summary.limit_vram_mb is not None:
                assert summary.reserved_vram_mb <= summary.limit_vram_mb

    def _admit(self, nodes: Iterable[str], *, strict: bool) -> None:
        nodes = set(nodes)
        admitted = self.ledger.admit_waiting(self.now, nodes, strict=strict)
        for decision in admitted:
            assert decision.entry.id not in self.ledger.waiting
        self._check_admitted(admitted)
        if not strict:
            self._check_queue_after_best_effort(nodes)
            return
        for node in nodes:
            queue = self.ledger.waiting.on(node)
            for index, waiting in enumerate(queue):
                if self.ledger.refusal(waiting.entry, self.now) is None:
                    mine = namespace_of(waiting.entry_id)
                    blockers = [w for w in queue[:index] if self._blocks(w, mine)]
                    assert blockers, f"{waiting.entry_id} fits but was held back by no one"

    def _check_queue_after_best_effort(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            for waiting in self.ledger.waiting.on(node):
                refusal = self.ledger.refusal(waiting.entry, self.now)
                assert refusal is not None, f"{waiting.entry_id} fits but still waits"
                holds_back_no_one = refusal[0] in QUOTA_REASONS or (
                    refusal[0] == Reason.ALREADY_EXPIRED
                )
                assert waiting.for_quota is holds_back_no_one, (waiting, refusal)

    # -- helpers ----------------------------------------------------------------------------

    def _blocks(self, waiting: Waiting, namespace: str) -> bool:
        """Whether ``waiting`` holds back a later claim of ``namespace`` under strict FIFO:
        it waits for the node's room, or for a quota ``namespace`` shares with it."""
        return not waiting.for_quota or self.ledger.quotas.share(
            namespace, namespace_of(waiting.entry_id)
        )

    def _entry(
        self,
        namespace: str,
        node: str,
        ram: int,
        vram: int,
        expires: int | None,
        until: datetime | None,
    ) -> Entry:
        self.ids += 1
        return Entry(
            id=f"{namespace}/r{self.ids}",
            node=node,
            ram_mb=ram,
            vram_mb=vram,
            created_at=self.now,
            last_heartbeat=self.now,
            expires_at=None if expires is None else self.now + timedelta(seconds=expires),
            owner=Owner(),
            wait_until=until,
        )

    def _forbidden(self, entry: Entry) -> str | None:
        """What a valid quota of the entry's namespace refuses for good, worked out here."""
        for name in self._governing(namespace_of(entry.id)):
            rules = self.rules[name]
            if rules.invalid is not None:
                continue
            if rules.nodes is not None and not rules.nodes.matches(
                self.node_labels.get(entry.node, {})
            ):
                return f"{name} forbids node {entry.node}"
            lifetime = entry.expires_at - entry.created_at if entry.expires_at else None
            if rules.max_lifetime is not None and lifetime and lifetime > rules.max_lifetime:
                return f"{name} forbids its lifetime"
            wait = entry.wait_until - entry.created_at if entry.wait_until else None
            if rules.max_wait is not None and wait and wait > rules.max_wait:
                return f"{name} forbids its wait"
        return None

    def _labels(self, namespace: str) -> Mapping[str, str]:
        return self.namespace_labels.get(namespace) or {NAME_LABEL: namespace}

    def _governing(self, namespace: str) -> list[str]:
        labels = self._labels(namespace)
        return sorted(name for name, r in self.rules.items() if r.namespaces.matches(labels))

    def _shares_a_quota(self, one: str, other: str) -> bool:
        return one == other or bool(set(self._governing(one)) & set(self._governing(other)))

    def _recount(self, name: str) -> Usage:
        if name not in self.rules:
            return Usage()
        return _sum(e for e in self.ledger.entries() if name in self._governing(namespace_of(e.id)))

    def _usage_now(self) -> dict[str, Usage]:
        return {name: self.ledger.quotas.used(name) for name in QUOTAS}

    def _all_waiting(self) -> list[Waiting]:
        return [w for node in self.ledger.waiting.nodes() for w in self.ledger.waiting.on(node)]

    def _configure(self, ledger: Ledger) -> None:
        """The quotas, namespaces and node labels of this machine, on ``ledger``."""
        ledger.set_deny_unselected(self.ledger.quotas.deny_unselected)
        for namespace, labels in self.namespace_labels.items():
            ledger.set_namespace(namespace, labels)
        for rules in self.rules.values():
            ledger.set_quota(rules)
        for node, labels in self.node_labels.items():
            ledger.set_node_labels(node, labels)

    def _set_capacity(self, node: str, total: int, vram: int | None, limits: Limits) -> None:
        self.ledger.set_node_capacity(node, total, vram, limits)
        self.capacity[node] = (total, vram, limits)
        if self._over(node):
            self.shrunk.add(node)

    def _reserved(self, node: str) -> int:
        return sum(e.ram_mb for e in self.ledger.entries_for_node(node))

    def _over(self, node: str) -> bool:
        limit = self.ledger.node_summary(node, self.now).limit_ram_mb
        return limit is not None and self._reserved(node) > limit

    def _settle(self, node: str) -> None:
        if not self._over(node):
            self.shrunk.discard(node)

    def _settle_quota_change(self) -> None:
        """After a quota or a namespace's governance changed, the operator tries every
        quota waiter (best effort here; strict FIFO is exercised by admit_waiting)."""
        nodes = self.ledger.quota_waiters()
        expected = {w.entry.node for w in self._all_waiting() if w.for_quota}
        assert expected == nodes
        self._admit(nodes, strict=False)


def _within(rules: QuotaRules, used: Usage) -> bool:
    return (
        (rules.ram_mb is None or used.ram_mb <= rules.ram_mb)
        and (rules.vram_mb is None or used.vram_mb <= rules.vram_mb)
        and (rules.max_entries is None or used.entries <= rules.max_entries)
    )


def _sum(entries: Iterable[Entry]) -> Usage:
    total = Usage()
    for entry in entries:
        total.add(Usage(entry.ram_mb, entry.vram_mb, 1))
    return total


def _copies(entries: Iterable[Entry]) -> list[Entry]:
    """The entries as a rebuild reads them back from the API: new objects, same fields."""
    return [dataclasses.replace(e) for e in entries]


QuotaMachine.TestCase.settings = settings(
    max_examples=500,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestQuotaProperties = QuotaMachine.TestCase
