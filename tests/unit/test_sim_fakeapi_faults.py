"""Faults, pauses and kills on the fake API server, and a small controller surviving them.

Each request fate is checked for the one thing the control code must get right:
whether the server applied the request. The last tests run a toy admission
controller through a seeded storm (faults, a crash and restart, a pause) and
check an invariant at every mutation, the way the simulation driver will.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from headroom.kube.transport import (
    JSON,
    ApiError,
    ApiUnavailableError,
    Transport,
    list_all,
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


# -- a small controller through a storm --------------------------------------------------------

CAPACITY = 100


async def toy_admission(api: Transport) -> None:
    """Admit reservations in creation order while the node has room: list, then watch.

    Deliberately written the way the operator is: decide in memory first, write
    ``status`` with a JSON patch that tests the uid, treat a lost answer as "maybe
    applied", relist on 410 and on a schedule (events can be lost).
    """
    used: dict[str, int] = {}  # uid -> MiB admitted

    async def decide(obj: JSON) -> None:
        meta = obj["metadata"]
        if (obj.get("status") or {}).get("phase") or meta["uid"] in used:
            return
        ram = obj["spec"]["ramMB"]
        admitted = sum(used.values()) + ram <= CAPACITY
        if admitted:
            used[meta["uid"]] = ram
        status = {"phase": "Admitted" if admitted else "Rejected"}
        operations = [
            {"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
            {"op": "add", "path": "/status", "value": status},
        ]
        for _ in range(20):
            try:
                await api.json_patch(f"{RSV}/{meta['name']}/status", operations)
                return
            except ApiError as error:
                if not error.retriable:
                    return  # 404: deleted; 422: another incarnation
            except ApiUnavailableError:
                pass  # maybe applied: writing the same decision again is harmless
            await asyncio.sleep(0.5)

    async def relist() -> str:
        while True:
            try:
                items, version = await list_all(api, RSV, limit=7)
                break
            except (ApiError, ApiUnavailableError):
                await asyncio.sleep(1)
        present = {i["metadata"]["uid"] for i in items}
        for uid in [u for u in used if u not in present]:
            del used[uid]
        for item in items:
            if (item.get("status") or {}).get("phase") == "Admitted":
                used[item["metadata"]["uid"]] = item["spec"]["ramMB"]
        for item in sorted(items, key=lambda i: i["metadata"]["creationTimestamp"]):
            await decide(item)
        return version

    version = await relist()
    last_relist = asyncio.get_running_loop().time()
    while True:
        try:
            async for event in api.watch(RSV, resource_version=version, timeout_seconds=20):
                obj = event["object"]
                if event["type"] == "ERROR":
                    raise ApiError(obj["code"], obj["reason"], obj["message"])
                version = obj["metadata"]["resourceVersion"]
                if event["type"] == "DELETED":
                    used.pop(obj["metadata"]["uid"], None)
                elif event["type"] in ("ADDED", "MODIFIED"):
                    await decide(obj)
        except ApiError as error:
            if error.gone:
                version = await relist()
                continue
            await asyncio.sleep(1)
        except ApiUnavailableError:
            await asyncio.sleep(1)
        if asyncio.get_running_loop().time() - last_relist > 30:
            version, last_relist = await relist(), asyncio.get_running_loop().time()


def storm_faults(seed: int) -> FaultPlan:
    return FaultPlan(
        seed=seed,
        throttle=0.05,
        server_error=0.05,
        refuse=0.05,
        lose_answer=0.05,
        latency=0.05,
        watch_drop=0.02,
        watch_duplicate=0.05,
        watch_break=0.02,
    )


def storm(seed: int, reservations: int = 20) -> list[tuple[float, str, str, str | None]]:
    """A seeded storm around the toy controller; returns the trace of every mutation."""

    async def main() -> list[tuple[float, str, str, str | None]]:
        server = FakeApiServer(seed=seed, history_limit=50)
        server.ensure_namespace(NS)
        trace: list[tuple[float, str, str, str | None]] = []
        admitted: dict[str, int] = {}

        def check(type_: str, obj: JSON) -> None:
            if obj.get("kind") != "Reservation":
                return
            name, phase = obj["metadata"]["name"], (obj.get("status") or {}).get("phase")
            trace.append((now(), type_, name, phase))
            if type_ != "DELETED" and phase == "Admitted":
                admitted[obj["metadata"]["uid"]] = obj["spec"]["ramMB"]
            else:
                admitted.pop(obj["metadata"]["uid"], None)
            assert sum(admitted.values()) <= CAPACITY, "over the node's limit"

        server.subscribe(check)
        first = server.client("operator-0", storm_faults(seed))
        operator = asyncio.create_task(toy_admission(first))
        rng = random.Random(seed)
        for i in range(reservations):
            await asyncio.sleep(rng.uniform(0, 2))
            server.create_reservation(NS, f"r{i}", "n1", rng.choice((10, 20, 30)))
            if i == reservations // 2:  # crash and restart
                first.kill()
                operator.cancel()
                second = server.client("operator-1", storm_faults(seed + 1))
                operator = asyncio.create_task(toy_admission(second))
            if rng.random() < 0.2:
                victim = rng.choice(server.reservations())["metadata"]["name"]
                server.delete_reservation(NS, victim)
        for _ in range(120):  # quiesce: every reservation decided
            if all((r.get("status") or {}).get("phase") for r in server.reservations()):
                break
            await asyncio.sleep(1)
        operator.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await operator
        assert not server.listener_errors
        assert all((r.get("status") or {}).get("phase") for r in server.reservations())
        return trace

    return run_virtual(main(), max_virtual_seconds=600)


def test_a_toy_controller_survives_a_seeded_storm_and_replays_exactly() -> None:
    first = storm(11)
    assert len(first) > 30
    assert storm(11) == first
    assert storm(12) != first


def storm_digest(seed: int) -> str:
    return hashlib.sha256(json.dumps(storm(seed)).encode()).hexdigest()


def test_a_storm_replays_exactly_in_another_process_with_another_hash_seed() -> None:
    code = "from tests.unit.test_sim_fakeapi_faults import storm_digest; print(storm_digest(11))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONHASHSEED": "777"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == storm_digest(11)


def test_storms_are_fast() -> None:
    started = time.perf_counter()
    for seed in range(20):
        storm(seed)
    assert time.perf_counter() - started < 10  # about 20 ms each on a shared core
