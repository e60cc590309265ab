"""Faults, pauses and kills on the fake API server.

Each request fate is checked for the one thing the control code must get right:
whether the server applied the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from headroom.kube.transport import (
    JSON,
    ApiError,
    ApiUnavailableError,
    resource_path,
)
from headroom_dev.sim.fakeapi import WRITE_VERBS, FakeApiServer, FakeClient, FaultPlan
from headroom_dev.sim.loop import run_virtual

T = TypeVar("T")
NS = "ml"
RSV = resource_path("headroom.dev", "v1alpha1", "reservations", NS)


def simulate(scenario: Callable[[FakeApiServer], Awaitable[T]]) -> T:
    async def main() -> T:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        return await scenario(server)

    return run_virtual(main(), max_virtual_seconds=3600)


def body(name: str) -> JSON:
    return {
        "apiVersion": "headroom.dev/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name},
        "spec": {"node": "n1", "ramMB": 10},
    }


def now() -> float:
    return asyncio.get_running_loop().time()


async def outcome(call: Awaitable[Any]) -> str:
    try:
        await call
    except ApiError as error:
        return f"{error.status} {error.reason}"
    except ApiUnavailableError:
        return "unavailable"
    return "ok"


# -- one request, one fate ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("plan", "answers", "applied"),
    [
        (FaultPlan(throttle=1.0), {"429 TooManyRequests"}, False),
        (
            FaultPlan(server_error=1.0),
            {"500 InternalError", "503 ServiceUnavailable", "504 Timeout"},
            False,
        ),
        (FaultPlan(refuse=1.0), {"unavailable"}, False),
        (FaultPlan(lose_answer=1.0), {"unavailable"}, True),
    ],
    ids=["throttled", "server-error", "refused", "answer-lost"],
)
def test_each_fate_answers_as_it_should_and_applies_only_when_it_should(
    plan: FaultPlan, answers: set[str], applied: bool
) -> None:
    async def scenario(server: FakeApiServer) -> None:
        api = server.client("operator", plan)
        seen = set()
        for i in range(30):
            seen.add(await outcome(api.create(RSV, body(f"r{i}"))))
        assert seen == answers
        assert len(server.reservations()) == (30 if applied else 0)

    simulate(scenario)


def test_faults_can_be_limited_to_some_verbs() -> None:
    async def scenario(server: FakeApiServer) -> None:
        api = server.client("operator", FaultPlan(throttle=1.0, verbs=WRITE_VERBS))
        server.create_reservation(NS, "a", "n1", 1)
        assert await outcome(api.get(f"{RSV}/a")) == "ok"
        assert await outcome(api.list_page(RSV)) == "ok"
        assert await outcome(api.delete(f"{RSV}/a")) == "429 TooManyRequests"
        assert api.faults is not None
        assert api.faults.counts == {"throttled": 1}

    simulate(scenario)
    with pytest.raises(ValueError, match="unknown verbs"):
        FaultPlan(verbs=frozenset({"post"}))


def test_latency_takes_virtual_time_each_way() -> None:
    async def scenario(server: FakeApiServer) -> None:
        api = server.client("operator", FaultPlan(seed=1, latency=0.5))
        applied_at: list[float] = []
        server.subscribe(lambda type_, obj: applied_at.append(now()))
        started = now()
        await api.create(RSV, body("a"))
        answered = now()
        assert started < applied_at[0] < answered <= started + 1.0

    simulate(scenario)


def test_the_same_seed_replays_the_same_fates_at_the_same_times() -> None:
    async def trace(server: FakeApiServer) -> list[tuple[float, str]]:
        api = server.client("operator", FaultPlan(seed=9, throttle=0.2, refuse=0.1, latency=0.3))
        return [(now(), await outcome(api.create(RSV, body(f"r{i}")))) for i in range(40)]

    first = simulate(trace)
    assert simulate(trace) == first
    assert len({o for _, o in first}) == 3


# -- watch faults ---------------------------------------------------------------------------


async def changes(server: FakeApiServer, count: int) -> None:
    for i in range(count):
        await asyncio.sleep(1)
        server.create_reservation(NS, f"r{i}", "n1", 1)


async def read(api: FakeClient, version: str, seconds: int = 10) -> list[str]:
    names = []
    try:
        async for event in api.watch(RSV, resource_version=version, timeout_seconds=seconds):
            obj = event["object"]
            names.append(obj["metadata"].get("name") or f"{event['type']} {obj.get('code')}")
    except ApiUnavailableError:
        names.append("broken")
    return names


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        (FaultPlan(watch_drop=1.0), []),
        (FaultPlan(watch_duplicate=1.0), ["r0", "r0", "r1", "r1", "r2", "r2"]),
        (FaultPlan(watch_break=1.0), ["broken"]),
        (FaultPlan(watch_expire=1.0), ["ERROR 410"]),
        (FaultPlan(seed=2, watch_drop=0.5), ["r0", "r1"]),
    ],
    ids=["dropped", "duplicated", "broken", "expired", "some-dropped"],
)
def test_watch_faults(plan: FaultPlan, expected: list[str]) -> None:
    async def scenario(server: FakeApiServer) -> list[str]:
        api = server.client("operator", plan)
        writer = asyncio.create_task(changes(server, 3))
        names = await read(api, str(server.resource_version))
        await writer
        return names

    assert simulate(scenario) == expected


def test_watch_delivery_can_lag_behind_the_store() -> None:
    async def scenario(server: FakeApiServer) -> None:
        api = server.client("operator", FaultPlan(seed=4, watch_delay=3.0))
        version = str(server.resource_version)
        server.create_reservation(NS, "a", "n1", 1)
        async for event in api.watch(RSV, resource_version=version, timeout_seconds=10):
            assert event["object"]["metadata"]["name"] == "a"
            assert 0 < now() <= 3.0
            break

    simulate(scenario)


# -- pause, resume, kill -----------------------------------------------------------------------


def test_a_paused_client_neither_reaches_the_store_nor_hears_back_until_resumed() -> None:
    async def scenario(server: FakeApiServer) -> None:
        frozen, other = server.client("frozen"), server.client("other")
        version = str(server.resource_version)
        watched: list[tuple[float, str]] = []

        async def follow() -> None:
            async for event in frozen.watch(RSV, resource_version=version, timeout_seconds=60):
                watched.append((now(), event["object"]["metadata"]["name"]))

        follower = asyncio.create_task(follow())
        await asyncio.sleep(1)
        frozen.pause()
        write = asyncio.create_task(frozen.create(RSV, body("from-frozen")))
        await other.create(RSV, body("from-other"))
        await asyncio.sleep(10)
        assert [r["metadata"]["name"] for r in server.reservations()] == ["from-other"]
        assert not write.done()
        assert watched == []
        frozen.resume()
        created = await write
        assert created["metadata"]["name"] == "from-frozen"
        assert now() == 11.0
        await asyncio.sleep(1)
        assert watched == [(11.0, "from-other"), (11.0, "from-frozen")]
        follower.cancel()

    simulate(scenario)


def test_a_killed_client_fails_everything_outstanding_at_once_and_everything_after() -> None:
    async def scenario(server: FakeApiServer) -> None:
        api = server.client("doomed", FaultPlan(latency=100.0, seed=3))
        slow = asyncio.create_task(outcome(api.create(RSV, body("slow"))))
        api2 = server.client("doomed-too")
        watch_result = asyncio.create_task(read(api2, str(server.resource_version), 60))
        api2.pause()
        blocked = asyncio.create_task(outcome(api2.create(RSV, body("blocked"))))
        await asyncio.sleep(1)
        api.kill()
        api2.kill()
        assert await slow == "unavailable"
        assert await blocked == "unavailable"
        assert await watch_result == ["broken"]
        assert now() == 1.0
        assert await outcome(api.get(f"{RSV}/slow")) == "unavailable"
        assert server.reservations() == []  # neither reached the store
        assert api.killed
        assert api2.killed

    simulate(scenario)


def test_a_client_timeout_turns_a_long_pause_into_unavailable() -> None:
    async def scenario(server: FakeApiServer) -> None:
        api = server.client("partitioned", timeout=30)
        api.pause()
        started = now()
        assert await outcome(api.create(RSV, body("a"))) == "unavailable"
        assert now() - started == 30
        api.resume()
        await asyncio.sleep(1)
        assert server.reservations() == []  # the abandoned request never lands
        assert await outcome(api.create(RSV, body("b"))) == "ok"

    simulate(scenario)
