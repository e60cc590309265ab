"""Strict mode's promise: room held from the answer at create until the decision."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from headroom.api.constants import OUTLOOK_MODE, STRICT
from headroom.api.limits import Limits
from headroom.api.outlook import CAVEAT, Verdict, parse_warning
from headroom.api.reasons import Phase, Reason
from headroom.api.selectors import LabelSelector
from headroom.control.admission import Admission
from headroom.control.outlook import OutlookAnswer, ReservationOutlook
from headroom.control.provisional import ProvisionalHolds
from headroom.control.state import Record, State
from headroom.ledger import Entry
from headroom.ledger.quotas import QuotaRules
from headroom.objects.status import StatusDecision

NOW = datetime(2026, 12, 7, tzinfo=UTC)


def _state() -> State:
    state = State(Limits(system_reserve_mb=0))
    state.ledger.set_node_capacity("n", 10_000, None)
    return state


def _claim(name: str, ram_mb: int) -> Entry:
    return Entry(f"team/{name}", "n", ram_mb, NOW, NOW)


def test_a_hold_takes_the_room_and_counts_for_the_namespace_until_given_back() -> None:
    async def scenario() -> None:
        state, woken = _state(), []
        holds = ProvisionalHolds(state, lifetime=60, room_freed=lambda: woken.append(1))
        assert holds.take("uid-1", _claim("a", 6_000), NOW)
        assert not holds.take("uid-2", _claim("b", 6_000), NOW), "the same last room twice"
        assert state.ledger.allocatable_ram("n") == 4_000
        assert state.ledger.quotas.used_by("team").ram_mb == 6_000
        assert state.ledger.get("team/a") is None, "not under the reservation's own name"
        assert holds.give_back("uid-1")
        assert not holds.give_back("uid-1")
        assert state.ledger.allocatable_ram("n") == 10_000
        assert woken == [1]
        assert state.take_room() == {"n"}, "what waits on the node is tried again"

    asyncio.run(scenario())


def test_a_hold_moves_none_of_the_counters_its_reservations_decision_moves() -> None:
    """The create's own decision counts its MiB once: the hold given back before it,
    and a hold that did not fit, are neither reserved, released nor a failure."""

    async def scenario() -> None:
        state = _state()
        holds = ProvisionalHolds(state, lifetime=60, room_freed=lambda: None)
        assert holds.take("uid-1", _claim("a", 6_000), NOW)
        assert not holds.take("uid-2", _claim("b", 6_000), NOW)
        during = state.ledger.metrics()
        assert (during.reserved_mb, during.reserve_failures) == (0, 0)
        assert (during.active_entries, during.active_mb) == (1, 6_000), "it holds room"
        holds.give_back("uid-1")
        assert state.ledger.reserve(_claim("a", 6_000), NOW).admitted
        after = state.ledger.metrics()
        assert (after.reserved_mb, after.released_mb, after.reserve_failures) == (6_000, 0, 0)

    asyncio.run(scenario())


def test_a_hold_no_create_came_for_runs_out() -> None:
    async def scenario() -> None:
        state = _state()
        holds = ProvisionalHolds(state, lifetime=0.05, room_freed=lambda: None)
        assert holds.take("uid-1", _claim("a", 6_000), NOW)
        await asyncio.sleep(0.2)
        assert "uid-1" not in holds
        assert state.ledger.allocatable_ram("n") == 10_000

    asyncio.run(scenario())


def test_a_hold_never_goes_stale_nor_expires_in_the_ledger() -> None:
    async def scenario() -> None:
        state = _state()
        holds = ProvisionalHolds(state, lifetime=60, room_freed=lambda: None)
        claim = _claim("a", 6_000)
        claim.expires_at = NOW
        assert holds.take("uid-1", claim, NOW)
        far = datetime(2027, 12, 7, tzinfo=UTC)
        assert state.ledger.due(far) == [], "only its lifetime or its decision ends it"

    asyncio.run(scenario())


# -- who holds: the answer at create ------------------------------------------------------


class Undecided:
    """The decider's queue, as the outlook asks it: ``waiting[node]`` uids undecided."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[str]] = {}

    def undecided_on(self, node: str, unless: Callable[[str], bool] = lambda uid: False) -> int:
        return sum(1 for uid in self.waiting.get(node, []) if not unless(uid))


class Clock:
    def now(self) -> datetime:
        return NOW

    def monotonic(self) -> float:
        return 0.0


def _outlook(strict_label: bool) -> tuple[ReservationOutlook, State, ProvisionalHolds, Undecided]:
    state = _state()
    state.ledger.set_namespace("team", {OUTLOOK_MODE: STRICT} if strict_label else {})
    holds = ProvisionalHolds(state, lifetime=60, room_freed=lambda: None)
    queue = Undecided()
    answerer = ReservationOutlook(
        state, cast(Admission, queue), Clock(), deciding=lambda: True, holds=holds
    )
    return answerer, state, holds, queue


