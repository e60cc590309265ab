"""Waiting under quotas, case by case: what the simulation found (seeds 794, 1912)."""

from __future__ import annotations

from datetime import timedelta

from headroom.api.reasons import Reason
from headroom.api.selectors import LabelSelector
from headroom.ledger import Ledger
from headroom.ledger.quotas import QuotaRules
from tests.unit.test_core_admission import T0, entry, ledger

LATER = T0 + timedelta(minutes=10)


def _under_quota(book: Ledger, **rules: object) -> None:
    for namespace in ("a", "b", "other"):
        book.set_namespace(namespace, {"team": "t" if namespace != "other" else "o"})
    selector = LabelSelector.model_validate({"matchLabels": {"team": "t"}})
    book.set_quota(QuotaRules(name="team", namespaces=selector, **rules))  # type: ignore[arg-type]


def test_a_waiter_whose_quota_lifetime_runs_out_is_refused_expired_not_left_waiting() -> None:
    book = ledger(total=5120)
    _under_quota(book, default_lifetime=timedelta(seconds=11))
    assert book.reserve(entry("other/holder", 4096), T0).admitted
    waiting = book.reserve_or_wait(entry("a/late", 1024), T0, LATER)
    assert waiting.queued
    assert book.wait_over(T0 + timedelta(seconds=10)) == []
    [refused] = book.wait_over(T0 + timedelta(seconds=11))
    assert refused.reason == Reason.ALREADY_EXPIRED
    assert refused.message.startswith(f"expired at {(T0 + timedelta(seconds=11)).isoformat()}")
    assert "a/late" not in book.waiting


def test_a_longer_quota_lifetime_keeps_a_waiter_waiting() -> None:
    book = ledger(total=5120)
    _under_quota(book, default_lifetime=timedelta(seconds=11))
    assert book.reserve(entry("other/holder", 4096), T0).admitted
    assert book.reserve_or_wait(entry("a/late", 1024), T0, LATER).queued
    _under_quota(book, default_lifetime=timedelta(hours=1))
    assert book.wait_over(T0 + timedelta(seconds=11)) == []
    assert "a/late" in book.waiting


def test_a_shorter_quota_lifetime_ends_a_wait_when_it_runs_out() -> None:
    """Seed 11374: a gated pod's reservation waited for room under a quota giving 37 s;
    the admin lowered it to 14 s. Its wait kept the deadline the 37 s gave, so it stayed
    Queued (and first in the strict queue) 23 s past its lifetime, while the one behind
    it was admitted past it: refused at 14 s now, before anything behind it goes."""
    book = ledger(total=5120)  # limit 4096
    _under_quota(book, default_lifetime=timedelta(seconds=37))
    assert book.reserve(entry("other/holder", 4096), T0).admitted
    head = book.reserve_or_wait(entry("a/head", 512), T0, LATER, strict=True)
    assert (head.queued, head.reason) == (True, Reason.INSUFFICIENT_RAM)
    four = T0 + timedelta(seconds=4)
    behind = book.reserve_or_wait(entry("a/behind", 256, at=four), four, LATER, strict=True)
    assert (behind.queued, behind.reason) == (True, Reason.WAITERS_AHEAD)
    _under_quota(book, default_lifetime=timedelta(seconds=14))
    assert book.waiting.next_deadline() == T0 + timedelta(seconds=14)
    assert book.wait_over(T0 + timedelta(seconds=13)) == []
    [refused] = book.wait_over(T0 + timedelta(seconds=14))
    assert (refused.entry.id, refused.reason) == ("a/head", Reason.ALREADY_EXPIRED)
    assert refused.message.startswith(f"expired at {(T0 + timedelta(seconds=14)).isoformat()}")
    assert book.waiting.on("n1")[0].entry_id == "a/behind"
    book.release("other/holder")
    [admitted] = book.admit_waiting(T0 + timedelta(seconds=15), ["n1"], strict=True)
    assert admitted.entry.id == "a/behind"
    assert len(book.waiting) == 0


