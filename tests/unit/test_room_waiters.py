"""Pods kube-scheduler left waiting for ledger room: nudged when room may fit them.

The real scheduler and API are in ``tests/e2e/test_scheduler_extender.py``
(``test_a_pod_waiting_for_ledger_room_is_bound_soon_after_room_comes_back``).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from headroom.api.constants import ROOM_ANNOTATION
from headroom.control.roomwaiters import RoomWaiters
from headroom.kube.transport import JSON

NOW = datetime(2026, 12, 6, tzinfo=UTC)


class Clock:
    mono = 0.0

    def now(self) -> datetime:
        return NOW

    def monotonic(self) -> float:
        return self.mono


class Api:
    def __init__(self) -> None:
        self.patched: list[tuple[str, list[JSON]]] = []

    async def json_patch(self, path: str, operations: list[JSON]) -> JSON:
        self.patched.append((path, operations))
        return {}


def pod(name: str, created: str) -> JSON:
    meta = {"name": name, "namespace": "ml", "uid": f"u-{name}", "creationTimestamp": created}
    return {"metadata": {**meta, "annotations": {"headroom.dev/ram": "1Gi"}}}


def run(fitting: set[str], *, rooms: set[str], mono: float = 0.0) -> list[str]:
    """Waiters b (older, on n1 and n2) and a (newer, on n2); room on ``rooms``; the
    filter passes the nodes in ``fitting``. The pods nudged, in order."""
    api, clock = Api(), Clock()

    async def go() -> None:
        waiters = RoomWaiters(
            api,  # type: ignore[arg-type]
            clock,
            fits=lambda p, names, now: [n for n in names if n in fitting],
            may_act=lambda: True,
        )
        waiters.waits(("ml", "a"), pod("a", "2026-12-06T00:00:02Z"), ["n2"])
        waiters.waits(("ml", "b"), pod("b", "2026-12-06T00:00:01Z"), ["n1", "n2"])
        clock.mono = mono
        waiters.room_on(rooms)
        await asyncio.sleep(0)
        await waiters.stop()

    asyncio.run(go())
    return [path.rsplit("/", 1)[1] for path, _ in api.patched]


def test_waiters_that_fit_where_room_came_back_are_nudged_oldest_first() -> None:
    assert run({"n2"}, rooms={"n2"}) == ["b", "a"]


def test_room_elsewhere_or_not_enough_nudges_nobody() -> None:
    assert run({"n2"}, rooms={"n3"}) == []
    assert run(set(), rooms={"n1", "n2"}) == []
    assert run({"n1"}, rooms={"n1"}) == ["b"]  # a never could use n1


def test_a_waiter_not_filtered_for_ten_minutes_is_forgotten() -> None:
    assert run({"n2"}, rooms={"n2"}, mono=601.0) == []


def test_the_nudge_is_an_annotation_on_that_incarnation() -> None:
    api, clock = Api(), Clock()

    async def go() -> None:
        waiters = RoomWaiters(
            api,  # type: ignore[arg-type]
            clock,
            fits=lambda p, names, now: names,
            may_act=lambda: True,
        )
        waiters.waits(("ml", "a"), pod("a", ""), ["n1"])
        waiters.room_on({"n1"})
        waiters.room_on({"n1"})  # nudged once: the next filter says if it still waits
        await asyncio.sleep(0)
        await waiters.stop()

    asyncio.run(go())
    [(_, operations)] = api.patched
    assert operations[0] == {"op": "test", "path": "/metadata/uid", "value": "u-a"}
    assert operations[1]["path"] == "/metadata/annotations/" + ROOM_ANNOTATION.replace("/", "~1")


def test_a_new_leader_nudges_the_waiters_it_inherits_where_room_is() -> None:
    """An earlier leader knew where they waited; this one does not: each is nudged once
    room comes back on any node where the ledger would let it go."""
    api, clock = Api(), Clock()

    async def go() -> None:
        waiters = RoomWaiters(
            api,  # type: ignore[arg-type]
            clock,
            fits=lambda p, names, now: [n for n in names if n == "n3"],
            may_act=lambda: True,
        )
        waiters.inherit([(("ml", "a"), pod("a", "")), (("ml", "b"), pod("b", ""))])
        waiters.waits(("ml", "b"), pod("b", ""), ["n1"])  # filtered since: it waits on n1
        waiters.room_on({"n1", "n2"})
        assert not api.patched  # room where neither fits
        waiters.room_on({"n3"})
        await asyncio.sleep(0)
        assert len(waiters) == 1  # b, nudged for n1 only
        await waiters.stop()

    asyncio.run(go())
    assert [path.rsplit("/", 1)[1] for path, _ in api.patched] == ["a"]