def _reservation(name: str, ram_mb: int, *, annotated: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "team",
        "uid": f"uid-{name}",
        "creationTimestamp": "2026-12-07T00:00:00Z",
    }
    if annotated:
        metadata["annotations"] = {OUTLOOK_MODE: STRICT}
    return {"metadata": metadata, "spec": {"node": "n", "ramMB": ram_mb}}


def test_the_annotation_refuses_at_create_but_only_the_namespaces_label_holds() -> None:
    async def scenario() -> None:
        answerer, _, holds, _ = _outlook(strict_label=False)
        refused = answerer.answer(_reservation("huge", 20_000, annotated=True))
        assert refused.refusal is not None
        assert refused.refusal.startswith("InsufficientRAM: ")
        fits = answerer.answer(_reservation("fits", 6_000, annotated=True))
        assert fits.refusal is None
        assert len(holds) == 0, "an annotation (in the review, forgeable) holds nothing"

        answerer, _, holds, _ = _outlook(strict_label=True)
        assert answerer.answer(_reservation("dry", 6_000), dry_run=True).refusal is None
        assert len(holds) == 0, "a dry run holds nothing"
        held = answerer.answer(_reservation("fits", 6_000))
        assert "uid-fits" in holds
        assert any("held for it" in text for text in held.warnings)
        again = answerer.answer(_reservation("second", 6_000))
        assert again.refusal is not None, "the held room is not promised twice"

    asyncio.run(scenario())


def test_no_hold_ahead_of_an_earlier_reservation_still_undecided_on_the_node() -> None:
    async def scenario() -> None:
        answerer, _, holds, queue = _outlook(strict_label=True)
        queue.waiting["n"] = ["uid-earlier"]
        said = answerer.answer(_reservation("later", 6_000))
        assert said.refusal is None
        assert len(holds) == 0
        assert any(text.startswith(CAVEAT) for text in said.warnings), said.warnings
        queue.waiting["n"] = ["uid-held"]  # one that holds already is counted in the ledger
        assert holds.take("uid-held", _claim("held", 1_000), NOW)
        answerer.answer(_reservation("next", 1_000))
        assert "uid-next" in holds

    asyncio.run(scenario())


def _unknown_and_nothing_held(said: OutlookAnswer, holds: ProvisionalHolds) -> None:
    """The answer for a name already taken: no outlook, no refusal, no hold."""
    assert said.refusal is None
    read = parse_warning(said.warnings[0])
    assert read is not None
    assert read.verdict is Verdict.UNKNOWN
    assert len(holds) == 0


def test_a_name_the_ledger_still_holds_gets_no_outlook_and_is_not_refused() -> None:
    async def scenario() -> None:
        answerer, state, holds, _ = _outlook(strict_label=True)
        assert state.ledger.reserve(_claim("again", 9_000), NOW).admitted
        _unknown_and_nothing_held(answerer.answer(_reservation("again", 9_000)), holds)

    asyncio.run(scenario())


def test_a_name_a_rejected_reservation_keeps_gets_no_hold() -> None:
    """The API server refuses that create as AlreadyExists after the review: a hold taken
    for it would keep the room from others until its lifetime ran out (issue-32 review)."""

    async def scenario() -> None:
        answerer, state, holds, _ = _outlook(strict_label=True)
        refused = StatusDecision(Phase.REJECTED, Reason.INSUFFICIENT_RAM, "full", NOW)
        assert state.remember(Record("uid-old", "team", "taken", "n", refused))
        _unknown_and_nothing_held(answerer.answer(_reservation("taken", 1_000)), holds)
        state.forget("uid-old", 0.0)  # its object is gone: the name is free again
        answerer.answer(_reservation("taken", 1_000))
        assert "uid-taken" in holds

    asyncio.run(scenario())


def test_a_hold_is_given_no_expiry_by_its_namespaces_quota() -> None:
    """Found by the simulation's webhook reviews (seeds 4756, 6818, 7703): the quota's
    default lifetime gave the hold an expiry; the sweep released it then as an entry
    without a record (logged as an error), ahead of its lifetime, and giving it back
    later raised UnknownEntryError (in the expiry timer, or in the decision step)."""

    async def scenario() -> None:
        state = _state()
        state.ledger.set_namespace("team", {"team": "t"})
        state.ledger.set_quota(
            QuotaRules(
                "q",
                LabelSelector(match_labels={"team": "t"}),
                ram_mb=20_000,
                default_lifetime=timedelta(seconds=5),
            )
        )
        holds = ProvisionalHolds(state, lifetime=60, room_freed=lambda: None)
        assert holds.take("uid-1", _claim("a", 6_000), NOW)
        assert state.ledger.due(NOW + timedelta(seconds=30)) == []
        assert holds.give_back("uid-1")
        assert state.ledger.allocatable_ram("n") == 10_000

    asyncio.run(scenario())
