"""A toy admission controller through seeded storms on the fake API server.

What the simulation driver will do with the real control code, in miniature:
every request and watch fault, a crash and restart, tenants creating and
deleting; an invariant ("never over the node's limit") checked at every
mutation through ``subscribe``; every reservation decided once the storm
quiesces; the same seed giving the same trace, in this process and another.
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
from pathlib import Path

from headroom.kube.transport import (
    JSON,
    ApiError,
    ApiUnavailableError,
    Transport,
    list_all,
    resource_path,
)
from headroom_dev.sim.fakeapi import FakeApiServer, FaultPlan
from headroom_dev.sim.loop import run_virtual

NS = "ml"
RSV = resource_path("headroom.dev", "v1alpha1", "reservations", NS)


def now() -> float:
    return asyncio.get_running_loop().time()


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
    code = "from tests.unit.test_sim_storm import storm_digest; print(storm_digest(11))"
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
