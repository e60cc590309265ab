"""Strict mode's promise: room held from the answer at create until the decision."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from headroom.api.limits import Limits
from headroom.api.selectors import LabelSelector
from headroom.control.provisional import ProvisionalHolds
from headroom.control.state import State
from headroom.ledger import Entry
from headroom.ledger.quotas import QuotaRules

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
