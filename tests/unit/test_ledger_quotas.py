"""Quotas per tenant (HeadroomQuota) in the pure ledger, case by case.

The property tests (test_quota_properties.py) explore the histories; these pin
the refusals, their words and numbers, and the changes a quota goes through.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.api.selectors import LabelSelector, LabelSelectorRequirement
from headroom.ledger import Entry, Ledger, Owner
from headroom.ledger.quotas import QuotaRules

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(minutes=10)
GIB = 1024


def entry(
    entry_id: str,
    ram: int,
    *,
    node: str = "n1",
    vram: int = 0,
    at: datetime = T0,
    expires: datetime | None = None,
    wait_until: datetime | None = None,
) -> Entry:
    return Entry(
        id=entry_id,
        node=node,
        ram_mb=ram,
        vram_mb=vram,
        created_at=at,
        last_heartbeat=at,
        expires_at=expires,
        owner=Owner(),
        wait_until=wait_until,
    )


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
        book.quotas.set_namespace(namespace, labels)
    return book


# -- bugs found in review ---------------------------------------------------------------


def test_a_quota_changed_to_select_other_namespaces_does_not_carry_negative_usage() -> None:
    """set_quota used to subtract what a namespace held from the *new* quota's usage when
    the new selector no longer picked it, though the new quota never counted it: the
    quota then believed its namespaces held less than nothing and let them over."""
    book = ledger()
    book.quotas.set_quota(QuotaRules("q", team("ml"), ram_mb=64 * GIB))
    assert book.reserve(entry("ml/a", 40 * GIB), T0).admitted
    book.quotas.set_quota(QuotaRules("q", team("web"), ram_mb=64 * GIB))
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
    book.quotas.set_quota(QuotaRules("q", team("ml"), ram_mb=64 * GIB, vram_mb=40 * GIB))
    assert book.reserve(entry("ml/a", 48 * GIB), T0).admitted
    book.quotas.set_quota(QuotaRules("q", team("ml"), ram_mb=32 * GIB, vram_mb=40 * GIB))
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
    book.quotas.set_quota(QuotaRules("a-room", team("ml"), ram_mb=16 * GIB))
    gpu_only = LabelSelector(match_labels={"pool": "gpu"})
    book.quotas.set_quota(QuotaRules("b-nodes", team("ml"), nodes=gpu_only))
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
    book.quotas.set_quota(
        QuotaRules("q", team("ml"), nodes=LabelSelector(match_labels={"pool": "cpu"}))
    )
    full_node(book)
    assert book.reserve_or_wait(entry("web/waits", GIB), T0, LATER, strict=True).queued
    late = entry("ml/x", GIB, at=T0 + timedelta(seconds=1))  # behind web/waits
    refused = book.reserve_or_wait(late, T0, LATER, strict=True)
    assert (refused.queued, refused.reason) == (False, Reason.NODE_NOT_ALLOWED)
    # One that may wait still waits behind, as before.
    later = entry("web/later", GIB, at=T0 + timedelta(seconds=2))
    behind = book.reserve_or_wait(later, T0, LATER, strict=True)
    assert (behind.queued, behind.reason) == (True, Reason.WAITERS_AHEAD)
