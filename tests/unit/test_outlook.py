"""The outlook at create: its words, its review envelope, and the hop to the main loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import pytest

from headroom.api.limits import Limits
from headroom.api.outlook import CAVEAT, Outlook, Verdict, parse_warning
from headroom.api.reasons import Reason
from headroom.control.outlook import OutlookAnswer
from headroom.ledger import Entry, Ledger
from headroom.ledger.outlook import outlook
from headroom.objects.gating import ReviewError
from headroom.objects.outlookreview import allowed_with, reservation_under_review
from headroom.serving.outlook import LedgerOutlook

NOW = datetime(2026, 12, 7, tzinfo=UTC)

FORMS = [
    Outlook(Verdict.ADMITTED, "8192 of 14336 MiB RAM free", node="gpu-1"),
    Outlook(
        Verdict.QUEUED,
        "node gpu-1: requested 8192 MiB (a: b), allocatable 6144 MiB",
        node="gpu-1",
        reason="InsufficientRAM",
        position=3,
    ),
    Outlook(Verdict.REJECTED, "spec.ram: 0 is not (1, 2)", node="n", reason="InvalidSpec"),
    Outlook(Verdict.UNKNOWN, "this replica does not decide now"),
]


@pytest.mark.parametrize("said", FORMS, ids=lambda o: str(o.verdict))
def test_every_form_reads_back_as_said(said: Outlook) -> None:
    read = parse_warning(said.warning())
    assert read is not None
    assert (read.verdict, read.detail, read.reason, read.position) == (
        said.verdict,
        said.detail,
        said.reason,
        said.position,
    )
    if said.verdict in (Verdict.ADMITTED, Verdict.QUEUED):
        assert read.node == said.node


def test_a_caveat_or_another_webhooks_warning_is_no_outlook() -> None:
    assert parse_warning(f"{CAVEAT}2 reservation(s) on n seen earlier") is None
    assert parse_warning("metadata.finalizers: deprecated") is None


def test_the_words_of_the_issue() -> None:
    assert (
        Outlook(Verdict.ADMITTED, "8192 of 14336 MiB RAM free", node="gpu-1").warning()
        == "would be admitted on gpu-1: 8192 of 14336 MiB RAM free"
    )
    queued = Outlook(Verdict.QUEUED, "m", node="gpu-1", reason="InsufficientRAM", position=3)
    assert queued.warning().startswith("would wait: position 3 on gpu-1 (InsufficientRAM: ")
    rejected = Outlook(Verdict.REJECTED, "node n: requested", reason="InsufficientRAM")
    assert rejected.warning() == "would be rejected InsufficientRAM: node n: requested"


# -- the ledger's outlook -----------------------------------------------------------------


def _ledger() -> Ledger:
    ledger = Ledger(Limits(Fraction(1), 0, timedelta(seconds=60), 8))
    ledger.set_node_capacity("n", 10_000, None)
    return ledger


def _entry(name: str, ram: int, at: datetime = NOW) -> Entry:
    return Entry(f"ns/{name}", "n", ram, at, at)


def test_admitted_says_the_room_it_finds_and_changes_nothing() -> None:
    ledger = _ledger()
    said = outlook(ledger, _entry("a", 4_000), NOW, None)
    assert said == Outlook(Verdict.ADMITTED, "4000 of 10000 MiB RAM free", node="n")
    assert len(ledger) == 0
    assert len(ledger.waiting) == 0


def test_queued_gives_the_place_in_the_node_queue() -> None:
    ledger = _ledger()
    assert ledger.reserve(_entry("big", 9_000), NOW).admitted
    until = NOW + timedelta(minutes=5)
    first = _entry("w1", 5_000, NOW + timedelta(seconds=1))
    assert ledger.reserve_or_wait(first, NOW, until).position == 1
    later = _entry("w2", 5_000, NOW + timedelta(seconds=2))
    said = outlook(ledger, later, NOW, until)
    assert (said.verdict, said.position, said.reason) == (Verdict.QUEUED, 2, "InsufficientRAM")
    # The same name created again replaces its own wait: it is not ahead of itself.
    again = _entry("w1", 5_000, NOW + timedelta(seconds=3))
    assert outlook(ledger, again, NOW, until).position == 1


def test_rejected_without_a_wait_says_the_reason_and_numbers() -> None:
    ledger = _ledger()
    said = outlook(ledger, _entry("huge", 20_000), NOW, None)
    assert said.verdict is Verdict.REJECTED
    assert said.reason == str(Reason.INSUFFICIENT_RAM)
    assert "20000" in said.detail
    assert said.detail == ledger.refusal(_entry("huge", 20_000), NOW)[1]


# -- the review envelope ------------------------------------------------------------------


def _review(kind: str = "Reservation", operation: str = "CREATE", **obj: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "review-1",
            "kind": {"group": "headroom.dev", "version": "v1alpha1", "kind": kind},
            "operation": operation,
            "namespace": "team",
            "dryRun": True,
            "object": {"metadata": {"name": "r"}, "spec": {"node": "n"}, **obj},
        },
    }


def test_the_reservation_under_review_gets_its_namespace() -> None:
    review = reservation_under_review(_review())
    assert review.uid == "review-1"
    assert review.dry_run is True
    reservation = review.reservation
    assert reservation is not None
    assert reservation["metadata"]["namespace"] == "team"


@pytest.mark.parametrize(
    ("kind", "operation"), [("Reservation", "UPDATE"), ("NodeHeadroom", "CREATE")]
)
def test_anything_else_is_not_looked_at(kind: str, operation: str) -> None:
    assert reservation_under_review(_review(kind, operation)).reservation is None


def test_not_a_review_is_an_error() -> None:
    with pytest.raises(ReviewError, match="AdmissionReview"):
        reservation_under_review({"kind": "Pod"})


def test_the_answer_allows_and_carries_the_warnings_cut_short() -> None:
    answer = allowed_with("u", ["a" * 5000, "b"])
    response = answer["response"]
    assert response["allowed"] is True
    assert response["uid"] == "u"
    assert [len(w) for w in response["warnings"]] == [1024, 1]
    assert "warnings" not in allowed_with("u", [])["response"]


# -- the hop from the webhook's thread to the main loop -------------------------------------


@pytest.fixture
def main_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop on another thread, standing for the operator's main loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_the_warnings_are_worked_out_on_the_main_loop(
    main_loop: asyncio.AbstractEventLoop,
) -> None:
    threads: list[threading.Thread] = []

    def answer(reservation: dict[str, Any], *, dry_run: bool) -> OutlookAnswer:
        threads.append(threading.current_thread())
        return OutlookAnswer([f"seen {reservation['metadata']['name']} {dry_run}"])

    ask = LedgerOutlook(main_loop, answer, timeout=5)
    said = asyncio.run(ask({"metadata": {"name": "r"}}, dry_run=True))
    assert said.warnings == ["seen r True"]
    assert threads
    assert threads[0] is not threading.current_thread()


def test_a_busy_main_loop_gives_no_outlook_in_time(main_loop: asyncio.AbstractEventLoop) -> None:
    main_loop.call_soon_threadsafe(time.sleep, 1.0)  # the main loop is stuck for a second
    asked: list[str] = []

    def answer(reservation: dict[str, Any], *, dry_run: bool) -> OutlookAnswer:
        asked.append("asked")
        return OutlookAnswer(refusal="late")

    said = asyncio.run(LedgerOutlook(main_loop, answer, timeout=0.05)({}, dry_run=False))
    assert said.refusal is None, "no outlook in time: the create goes on"
    read = parse_warning(said.warnings[0])
    assert read is not None
    assert read.verdict is Verdict.UNKNOWN
    assert "0.05s" in read.detail
    time.sleep(1.1)
    assert asked == [], "a review that gave up is not worked out later"


def test_a_failing_outlook_never_fails_the_create(main_loop: asyncio.AbstractEventLoop) -> None:
    def broken(reservation: dict[str, Any], *, dry_run: bool) -> OutlookAnswer:
        raise KeyError("spec")

    said = asyncio.run(LedgerOutlook(main_loop, broken, timeout=5)({}, dry_run=False))
    assert said.refusal is None
    read = parse_warning(said.warnings[0])
    assert read is not None
    assert read.verdict is Verdict.UNKNOWN
    assert "spec" in read.detail
