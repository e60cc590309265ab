"""Waiting for room, case by case (the property tests explore the rest)."""

from __future__ import annotations

from datetime import timedelta

from headroom.api.reasons import Reason
from tests.unit.test_core_admission import T0, entry, ledger

LATER = T0 + timedelta(minutes=10)


def test_one_that_does_not_fit_waits_with_the_numbers_and_its_place() -> None:
    book = ledger(total=5120)  # limit 4096
    assert book.reserve(entry("holder", 4096), T0).admitted
    first = book.reserve_or_wait(entry("a", 1024), T0, LATER)
    second = book.reserve_or_wait(entry("b", 512), T0, LATER)
    assert (first.reason, first.position, second.position) == (Reason.INSUFFICIENT_RAM, 1, 2)
    assert "allocatable 0 MiB" in first.message
    assert LATER.isoformat() in first.message
    assert book.get("a") is None
    assert book.node_summary("n1", T0).reserved_ram_mb == 4096


def test_without_a_wait_it_is_refused_as_before() -> None:
    book = ledger(total=5120)
    assert book.reserve(entry("holder", 4096), T0).admitted
    refused = book.reserve_or_wait(entry("a", 1024), T0, None)
    assert (refused.admitted, refused.queued, refused.reason) == (
        False,
        False,
        Reason.INSUFFICIENT_RAM,
    )


def test_final_refusals_never_wait() -> None:
    book = ledger(total=5120)
    gone = entry("expired", 1, expires=T0)
    assert not book.reserve_or_wait(gone, T0, LATER).queued


def test_ties_in_creation_time_are_broken_by_name_not_by_arrival() -> None:
    book = ledger(total=5120)
    assert book.reserve(entry("holder", 4096), T0).admitted
    for name in ("ns/c", "ns/a", "ns/b"):
        book.reserve_or_wait(entry(name, 1024), T0, LATER)
    assert [w.entry.id for w in book.waiting.on("n1")] == ["ns/a", "ns/b", "ns/c"]


def test_strict_fifo_lets_the_head_block_best_effort_does_not() -> None:
    for strict, admitted in ((True, []), (False, ["small"])):
        book = ledger(total=5120)  # limit 4096
        assert book.reserve(entry("holder", 3072), T0).admitted
        assert book.reserve(entry("other", 1024), T0).admitted
        book.reserve_or_wait(entry("big", 2048), T0, LATER, strict=strict)
        later = entry("small", 512, at=T0 + timedelta(seconds=1))
        book.reserve_or_wait(later, T0, LATER, strict=strict)
        book.release("other")  # 1024 free: not enough for the head
        decisions = book.admit_waiting(T0, ["n1"], strict=strict)
        assert [d.entry.id for d in decisions] == admitted, strict


def test_a_newcomer_under_strict_fifo_waits_behind_or_is_refused() -> None:
    book = ledger(total=5120)
    assert book.reserve(entry("holder", 3072), T0).admitted
    book.reserve_or_wait(entry("big", 4096), T0, LATER, strict=True)
    behind = book.reserve_or_wait(entry("fits", 512), T0, LATER, strict=True)
    refused = book.reserve_or_wait(entry("no-wait", 512), T0, None, strict=True)
    assert (behind.reason, behind.position) == (Reason.WAITERS_AHEAD, 2)
    assert (refused.queued, refused.reason) == (False, Reason.WAITERS_AHEAD)


def test_a_wait_on_a_node_that_went_away_runs_out_saying_so() -> None:
    book = ledger(total=5120)
    assert book.reserve(entry("holder", 4096), T0).admitted
    book.reserve_or_wait(entry("a", 1024), T0, T0 + timedelta(seconds=30))
    book.release("holder")
    book.remove_node("n1")
    assert book.admit_waiting(T0, ["n1"]) == []  # still waits: the node is unknown
    assert book.wait_over(T0 + timedelta(seconds=29)) == []
    [over] = book.wait_over(T0 + timedelta(seconds=30))
    assert over.reason == Reason.WAIT_TIMEOUT
    assert "node n1: capacity unknown" in over.message, over.message
    assert "a" not in book.waiting


def test_an_expiry_before_the_wait_ends_is_already_expired() -> None:
    book = ledger(total=5120)
    assert book.reserve(entry("holder", 4096), T0).admitted
    soon = T0 + timedelta(seconds=5)
    book.reserve_or_wait(entry("a", 1024, expires=soon), T0, LATER)
    [over] = book.wait_over(soon)
    assert over.reason == Reason.ALREADY_EXPIRED


def test_under_strict_fifo_an_older_one_decided_late_goes_ahead_of_younger_waiters() -> None:
    """After an outage, a reservation created before the waiters may be decided after
    them: creation order, not the order of decisions, says who is ahead."""
    book = ledger(total=5120)
    assert book.reserve(entry("holder", 3072), T0).admitted
    young = T0 + timedelta(seconds=5)
    book.reserve_or_wait(entry("young", 2048, at=young), young, LATER, strict=True)
    old = book.reserve_or_wait(entry("old", 1024), young, LATER, strict=True)
    assert old.admitted, old.message  # it fits, and nothing waits ahead of it
    assert [w.entry.id for w in book.waiting.on("n1")] == ["young"]


def test_under_strict_fifo_waiters_stay_behind_an_older_undecided_one() -> None:
    book = ledger(total=5120)
    assert book.reserve(entry("holder", 4096), T0).admitted
    young = T0 + timedelta(seconds=5)
    book.reserve_or_wait(entry("young", 1024, at=young), young, LATER, strict=True)
    book.release("holder")
    older = {"n1": (T0, "old")}
    assert book.admit_waiting(young, ["n1"], strict=True, undecided=older) == []
    assert book.admit_waiting(young, ["n1"], strict=False, undecided=older) != []


def test_a_new_incarnation_waits_in_its_predecessors_place_not_behind_it() -> None:
    """A reservation replaced under the same name (a gated pod's claim edited) may wait
    before the old one's deletion is seen: one wait per name, or the old one would stay
    in the node's queue ahead of everyone for ever (found by simulation seed 1131)."""
    book = ledger(total=5120)
    assert book.reserve(entry("holder", 4096), T0).admitted
    assert book.reserve_or_wait(entry("ns/pod", 1024, at=T0), T0, LATER).position == 1
    again = entry("ns/pod", 512, at=T0 + timedelta(seconds=3))
    assert book.reserve_or_wait(again, T0, LATER).position == 1
    assert [w.entry for w in book.waiting.on("n1")] == [again]
    later = entry("ns/other", 512, at=T0 + timedelta(seconds=5))
    assert book.reserve_or_wait(later, T0, LATER).position == 2
    book.stop_waiting("ns/pod")
    assert [w.entry_id for w in book.waiting.on("n1")] == ["ns/other"]


def test_a_new_incarnation_admitted_at_once_leaves_no_wait_of_its_predecessor() -> None:
    book = ledger(total=5120)
    assert book.reserve(entry("holder", 4096), T0).admitted
    assert book.reserve_or_wait(entry("ns/pod", 1024, at=T0), T0, LATER).queued
    book.release("holder")
    again = entry("ns/pod", 512, at=T0 + timedelta(seconds=3))
    assert book.reserve_or_wait(again, T0, LATER).admitted  # before the queue's next pass
    assert book.waiting.on("n1") == []
    assert book.admit_waiting(T0, ["n1"]) == []  # no DuplicateID refusal for ever after