def test_a_namespace_relabelled_under_a_shorter_lifetime_ends_its_wait_then() -> None:
    book = ledger(total=5120)
    _under_quota(book, default_lifetime=timedelta(seconds=14))
    assert book.reserve(entry("team/holder", 4096), T0).admitted  # "team": no quota yet
    assert book.reserve_or_wait(entry("solo/late", 512), T0, LATER).queued
    assert book.waiting.next_deadline() == LATER
    assert book.set_namespace("solo", {"team": "t"})  # now under the quota's 14 s
    [refused] = book.wait_over(T0 + timedelta(seconds=14))
    assert (refused.entry.id, refused.reason) == ("solo/late", Reason.ALREADY_EXPIRED)


def test_strict_fifo_a_quota_waiter_holds_back_its_own_quota_only() -> None:
    book = ledger(total=9216)  # limit 8192
    _under_quota(book, ram_mb=2048)
    assert book.reserve(entry("a/held", 2048), T0).admitted
    head = book.reserve_or_wait(entry("b/head", 1024), T0, LATER, strict=True)
    assert (head.queued, head.reason) == (True, Reason.QUOTA_EXCEEDED)
    one_second = T0 + timedelta(seconds=1)
    mate = book.reserve_or_wait(entry("a/mate", 512, at=one_second), T0, LATER, strict=True)
    assert (mate.queued, mate.reason) == (True, Reason.WAITERS_AHEAD)
    stranger = book.reserve_or_wait(entry("other/x", 512, at=one_second), T0, LATER, strict=True)
    assert stranger.admitted  # another tenant does not wait for team's quota
    assert book.admit_waiting(T0, ["n1"], strict=True) == []  # the mate stays behind its head
    book.release("a/held")
    admitted = book.admit_waiting(T0, ["n1"], strict=True)
    assert [d.entry.id for d in admitted] == ["b/head", "a/mate"]


def test_a_namespace_not_seen_yet_counts_under_the_quota_that_names_it() -> None:
    """Restored before its Namespace was read: what it holds is counted under a quota
    that selects it by the name label every namespace has; a deleted one is forgotten."""
    book = ledger(total=9216)
    selector = LabelSelector.model_validate(
        {"matchLabels": {"kubernetes.io/metadata.name": "unseen"}}
    )
    book.set_quota(QuotaRules(name="by-name", namespaces=selector, ram_mb=2048))
    assert book.reserve(entry("unseen/big", 4096), T0).reason == Reason.QUOTA_EXCEEDED
    assert book.reserve(entry("unseen/a", 1024), T0).admitted
    assert book.quotas.used("by-name").ram_mb == 1024
    refused = book.reserve(entry("unseen/b", 2048), T0)
    assert refused.reason == Reason.QUOTA_EXCEEDED
    book.set_namespace("gone", {"kubernetes.io/metadata.name": "gone"})
    book.remove_namespace("gone")
    assert "gone" not in book.quotas.seen_namespaces()
    book.remove_namespace("unseen")  # still holds: still counted
    assert book.quotas.used("by-name").ram_mb == 1024


def test_a_waiter_its_changed_quota_now_forbids_holds_back_no_one_under_strict_fifo() -> None:
    """Queued for room; then its quota's nodeSelector leaves its node out. Until its wait
    runs out it can never go, so it must not hold back another tenant on the node."""
    book = ledger(total=5120)  # limit 4096
    _under_quota(book)
    book.set_node_labels("n1", {"pool": "gpu"})
    assert book.reserve(entry("other/holder", 3072), T0).admitted
    assert book.reserve_or_wait(entry("a/big", 2048), T0, LATER, strict=True).queued
    selector = LabelSelector.model_validate({"matchLabels": {"team": "t"}})
    cpu_only = LabelSelector.model_validate({"matchLabels": {"pool": "cpu"}})
    book.set_quota(QuotaRules(name="team", namespaces=selector, nodes=cpu_only))
    assert book.admit_waiting(T0, ["n1"], strict=True) == []
    later = entry("other/small", 512, at=T0 + timedelta(seconds=1))
    assert book.reserve_or_wait(later, T0, LATER, strict=True).admitted
