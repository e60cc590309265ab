"""Quotas per tenant (HeadroomQuota) in the pure ledger, case by case.

The property tests (test_quota_properties.py) explore the histories; these pin
the refusals, their words and numbers, and the changes a quota goes through.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.api.selectors import LabelSelector, LabelSelectorRequirement
from headroom.ledger import Ledger
from headroom.ledger.quotas import QuotaRules, Quotas, Usage
from tests.unit.test_core_admission import T0, entry

LATER = T0 + timedelta(minutes=10)
GIB = 1024


def team(*names: str) -> LabelSelector:
    """Namespaces whose label team is one of ``names``."""
    return LabelSelector(
        match_expressions=[LabelSelectorRequirement(key="team", operator="In", values=list(names))]
    )


def ledger(*, nodes: int = 2, total: int = 512 * GIB, vram: int | None = 80 * GIB) -> Ledger:
    """Nodes n1..nN with room to spare (the quota, not the node, is what refuses), and
    namespaces ml, ml-dev (team ml), web (team web) and loose (no team)."""
    book = Ledger(Limits(heartbeat_stale_window=timedelta(minutes=5)))
    for number in range(1, nodes + 1):
        book.set_node_capacity(f"n{number}", total, vram)
        book.set_node_labels(f"n{number}", {"pool": "gpu" if number == 1 else "cpu"})
    for namespace, labels in (
        ("ml", {"team": "ml"}),
        ("ml-dev", {"team": "ml"}),
        ("web", {"team": "web"}),
        ("loose", {}),
    ):
        book.set_namespace(namespace, labels)
    return book


# -- bugs found in review ---------------------------------------------------------------


def test_a_quota_changed_to_select_other_namespaces_does_not_carry_negative_usage() -> None:
    """set_quota used to subtract what a namespace held from the *new* quota's usage when
    the new selector no longer picked it, though the new quota never counted it: the
    quota then believed its namespaces held less than nothing and let them over."""
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=64 * GIB))
    assert book.reserve(entry("ml/a", 40 * GIB), T0).admitted
    book.set_quota(QuotaRules("q", team("web"), ram_mb=64 * GIB))
    assert book.quotas.namespaces_of("q") == ["web"]
    assert book.quotas.used("q").ram_mb == 0
    assert book.reserve(entry("web/a", 60 * GIB), T0).admitted
    refused = book.reserve(entry("web/b", 8 * GIB), T0)
    assert refused.reason == Reason.QUOTA_EXCEEDED
    assert "holds 60 GiB of 64 GiB RAM; requested 8 GiB" in refused.message


def test_a_quota_over_on_one_dimension_admits_nothing_new_on_the_other() -> None:
    """A quota lowered under what is held admits nothing new until usage falls below it:
    a claim asking only for VRAM used to pass while the namespace was over on RAM."""
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=64 * GIB, vram_mb=40 * GIB))
    assert book.reserve(entry("ml/a", 48 * GIB), T0).admitted
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=32 * GIB, vram_mb=40 * GIB))
    assert book.quotas.over("q")
    refused = book.reserve(entry("ml/gpu", 0, vram=8 * GIB), T0)
    assert (refused.admitted, refused.reason) == (False, Reason.QUOTA_EXCEEDED)
    assert "holds 48 GiB of 32 GiB RAM" in refused.message
    book.release("ml/a")
    assert book.reserve(entry("ml/gpu", 0, vram=8 * GIB), T0).admitted


def test_a_final_refusal_of_one_quota_is_not_hidden_by_another_s_wait() -> None:
    """Bound by two quotas: the node one of them forbids is Rejected NodeNotAllowed, even
    when the other (first by name) is full. It used to be Queued QuotaExceeded, to wait
    in vain until its wait ran out."""
    book = ledger()
    book.set_quota(QuotaRules("a-room", team("ml"), ram_mb=16 * GIB))
    gpu_only = LabelSelector(match_labels={"pool": "gpu"})
    book.set_quota(QuotaRules("b-nodes", team("ml"), nodes=gpu_only))
    assert book.reserve(entry("ml/held", 16 * GIB), T0).admitted
    refused = book.reserve_or_wait(entry("ml/cpu", GIB, node="n2"), T0, LATER)
    assert (refused.queued, refused.reason) == (False, Reason.NODE_NOT_ALLOWED)
    assert "namespace ml (quota b-nodes): node n2 is outside spec.nodeSelector (pool=gpu)" in (
        refused.message
    )
    # On its allowed node it waits for the full quota.
    queued = book.reserve_or_wait(entry("ml/gpu", GIB), T0, LATER)
    assert (queued.queued, queued.reason) == (True, Reason.QUOTA_EXCEEDED)


def full_node(book: Ledger, node: str = "n1") -> None:
    """Fill ``node`` (web/holder holds all it allows) so that claims on it wait for room."""
    left = book.allocatable_ram(node)
    assert book.reserve(entry("web/holder", left, node=node), T0).admitted


def test_under_strict_fifo_waiters_ahead_do_not_turn_a_final_refusal_into_a_wait() -> None:
    """A claim its quota refuses for good is Rejected at once, even with others waiting for
    room on the node; it used to be Queued WaitersAhead and to wait in vain."""
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), nodes=LabelSelector(match_labels={"pool": "cpu"})))
    full_node(book)
    assert book.reserve_or_wait(entry("web/waits", GIB), T0, LATER, strict=True).queued
    late = entry("ml/x", GIB, at=T0 + timedelta(seconds=1))  # behind web/waits
    refused = book.reserve_or_wait(late, T0, LATER, strict=True)
    assert (refused.queued, refused.reason) == (False, Reason.NODE_NOT_ALLOWED)
    # One that may wait still waits behind, as before.
    later = entry("web/later", GIB, at=T0 + timedelta(seconds=2))
    behind = book.reserve_or_wait(later, T0, LATER, strict=True)
    assert (behind.queued, behind.reason) == (True, Reason.WAITERS_AHEAD)


def by_name(*namespaces: str) -> LabelSelector:
    """Namespaces by name, with the label the API server gives every namespace."""
    return LabelSelector(
        match_expressions=[
            LabelSelectorRequirement(
                key="kubernetes.io/metadata.name", operator="In", values=list(namespaces)
            )
        ]
    )


def test_a_namespace_not_seen_yet_is_governed_by_the_quotas_that_select_it_by_name() -> None:
    """Before its Namespace is seen, a namespace has the label the API server gives all
    (kubernetes.io/metadata.name). Its claims used to be counted in no quota and refused
    by none until something re-governed it: unlimited, or NoQuota under Deny."""
    book = Ledger(Limits(heartbeat_stale_window=timedelta(minutes=5)))
    book.set_node_capacity("n1", 512 * GIB, None)
    book.set_deny_unselected(True)
    book.set_quota(QuotaRules("q", by_name("fresh"), ram_mb=64 * GIB))
    assert not book.quotas.knows_namespace("fresh")
    assert book.reserve(entry("fresh/a", 60 * GIB), T0).admitted
    assert book.quotas.used("q").ram_mb == 60 * GIB
    refused = book.reserve(entry("fresh/b", 8 * GIB), T0)
    assert refused.reason == Reason.QUOTA_EXCEEDED
    assert "namespace fresh (quota q): holds 60 GiB of 64 GiB RAM; requested 8 GiB" in (
        refused.message
    )
    assert book.reserve(entry("other/a", GIB), T0).reason == Reason.NO_QUOTA
    book.release("fresh/a")
    assert book.quotas.used("q").ram_mb == 0


# -- refusals and their words ---------------------------------------------------------------


def test_over_its_ram_the_namespace_is_refused_with_the_numbers() -> None:
    book = ledger()
    book.set_quota(QuotaRules("team-ml", team("ml"), ram_mb=64 * GIB))
    assert book.reserve(entry("ml/a", 40 * GIB), T0).admitted
    assert book.reserve(entry("ml-dev/b", 16 * GIB, node="n2"), T0).admitted  # shares it
    refused = book.reserve(entry("ml/c", 16 * GIB), T0)
    assert (refused.admitted, refused.queued, refused.reason) == (
        False,
        False,
        Reason.QUOTA_EXCEEDED,
    )
    assert refused.message == (
        "namespace ml (quota team-ml): holds 56 GiB of 64 GiB RAM; requested 16 GiB"
    )
    assert book.get("ml/c") is None
    assert book.quotas.used("team-ml") == Usage(56 * GIB, 0, 2)
    assert book.reserve(entry("ml/d", 8 * GIB), T0).admitted  # exactly the limit
    assert book.quotas.used("team-ml").ram_mb == 64 * GIB
    assert book.reserve(entry("web/a", 100 * GIB), T0).admitted  # another tenant: not bound


def test_vram_and_entries_are_limits_of_their_own_and_odd_sizes_are_in_mib() -> None:
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), vram_mb=20 * GIB, max_entries=2))
    assert book.reserve(entry("ml/a", 1, vram=16 * GIB), T0).admitted
    vram = book.reserve(entry("ml/b", 1, vram=5000), T0)
    assert (vram.reason, vram.message) == (
        Reason.QUOTA_EXCEEDED,
        "namespace ml (quota q): holds 16 GiB of 20 GiB VRAM; requested 5000 MiB",
    )
    assert book.reserve(entry("ml/b", 100 * GIB), T0).admitted  # RAM is not limited
    entries = book.reserve(entry("ml/c", 1), T0)
    assert (entries.reason, entries.message) == (
        Reason.QUOTA_EXCEEDED,
        "namespace ml (quota q): holds 2 of 2 entries (spec.maxEntries)",
    )


def test_over_its_quota_a_claim_that_may_wait_is_queued_and_a_release_lets_it_in() -> None:
    book = ledger()
    book.set_quota(QuotaRules("team-ml", team("ml"), ram_mb=64 * GIB))
    assert book.reserve(entry("ml/a", 56 * GIB), T0).admitted
    queued = book.reserve_or_wait(entry("ml/b", 16 * GIB, node="n2"), T0, LATER)
    assert (queued.queued, queued.reason, queued.position) == (True, Reason.QUOTA_EXCEEDED, 1)
    assert queued.message.startswith(
        "namespace ml (quota team-ml): holds 56 GiB of 64 GiB RAM; requested 16 GiB; waits until"
    )
    assert book.quotas.used("team-ml").ram_mb == 56 * GIB  # a waiter holds nothing
    # The node has room: only the quota's waiters care about a release in the namespace.
    assert book.quota_waiters("ml") == {"n2"}
    assert book.admit_waiting(T0, book.quota_waiters("ml")) == []
    book.release("ml/a")
    admitted = book.admit_waiting(T0, book.quota_waiters("ml"))
    assert [(d.entry.id, d.reason) for d in admitted] == [("ml/b", Reason.FITS)]
    assert book.quota_waiters("ml") == set()


def test_a_namespace_no_quota_selects_is_unlimited_or_denied_as_configured() -> None:
    book = ledger()
    book.set_quota(QuotaRules("team-ml", team("ml"), ram_mb=64 * GIB))
    assert book.reserve(entry("loose/a", 300 * GIB), T0).admitted
    book.set_deny_unselected(True)
    refused = book.reserve_or_wait(entry("loose/b", GIB), T0, LATER)
    assert (refused.queued, refused.reason) == (True, Reason.NO_QUOTA)
    assert refused.message.startswith(
        "namespace loose: no HeadroomQuota selects it, and namespaces without one may hold "
        "nothing (quotas.unselectedNamespaces Deny)"
    )
    assert book.reserve(entry("ml/a", GIB), T0).admitted  # selected: its quota decides
    assert book.get("loose/a") is not None  # what was held stays held
    # A quota that selects it now lets the waiter in.
    book.set_quota(QuotaRules("rest", LabelSelector(), ram_mb=400 * GIB))
    assert [d.entry.id for d in book.admit_waiting(T0, book.quota_waiters())] == ["loose/b"]


def test_deny_is_a_setting_of_quotas() -> None:
    assert Quotas(deny_unselected=True).deny_unselected
    assert not Quotas().deny_unselected


def test_an_invalid_quota_admits_nothing_new_in_its_namespaces_until_fixed() -> None:
    book = ledger()
    broken = QuotaRules("q", team("ml"), ram_mb=64 * GIB, invalid="spec.ramMB: not a quantity")
    book.set_quota(broken)
    refused = book.reserve_or_wait(entry("ml/a", GIB), T0, LATER)
    assert (refused.queued, refused.reason) == (True, Reason.QUOTA_INVALID)
    assert refused.message.startswith(
        "namespace ml (quota q): the quota cannot be used: spec.ramMB: not a quantity"
    )
    assert book.reserve(entry("web/a", GIB), T0).admitted  # isolated to its namespaces
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=64 * GIB))
    assert [d.entry.id for d in book.admit_waiting(T0, book.quota_waiters("ml"))] == ["ml/a"]


def test_a_node_outside_the_quota_s_node_selector_is_not_allowed() -> None:
    book = ledger()
    gpu = LabelSelector(match_labels={"pool": "gpu"})
    book.set_quota(QuotaRules("q", team("ml"), nodes=gpu))
    refused = book.reserve_or_wait(entry("ml/a", GIB, node="n2"), T0, LATER)
    assert (refused.queued, refused.reason, refused.message) == (
        False,
        Reason.NODE_NOT_ALLOWED,
        "namespace ml (quota q): node n2 is outside spec.nodeSelector (pool=gpu)",
    )
    assert book.reserve(entry("ml/a", GIB, node="n1"), T0).admitted
    assert book.reserve(entry("web/a", GIB, node="n2"), T0).admitted  # not its quota
    book.set_node_labels("n2", {"pool": "gpu"})  # relabelled: allowed now
    assert book.reserve(entry("ml/b", GIB, node="n2"), T0).admitted
    book.set_node_labels("n2", None)  # the Node is gone: no labels, not selected
    assert book.refusal(entry("ml/c", GIB, node="n2"), T0) is not None
    assert book.reserve(entry("ml/c", GIB, node="n2"), T0).reason == Reason.NODE_NOT_ALLOWED


def test_an_unknown_node_is_unknown_before_it_is_not_allowed() -> None:
    book = ledger()
    gpu = LabelSelector(match_labels={"pool": "gpu"})
    book.set_quota(QuotaRules("q", team("ml"), nodes=gpu))
    assert book.reserve(entry("ml/a", GIB, node="n9"), T0).reason == Reason.NODE_UNKNOWN


def test_a_lifetime_longer_than_the_quota_allows_is_refused_naming_the_fields() -> None:
    book = ledger()
    rules = QuotaRules("q", team("ml"), max_lifetime=timedelta(hours=2))
    book.set_quota(rules)
    too_long = entry("ml/a", GIB, expires=T0 + timedelta(hours=2, minutes=30))
    refused = book.reserve_or_wait(too_long, T0, LATER)
    assert (refused.queued, refused.reason, refused.message) == (
        False,
        Reason.LIFETIME_TOO_LONG,
        "namespace ml (quota q): spec.expiresAt 2026-12-02T14:30:00+00:00 is 2h30m after "
        "creation; spec.maxLifetime is 2h",
    )
    # Counted from creation, not from now: a claim decided late gets no more.
    late = entry(
        "ml/b", GIB, at=T0 - timedelta(hours=1), expires=T0 + timedelta(hours=1, seconds=1)
    )
    assert book.reserve(late, T0).reason == Reason.LIFETIME_TOO_LONG
    assert book.reserve(entry("ml/c", GIB, expires=T0 + timedelta(hours=2)), T0).admitted


def test_a_wait_longer_than_the_quota_allows_is_refused() -> None:
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), max_wait=timedelta(minutes=5)))
    long_wait = entry("ml/a", GIB, wait_until=T0 + timedelta(minutes=5, seconds=1))
    refused = book.reserve_or_wait(long_wait, T0, long_wait.wait_until)
    assert (refused.queued, refused.reason, refused.message) == (
        False,
        Reason.WAIT_TOO_LONG,
        "namespace ml (quota q): spec.wait 5m1s is longer than spec.maxWait 5m",
    )
    short = entry("ml/b", GIB, wait_until=T0 + timedelta(minutes=5))
    assert book.reserve_or_wait(short, T0, short.wait_until).admitted
    assert book.reserve(entry("ml/c", GIB), T0).admitted  # no wait at all


def test_the_default_lifetime_gives_an_expiry_to_a_claim_that_sets_none() -> None:
    book = ledger()
    book.set_quota(
        QuotaRules(
            "q",
            team("ml"),
            default_lifetime=timedelta(hours=1),
            max_lifetime=timedelta(hours=4),
        )
    )
    given = book.reserve(entry("ml/a", GIB), T0).entry
    assert given.expires_at == given.given_expiry == T0 + timedelta(hours=1)
    own = book.reserve(entry("ml/b", GIB, expires=T0 + timedelta(hours=3)), T0).entry
    assert (own.expires_at, own.given_expiry) == (T0 + timedelta(hours=3), None)
    free = book.reserve(entry("web/a", GIB), T0).entry  # no quota: no expiry
    assert (free.expires_at, free.given_expiry) == (None, None)
    # Enforced like spec.expiresAt: reclaimed when it passes, heartbeats or not.
    book.heartbeat("ml/a", T0 + timedelta(hours=1))
    due = {r.entry.id: r.reason for r in book.due(T0 + timedelta(hours=1))}
    assert due["ml/a"] == Reason.EXPIRED


def test_the_expiry_given_is_the_shortest_of_the_valid_quotas_or_their_maximum() -> None:
    book = ledger()
    book.set_quota(QuotaRules("a", team("ml"), default_lifetime=timedelta(hours=3)))
    book.set_quota(QuotaRules("b", team("ml"), max_lifetime=timedelta(hours=2)))
    book.set_quota(
        QuotaRules("c", team("web"), default_lifetime=timedelta(minutes=1), invalid="bad")
    )
    assert book.reserve(entry("ml/a", GIB), T0).entry.given_expiry == T0 + timedelta(hours=2)
    assert book.quotas.expiry(entry("web/x", GIB)) is None  # an invalid quota gives nothing


def test_a_waiter_given_a_lifetime_it_outlived_while_waiting_is_not_admitted() -> None:
    book = ledger()
    book.set_quota(
        QuotaRules("q", team("ml"), ram_mb=4 * GIB, default_lifetime=timedelta(minutes=5))
    )
    assert book.reserve(entry("ml/a", 4 * GIB), T0).admitted
    assert book.reserve_or_wait(entry("ml/b", GIB), T0, T0 + timedelta(hours=1)).queued
    book.release("ml/a")
    assert book.admit_waiting(T0 + timedelta(minutes=5), {"n1"}) == []
    assert book.refusal(entry("ml/b", GIB), T0 + timedelta(minutes=5)) == (
        Reason.ALREADY_EXPIRED,
        "the lifetime its quota gives ran out at 2026-12-02T12:05:00+00:00 "
        "(now 2026-12-02T12:05:00+00:00)",
    )


# -- several quotas, relabels, changes ------------------------------------------------------


def test_a_namespace_under_two_quotas_is_bound_by_both() -> None:
    book = ledger()
    book.set_namespace("ml", {"team": "ml", "tier": "gold"})
    book.set_namespace("web", {"team": "web", "tier": "gold"})
    gold = LabelSelector(match_labels={"tier": "gold"})
    book.set_quota(QuotaRules("team-ml", team("ml"), ram_mb=64 * GIB))
    book.set_quota(QuotaRules("gold", gold, ram_mb=100 * GIB))
    assert [r.name for r in book.quotas.governing("ml")] == ["gold", "team-ml"]
    assert book.reserve(entry("web/a", 80 * GIB), T0).admitted  # gold only
    refused = book.reserve(entry("ml/a", 32 * GIB), T0)  # team-ml has room, gold does not
    assert refused.message == (
        "namespace ml (quota gold): holds 80 GiB of 100 GiB RAM; requested 32 GiB"
    )
    assert book.reserve(entry("ml/a", 20 * GIB), T0).admitted
    assert book.quotas.used("gold") == Usage(100 * GIB, 0, 2)
    assert book.quotas.used("team-ml") == Usage(20 * GIB, 0, 1)
    book.release("web/a")
    refused = book.reserve(entry("ml/b", 48 * GIB), T0)  # gold has room, team-ml does not
    assert refused.message == (
        "namespace ml (quota team-ml): holds 20 GiB of 64 GiB RAM; requested 48 GiB"
    )
    assert book.quotas.share("ml", "web")
    assert book.quotas.share("ml", "ml-dev")
    assert not book.quotas.share("ml-dev", "web")


def test_a_relabelled_namespace_carries_what_it_holds_from_one_quota_to_another() -> None:
    book = ledger()
    book.set_quota(QuotaRules("team-ml", team("ml"), ram_mb=64 * GIB))
    book.set_quota(QuotaRules("team-web", team("web"), ram_mb=128 * GIB))
    assert book.reserve(entry("ml-dev/a", 40 * GIB), T0).admitted
    assert book.reserve(entry("web/a", 30 * GIB), T0).admitted
    assert book.set_namespace("ml-dev", {"team": "web"})  # governance changed
    assert book.quotas.used("team-ml") == Usage()
    assert book.quotas.used("team-web") == Usage(70 * GIB, 0, 2)
    assert book.quotas.namespaces_of("team-web") == ["ml-dev", "web"]
    assert book.reserve(entry("web/b", GIB), T0).admitted
    assert book.reserve(entry("ml-dev/b", 60 * GIB), T0).reason == Reason.QUOTA_EXCEEDED
    assert book.reserve(entry("ml/b", 60 * GIB), T0).admitted  # team-ml is empty now
    assert not book.set_namespace("ml-dev", {"team": "web"})  # the same labels
    assert not book.set_namespace("ml-dev", {"team": "web", "x": "y"})  # same quotas
    book.set_namespace("ml-dev", {})  # no quota any more
    assert book.quotas.used("team-web") == Usage(31 * GIB, 0, 2)
    assert book.quotas.used_by("ml-dev") == Usage(40 * GIB, 0, 1)
    book.release("ml-dev/a")
    assert book.quotas.used_by("ml-dev") == Usage()
    assert book.quotas.used("team-web") == Usage(31 * GIB, 0, 2)


def test_a_namespace_removed_falls_back_to_its_name_label() -> None:
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=64 * GIB))
    assert book.reserve(entry("ml/a", 10 * GIB), T0).admitted
    book.remove_namespace("ml")
    assert not book.quotas.knows_namespace("ml")
    assert book.quotas.used("q") == Usage()
    assert book.quotas.used_by("ml") == Usage(10 * GIB, 0, 1)
    book.release("ml/a")
    assert book.quotas.used_by("ml") == Usage()


def test_a_deleted_quota_releases_its_waiters_to_the_default() -> None:
    book = ledger()
    book.set_quota(QuotaRules("team-ml", team("ml"), ram_mb=16 * GIB))
    assert book.reserve(entry("ml/a", 16 * GIB), T0).admitted
    assert book.reserve_or_wait(entry("ml/b", 8 * GIB, node="n2"), T0, LATER).queued
    assert book.reserve_or_wait(entry("ml-dev/c", 8 * GIB), T0, LATER).queued
    assert book.remove_quota("team-ml")
    assert not book.remove_quota("team-ml")
    assert book.quotas.governing("ml") == []
    # The operator tries every quota waiter after a quota change (None: all of them).
    assert book.quota_waiters() == {"n1", "n2"}
    admitted = book.admit_waiting(T0, book.quota_waiters())
    assert sorted(d.entry.id for d in admitted) == ["ml-dev/c", "ml/b"]  # default: unlimited


def test_a_deleted_quota_under_deny_leaves_its_waiters_waiting_for_another() -> None:
    book = ledger()
    book.set_deny_unselected(True)
    book.set_quota(QuotaRules("team-ml", team("ml"), ram_mb=16 * GIB))
    assert book.reserve(entry("ml/a", 16 * GIB), T0).admitted
    assert book.reserve_or_wait(entry("ml/b", 8 * GIB), T0, LATER).queued
    book.remove_quota("team-ml")
    assert book.admit_waiting(T0, book.quota_waiters()) == []
    assert book.waiting.get("ml/b") is not None
    assert book.refusal(entry("ml/b", 8 * GIB), T0) is not None
    assert book.get("ml/a") is not None  # what it held stays held


def test_a_quota_lowered_under_usage_admits_nothing_new_and_reclaims_nothing() -> None:
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=64 * GIB, max_entries=10))
    for name in ("a", "b", "c"):
        assert book.reserve(entry(f"ml/{name}", 16 * GIB), T0).admitted
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=20 * GIB, max_entries=10))
    assert book.quotas.over("q")
    assert book.quotas.used("q") == Usage(48 * GIB, 0, 3)  # reclaims nothing
    assert book.reclaim(T0 + timedelta(minutes=1)) == []
    assert len(book) == 3
    refused = book.reserve(entry("ml-dev/d", 1), T0)
    assert refused.message == (
        "namespace ml-dev (quota q): holds 48 GiB of 20 GiB RAM; requested 1 MiB"
    )
    book.release("ml/a")
    book.release("ml/b")
    assert not book.quotas.over("q")  # 16 GiB of 20
    assert book.reserve(entry("ml-dev/d", 4 * GIB), T0).admitted
    book.set_quota(QuotaRules("q", team("ml"), max_entries=1))  # over on entries
    assert book.quotas.over("q")
    assert book.reserve(entry("ml/e", 1), T0).reason == Reason.QUOTA_EXCEEDED


def test_a_quota_that_is_not_there_is_never_over_and_holds_nothing() -> None:
    quotas = Quotas()
    assert not quotas.over("nope")
    assert quotas.used("nope") == Usage()
    assert quotas.namespaces_of("nope") == []
    assert quotas.rules("nope") is None
    assert (len(quotas), quotas.names()) == (0, [])


def test_a_pod_already_running_over_its_quota_is_recorded_and_counted() -> None:
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=4 * GIB))
    decision = book.record(entry("ml/pod", 8 * GIB), T0)
    assert (decision.admitted, decision.reason) == (True, Reason.OVER_COMMITTED)
    assert "holds 0 MiB of 4 GiB RAM; requested 8 GiB" in decision.message
    assert book.quotas.used("q").ram_mb == 8 * GIB
    assert book.quotas.over("q")


def test_a_restore_counts_what_each_quota_holds_again() -> None:
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=4 * GIB))
    book.restore([entry("ml/a", 3 * GIB), entry("ml-dev/b", 3 * GIB), entry("web/c", GIB)])
    assert book.quotas.used("q") == Usage(6 * GIB, 0, 2)  # over: restored, not re-decided
    assert book.reserve(entry("ml/d", 1), T0).reason == Reason.QUOTA_EXCEEDED


# -- strict FIFO and the waiters of a quota -------------------------------------------------


def test_under_strict_fifo_a_quota_blocked_waiter_holds_back_no_other_namespace() -> None:
    book = ledger()
    book.set_quota(QuotaRules("team-ml", team("ml"), ram_mb=16 * GIB))
    assert book.reserve(entry("ml/held", 16 * GIB, node="n2"), T0).admitted
    first = book.reserve_or_wait(entry("ml/first", 8 * GIB), T0, LATER, strict=True)
    assert (first.queued, first.reason) == (True, Reason.QUOTA_EXCEEDED)
    # Created later, in another namespace, on the same node with room: it goes.
    later = entry("web/later", 8 * GIB, at=T0 + timedelta(seconds=1))
    assert book.reserve_or_wait(later, T0, LATER, strict=True).admitted
    # And from the queue: fill the node; a room waiter behind the quota waiter goes first.
    rest = book.allocatable_ram("n1")
    assert book.reserve(entry("web/fill", rest), T0).admitted
    behind = entry("web/behind", 4 * GIB, at=T0 + timedelta(seconds=2))
    assert book.reserve_or_wait(behind, T0, LATER, strict=True).reason == (Reason.INSUFFICIENT_RAM)
    book.release("web/fill")
    admitted = book.admit_waiting(T0, {"n1"}, strict=True)
    assert [d.entry.id for d in admitted] == ["web/behind"]
    assert book.waiting.position("ml/first") == 1


def test_under_strict_fifo_a_room_waiter_still_holds_back_those_behind_it() -> None:
    book = ledger()
    book.set_quota(QuotaRules("team-ml", team("ml"), ram_mb=400 * GIB))
    full_node(book)
    assert book.reserve_or_wait(entry("ml/first", 8 * GIB), T0, LATER, strict=True).queued
    behind = entry("web/behind", 4 * GIB, at=T0 + timedelta(seconds=1))
    assert book.reserve_or_wait(behind, T0, LATER, strict=True).reason == Reason.WAITERS_AHEAD


def test_quota_waiters_are_the_nodes_of_those_waiting_for_a_quota_shared() -> None:
    book = ledger(nodes=3)
    book.set_quota(QuotaRules("team-ml", team("ml"), ram_mb=16 * GIB))
    book.set_quota(QuotaRules("team-web", team("web"), ram_mb=16 * GIB))
    assert book.reserve(entry("ml/held", 16 * GIB), T0).admitted
    assert book.reserve(entry("web/held", 16 * GIB), T0).admitted
    assert book.reserve_or_wait(entry("ml/a", GIB, node="n1"), T0, LATER).queued
    assert book.reserve_or_wait(entry("ml-dev/b", GIB, node="n2"), T0, LATER).queued
    assert book.reserve_or_wait(entry("web/c", GIB, node="n3"), T0, LATER).queued
    # Full node n3 too: a room waiter there is not a quota waiter.
    assert book.reserve(entry("loose/fill", book.allocatable_ram("n3"), node="n3"), T0).admitted
    assert book.reserve_or_wait(entry("loose/d", GIB, node="n3"), T0, LATER).queued
    assert book.quota_waiters("ml") == {"n1", "n2"}
    assert book.quota_waiters("ml-dev") == {"n1", "n2"}
    assert book.quota_waiters("web") == {"n3"}
    assert book.quota_waiters("loose") == set()
    assert book.quota_waiters() == {"n1", "n2", "n3"}
    book.stop_waiting("web/c")
    assert book.quota_waiters() == {"n1", "n2"}
    # A waiter re-decided on the node's room is no longer one of the quota's.
    book.release("ml/held")
    assert book.reserve(entry("loose/fill1", book.allocatable_ram("n1")), T0).admitted
    assert book.admit_waiting(T0, book.quota_waiters("ml")) != []  # ml-dev/b on n2 goes
    assert not book.waiting.get("ml/a").for_quota  # type: ignore[union-attr]
    assert book.quota_waiters("ml") == set()


def test_a_release_finds_the_quota_waiters_of_a_namespace_not_seen_yet() -> None:
    """A namespace whose Namespace is not seen yet is governed by the quotas selecting it
    (by name, or by a selector its missing labels satisfy) but was in no quota's list of
    namespaces, so a release elsewhere under the same quota did not find its waiters."""
    book = ledger()
    book.set_quota(QuotaRules("all", LabelSelector(), max_entries=1))
    assert book.reserve(entry("ml/a", GIB), T0).admitted
    assert book.reserve_or_wait(entry("fresh/b", GIB, node="n2"), T0, LATER).queued
    book.release("ml/a")
    assert book.quota_waiters("ml") == {"n2"}
    assert [d.entry.id for d in book.admit_waiting(T0, book.quota_waiters("ml"))] == ["fresh/b"]


def team_absent() -> LabelSelector:
    return LabelSelector(
        match_expressions=[LabelSelectorRequirement(key="team", operator="DoesNotExist")]
    )


def test_labelling_a_namespace_not_seen_yet_reports_a_change_of_its_quotas() -> None:
    """set_namespace says whether what governs the namespace changed (the operator then
    tries its quota waiters); for one not seen yet it compared with nothing recorded."""
    book = ledger()
    book.set_quota(QuotaRules("no-team", team_absent(), max_entries=0))
    assert [r.name for r in book.quotas.governing("fresh")] == ["no-team"]
    assert book.reserve_or_wait(entry("fresh/a", GIB), T0, LATER).reason == (Reason.QUOTA_EXCEEDED)
    assert book.set_namespace("fresh", {"team": "ml"})
    assert book.quotas.governing("fresh") == []
    assert [d.entry.id for d in book.admit_waiting(T0, book.quota_waiters())] == ["fresh/a"]


def test_a_pods_waiter_its_quota_now_refuses_for_good_is_refused_at_once() -> None:
    """Changed under it (a nodeSelector without its node, a maxWait under its wait): a
    gated pod's waiting reservation is refused with that reason at the next look, not
    left for its whole wait; a reservation someone wrote waits on (they chose)."""
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=2 * GIB))
    assert book.reserve(entry("ml/a", 2 * GIB, node="n2"), T0).admitted
    pod = replace(entry("ml/p", GIB, node="n2"), pod_lifetime=True)
    day = T0 + timedelta(hours=24)
    assert book.reserve_or_wait(pod, T0, day).queued
    assert book.reserve_or_wait(entry("ml/w", GIB, node="n2"), T0, day).queued
    assert book.wait_over(T0) == []  # nothing changed: they wait

    gpu = LabelSelector(match_labels={"pool": "gpu"})  # n1's pool, not n2's
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=2 * GIB, nodes=gpu))
    refused = book.wait_over(T0)
    assert [(d.entry.id, d.admitted, d.reason) for d in refused] == [
        ("ml/p", False, Reason.NODE_NOT_ALLOWED)
    ]
    assert [w.entry_id for w in book.waiting.on("n2")] == ["ml/w"]
    assert book.wait_over(T0) == []  # said once


def test_a_running_pods_claim_counts_against_its_quota_until_its_own_entry_replaces_it() -> None:
    """A pod that runs before its reservation is decided (the webhook missed it, the
    operator was down): its claim fills its quota meanwhile, not its own decision."""
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=4 * GIB, max_entries=2))
    assert book.set_running_claim("ml/pod", entry("ml/pod", 3 * GIB))
    assert book.quotas.used("q") == Usage(3 * GIB, 0, 1)
    refused = book.reserve(entry("ml-dev/b", 2 * GIB), T0)  # shares the quota
    assert (refused.admitted, refused.reason) == (False, Reason.QUOTA_EXCEEDED)
    assert not book.set_running_claim("ml/pod", entry("ml/pod", 3 * GIB))  # no change
    own = book.record(entry("ml/pod", 3 * GIB), T0)  # its own entry: not against itself
    assert (own.admitted, own.reason) == (True, Reason.FITS)
    assert book.quotas.used("q") == Usage(3 * GIB, 0, 1)  # counted once
    assert book.running_claims() == 0
    assert not book.set_running_claim("ml/pod", entry("ml/pod", 3 * GIB))  # its entry counts
    book.release("ml/pod")
    assert book.quotas.used("q") == Usage()


def test_a_running_claim_no_longer_counted_leaves_room_for_the_quotas_waiters() -> None:
    book = ledger()
    book.set_quota(QuotaRules("q", team("ml"), ram_mb=4 * GIB))
    book.set_running_claim("ml/pod", entry("ml/pod", 3 * GIB))
    queued = book.reserve_or_wait(entry("ml/b", 2 * GIB, node="n2"), T0, LATER)
    assert (queued.queued, queued.reason) == (True, Reason.QUOTA_EXCEEDED)
    assert book.set_running_claim("ml/pod", None)  # the pod ended before its reservation
    assert book.quotas.used("q") == Usage()
    admitted = book.admit_waiting(T0, book.quota_waiters("ml"))
    assert [(d.entry.id, d.reason) for d in admitted] == [("ml/b", Reason.FITS)]
