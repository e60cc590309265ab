"""Table-driven tests of the pure ledger: every seed behaviour and edge case."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest

from headroom.api.constants import MAX_MB
from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.ledger import Entry, Ledger, Owner, UnknownEntryError

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=5)


def entry(
    entry_id: str,
    ram: int,
    *,
    node: str = "n1",
    vram: int = 0,
    at: datetime = T0,
    expires: datetime | None = None,
    pod: str | None = None,
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
        owner=Owner(pod=pod),
        wait_until=wait_until,
    )


def ledger(total: int = 32768, vram: int | None = None, **limits: object) -> Ledger:
    book = Ledger(Limits(heartbeat_stale_window=WINDOW, **limits))  # type: ignore[arg-type]
    book.set_node_capacity("n1", total, vram)
    return book


@pytest.mark.parametrize(
    ("limits", "total", "held", "asked", "reason"),
    [
        ({}, 32768, 0, 31744, Reason.FITS),  # exactly the limit: 32768 − 1024
        ({}, 32768, 0, 31745, Reason.INSUFFICIENT_RAM),
        ({}, 32768, 25600, 6144, Reason.FITS),
        ({}, 32768, 25600, 8192, Reason.INSUFFICIENT_RAM),
        ({"max_overcommit_ratio": Fraction(3, 2)}, 1000, 0, 476, Reason.FITS),  # 1500 − 1024
        ({"max_overcommit_ratio": Fraction(3, 2)}, 1000, 0, 477, Reason.INSUFFICIENT_RAM),
        (
            {"max_overcommit_ratio": Fraction(11, 10), "system_reserve_mb": 0},
            10,
            0,
            11,
            Reason.FITS,
        ),
        (
            {"max_overcommit_ratio": Fraction(11, 10), "system_reserve_mb": 0},
            10,
            0,
            12,
            Reason.INSUFFICIENT_RAM,
        ),
        ({"max_overcommit_ratio": Fraction(0)}, 1024, 0, 10**6, Reason.FITS),  # unlimited
        ({"system_reserve_mb": 4096}, 2048, 0, 1, Reason.INSUFFICIENT_RAM),  # reserve > total
        ({"max_entries_per_node": 1}, 32768, 1, 1, Reason.TOO_MANY_ENTRIES),
    ],
)
def test_admission_arithmetic(
    limits: dict[str, object], total: int, held: int, asked: int, reason: Reason
) -> None:
    book = ledger(total, **limits)
    if held:
        assert book.reserve(entry("held", held), T0).admitted
    decision = book.reserve(entry("new", asked), T0)
    assert decision.reason == reason
    assert decision.admitted == (reason == Reason.FITS)


def test_rejection_message_has_the_numbers() -> None:
    book = Ledger(Limits())
    book.set_node_capacity("gpu-1", 32768)
    assert book.reserve(entry("a", 25600, node="gpu-1"), T0).admitted
    decision = book.reserve(entry("b", 8192, node="gpu-1"), T0)
    assert decision.message == (
        "node gpu-1: requested 8192 MiB, allocatable 6144 MiB "
        "(total 32768 × 1 − reserve 1024 − reserved 25600)"
    )


def test_ratio_is_printed_exactly() -> None:
    book = ledger(1000, max_overcommit_ratio=Fraction(3, 2), system_reserve_mb=0)
    assert "× 1.5 −" in book.reserve(entry("a", 5000), T0).message


def test_unknown_capacity_is_node_unknown() -> None:
    book = Ledger(Limits())
    decision = book.reserve(entry("a", 1, node="ghost"), T0)
    assert (decision.admitted, decision.reason) == (False, Reason.NODE_UNKNOWN)
    assert "ghost" in decision.message


def test_node_removed_while_entries_are_active() -> None:
    book = ledger()
    assert book.reserve(entry("a", 1024), T0).admitted
    book.remove_node("n1")
    assert book.get("a") is not None
    assert book.node_summary("n1", T0).reserved_ram_mb == 1024
    assert book.reserve(entry("b", 1), T0).reason == Reason.NODE_UNKNOWN
    book.release("a")
    assert book.nodes() == []  # nothing left to remember about the node
    book.set_node_capacity("n1", 4096)
    assert book.reserve(entry("c", 3072), T0).admitted


def test_capacity_shrinking_below_reserved_evicts_nothing() -> None:
    book = ledger(32768)
    assert book.reserve(entry("a", 20000), T0).admitted
    book.set_node_capacity("n1", 8192)
    summary = book.node_summary("n1", T0)
    assert book.get("a") is not None
    assert summary.over_committed
    assert summary.allocatable_ram_mb == 0
    assert book.allocatable_ram("n1") == 0
    assert book.reserve(entry("b", 1), T0).reason == Reason.INSUFFICIENT_RAM


def test_vram_enforced_only_where_known() -> None:
    unknown = ledger(32768, vram=None)
    assert unknown.reserve(entry("a", 1, vram=10**6), T0).admitted
    assert unknown.node_summary("n1", T0).vram_capacity_mb is None
    known = ledger(32768, vram=16384)
    assert known.reserve(entry("a", 1, vram=16384), T0).admitted
    decision = known.reserve(entry("b", 1, vram=1), T0)
    assert decision.reason == Reason.INSUFFICIENT_VRAM
    assert "VRAM 16384" in decision.message


@pytest.mark.parametrize(("ram", "vram"), [(0, 0), (-1, 5), (5, -1)])
def test_invalid_sizes_are_refused(ram: int, vram: int) -> None:
    assert ledger().reserve(entry("a", ram, vram=vram), T0).reason == Reason.INVALID_SPEC


def test_duplicate_id_is_refused_and_changes_nothing() -> None:
    book = ledger()
    assert book.reserve(entry("a", 1024), T0).admitted
    assert book.reserve(entry("a", 2048), T0).reason == Reason.DUPLICATE_ID
    assert book.node_summary("n1", T0).reserved_ram_mb == 1024


def test_expires_at_already_past() -> None:
    decision = ledger().reserve(entry("a", 1, expires=T0), T0)
    assert decision.reason == Reason.ALREADY_EXPIRED


def test_entry_cap_counts_only_active_entries() -> None:
    book = ledger(max_entries_per_node=2)
    assert book.reserve(entry("a", 1), T0).admitted
    assert book.reserve(entry("b", 1), T0).admitted
    assert book.reserve(entry("c", 1), T0).reason == Reason.TOO_MANY_ENTRIES
    book.release("a")
    assert book.reserve(entry("c", 1), T0).admitted
    assert "the cap is 2" in book.reserve(entry("d", 1), T0).message


def test_release_and_heartbeat_of_unknown_ids_change_nothing() -> None:
    book = ledger()
    assert book.reserve(entry("a", 1024), T0).admitted
    before = book.metrics()
    with pytest.raises(UnknownEntryError):
        book.release("nope")
    with pytest.raises(UnknownEntryError):
        book.heartbeat("nope", T0)
    book.release("a")
    with pytest.raises(UnknownEntryError):
        book.release("a")
    with pytest.raises(UnknownEntryError):
        book.heartbeat("a", T0)
    assert book.metrics().released_mb == before.released_mb + 1024


def test_heartbeat_never_moves_backwards() -> None:
    book = ledger()
    assert book.reserve(entry("a", 1), T0).admitted
    book.heartbeat("a", T0 + timedelta(minutes=3))
    book.heartbeat("a", T0 + timedelta(minutes=1))
    entry_a = book.get("a")
    assert entry_a is not None
    assert entry_a.last_heartbeat == T0 + timedelta(minutes=3)


def test_is_stale_and_is_expired() -> None:
    e = entry("a", 1, expires=T0 + timedelta(hours=1))
    assert not e.is_stale(T0 + WINDOW, WINDOW)
    assert e.is_stale(T0 + WINDOW + timedelta(microseconds=1), WINDOW)
    assert not e.is_expired(T0 + timedelta(minutes=59))
    assert e.is_expired(T0 + timedelta(hours=1))
    assert not entry("b", 1).is_expired(T0 + timedelta(days=10**4))


def test_reclaim_stale_and_expired_expiry_first() -> None:
    book = ledger()
    book.reserve(entry("silent", 100), T0)
    book.reserve(entry("expiring", 200, expires=T0 + timedelta(minutes=2)), T0)
    book.reserve(entry("both", 300, expires=T0 + timedelta(minutes=6)), T0)
    book.reserve(entry("alive", 400), T0)
    assert book.reclaim(T0 + timedelta(minutes=1)) == []
    assert [r.entry.id for r in book.reclaim(T0 + timedelta(minutes=2))] == ["expiring"]
    book.heartbeat("alive", T0 + timedelta(minutes=4))
    reclaimed = {r.entry.id: r.reason for r in book.reclaim(T0 + timedelta(minutes=7))}
    assert reclaimed == {"silent": Reason.HEARTBEAT_STALE, "both": Reason.EXPIRED}
    assert book.get("alive") is not None
    assert book.metrics().reclaimed_mb == 600
    assert book.next_deadline() == T0 + timedelta(minutes=9)


def test_shorter_window_override_moves_deadlines_earlier() -> None:
    book = ledger()
    book.reserve(entry("a", 1), T0)
    book.set_node_capacity("n1", 32768, None, Limits(heartbeat_stale_window=timedelta(minutes=1)))
    assert book.next_deadline() == T0 + timedelta(minutes=1)
    assert [r.entry.id for r in book.reclaim(T0 + timedelta(minutes=2))] == ["a"]


def test_summaries_and_metrics() -> None:
    book = ledger(16384, vram=8192)
    book.reserve(entry("a", 4096, vram=2048), T0)
    book.reserve(entry("b", 4096, at=T0 - timedelta(minutes=10)), T0)
    book.reserve(entry("c", 99999), T0)
    s = book.node_summary("n1", T0)
    assert (s.total_ram_mb, s.reserved_ram_mb, s.allocatable_ram_mb) == (16384, 8192, 7168)
    assert (s.reserved_vram_mb, s.vram_capacity_mb) == (2048, 8192)
    assert (s.active_entries, s.stale_entries, s.utilization_pct) == (2, 1, 50.0)
    cluster = book.summary(T0)
    assert (cluster.total_reserved_mb, cluster.active_entries, cluster.stale_entries) == (
        8192,
        2,
        1,
    )
    m = book.metrics()
    assert (m.reserved_mb, m.reserve_failures, m.active_entries) == (8192, 1, 2)
    assert m.failures_by_reason == {Reason.INSUFFICIENT_RAM: 1}
    assert [e.id for e in book.entries_for_node("n1")] == ["a", "b"]


def test_unlimited_node_reports_the_largest_possible_reservation() -> None:
    book = ledger(1024, max_overcommit_ratio=Fraction(0))
    assert book.allocatable_ram("n1") == MAX_MB
    assert book.node_summary("n1", T0).limit_ram_mb is None


def test_rebuild_reports_entries_that_no_longer_fit_and_keeps_them() -> None:
    entries = [entry("old", 6000, at=T0), entry("new", 6000, at=T0 + timedelta(seconds=1))]
    book, result = Ledger.rebuild(Limits(), [("n1", 8192, None, None)], entries)
    assert [e.id for e in result.over_committed] == ["new"]
    assert {e.id for e in book.entries()} == {"old", "new"}
    assert book.node_summary("n1", T0).over_committed


def test_a_rebuild_restores_without_counting_what_it_restores_as_reserved() -> None:
    """The counters are of what this ledger did: a restart over held reservations does
    not count them as reserved again, and their later release or reclaim counts once."""
    held = [entry("a", 1000), entry("b", 2000, expires=T0 + timedelta(minutes=1))]
    book, _ = Ledger.rebuild(
        Limits(heartbeat_stale_window=WINDOW), [("n1", 32768, None, None)], held
    )
    m = book.metrics()
    assert (m.reserved_mb, m.restored_mb, m.released_mb, m.reclaimed_mb) == (0, 3000, 0, 0)
    assert (m.active_mb, m.active_entries) == (3000, 2)
    assert book.reserve(entry("c", 500), T0).admitted
    book.release("a")
    assert [r.entry.id for r in book.reclaim(T0 + timedelta(minutes=2))] == ["b"]
    m = book.metrics()
    assert (m.reserved_mb, m.restored_mb, m.released_mb, m.reclaimed_mb) == (500, 3000, 1000, 2000)
    assert m.restored_mb + m.reserved_mb - m.released_mb - m.reclaimed_mb == m.active_mb == 500
    assert book.restore([entry("a2", 100)]).over_committed == []  # held again while running
    assert (book.metrics().reserved_mb, book.metrics().restored_mb) == (500, 3100)
