"""The virtual-time event loop: asyncio unchanged, time virtual, runs repeatable.

Determinism is checked the strict way: the same seeded program traced twice in
this process and once in a fresh interpreter with another hash seed.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from headroom_dev.sim.loop import (
    DEFAULT_EPOCH,
    BusyLoopError,
    DeadlockError,
    RealIOError,
    VirtualClock,
    VirtualEventLoop,
    VirtualTimeExceededError,
    run_virtual,
)

ROOT = Path(__file__).resolve().parents[2]


def loop_time() -> float:
    return asyncio.get_running_loop().time()


def test_sleeping_an_hour_takes_no_real_time() -> None:
    async def main() -> tuple[float, float]:
        await asyncio.sleep(3600)
        clock = VirtualClock()
        return loop_time(), (clock.now() - DEFAULT_EPOCH).total_seconds()

    started = time.perf_counter()
    assert run_virtual(main(), max_virtual_seconds=4000) == (3600.0, 3600.0)
    assert time.perf_counter() - started < 1.0


def test_time_starts_where_asked_and_the_clock_follows_the_loop() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualEventLoop)
        await asyncio.sleep(5)
        return loop.clock.monotonic(), (loop.clock.now() - DEFAULT_EPOCH).total_seconds()

    assert run_virtual(main(), start=100.0, max_virtual_seconds=10) == (105.0, 105.0)


def test_timers_fire_in_time_order_at_their_exact_times() -> None:
    fired: list[tuple[float, str]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for delay, name in ((3.0, "c"), (1.0, "a"), (2.5, "b"), (0.1, "first")):
            loop.call_later(delay, lambda n=name: fired.append((loop_time(), n)))
        await asyncio.sleep(10)

    run_virtual(main(), max_virtual_seconds=10)
    assert fired == [(0.1, "first"), (1.0, "a"), (2.5, "b"), (3.0, "c")]


def test_asyncio_primitives_work_unchanged() -> None:
    async def main() -> list[object]:
        results: list[object] = []
        event = asyncio.Event()

        async def setter() -> None:
            await asyncio.sleep(2)
            event.set()

        setter_task = asyncio.create_task(setter())
        await event.wait()
        results.append(("event", loop_time()))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), 1.5)
        results.append(("wait_for", loop_time()))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.25):
                await asyncio.Event().wait()
        results.append(("timeout", loop_time()))
        sleeper = asyncio.create_task(asyncio.sleep(50))
        await asyncio.sleep(1)
        sleeper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sleeper
        results.append(("cancel", loop_time()))
        async with asyncio.TaskGroup() as group:
            for delay in (3, 1, 2):
                group.create_task(asyncio.sleep(delay))
        results.append(("taskgroup", loop_time()))
        queue: asyncio.Queue[int] = asyncio.Queue()
        asyncio.get_running_loop().call_later(0.5, queue.put_nowait, 7)
        results.append(("queue", await queue.get(), loop_time()))
        await setter_task
        return results

    assert run_virtual(main(), max_virtual_seconds=100) == [
        ("event", 2.0),
        ("wait_for", 3.5),
        ("timeout", 3.75),
        ("cancel", 4.75),
        ("taskgroup", 7.75),
        ("queue", 7, 8.25),
    ]


def test_the_main_coroutines_exception_propagates() -> None:
    async def main() -> None:
        await asyncio.sleep(1)
        raise ValueError("from the simulation")

    with pytest.raises(ValueError, match="from the simulation"):
        run_virtual(main(), max_virtual_seconds=10)


def test_a_livelock_fails_at_the_bound_and_names_the_stuck_task() -> None:
    async def retry_forever() -> None:
        while True:  # noqa: ASYNC110 - the livelock under test
            await asyncio.sleep(1)

    async def main() -> None:
        await asyncio.create_task(retry_forever(), name="retrier")

    with pytest.raises(
        VirtualTimeExceededError, match=r"(?s)bound of 60 s.*retrier.*retry_forever"
    ):
        run_virtual(main(), max_virtual_seconds=60)


def test_a_busy_loop_that_never_lets_time_advance_fails() -> None:
    async def spin() -> None:
        while True:  # noqa: ASYNC110 - the busy loop under test
            await asyncio.sleep(0)

    with pytest.raises(BusyLoopError, match="without time advancing"):
        run_virtual(spin(), max_virtual_seconds=60, max_steps_per_instant=1000)


def test_many_steps_are_fine_when_time_advances() -> None:
    async def tick() -> int:
        for _ in range(5000):
            await asyncio.sleep(0.001)
        return 1

    assert run_virtual(tick(), max_virtual_seconds=60, max_steps_per_instant=10) == 1


def test_waiting_for_what_can_never_happen_is_a_deadlock() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(DeadlockError, match="nothing is ready and no timer"):
        run_virtual(main(), max_virtual_seconds=60)


def test_threads_and_file_descriptors_fail_loudly() -> None:
    async def thread() -> None:
        await asyncio.to_thread(time.sleep, 0)

    with pytest.raises(RealIOError, match="threads run in real time"):
        run_virtual(thread(), max_virtual_seconds=1)

    async def reader() -> None:
        asyncio.get_running_loop().add_reader(0, lambda: None)

    with pytest.raises(RealIOError, match="add_reader"):
        run_virtual(reader(), max_virtual_seconds=1)

    async def connect() -> None:
        await asyncio.open_connection("127.0.0.1", 1)

    with pytest.raises(RealIOError):
        run_virtual(connect(), max_virtual_seconds=1)


def test_tasks_left_running_are_cancelled_in_creation_order() -> None:
    order: list[str] = []

    async def background(name: str) -> None:
        try:
            await asyncio.sleep(1000)
        finally:
            order.append(name)

    async def main() -> None:
        left = [asyncio.create_task(background(n)) for n in ("one", "two", "three", "four")]
        await asyncio.sleep(1)
        assert not any(task.done() for task in left)

    run_virtual(main(), max_virtual_seconds=10)
    assert order == ["one", "two", "three", "four"]


def test_the_garbage_collector_is_paused_only_during_the_run() -> None:
    seen: list[bool] = []

    async def main() -> None:
        seen.append(gc.isenabled())

    assert gc.isenabled()
    run_virtual(main(), max_virtual_seconds=1)
    assert seen == [False]
    assert gc.isenabled()


def scenario_trace(seed: int) -> list[tuple[float, str]]:
    """A seeded tangle of tasks, timers, events, timeouts and cancellations, traced."""
    trace: list[tuple[float, str]] = []

    async def worker(
        name: str, rng: random.Random, lock: asyncio.Lock, ready: asyncio.Event
    ) -> None:
        for step in range(20):
            await asyncio.sleep(rng.choice((0, 0.001, 0.5, 1.0)))
            if rng.random() < 0.2:
                try:
                    await asyncio.wait_for(ready.wait(), rng.uniform(0, 2))
                except TimeoutError:
                    trace.append((loop_time(), f"{name} timed out at {step}"))
            async with lock:
                trace.append((loop_time(), f"{name} step {step}"))
                await asyncio.sleep(0)

    async def main() -> None:
        rng = random.Random(seed)
        lock, ready = asyncio.Lock(), asyncio.Event()
        names = {f"w{i}" for i in range(12)}  # a set: its order varies with the hash seed
        tasks = {
            name: asyncio.create_task(worker(name, random.Random(rng.random()), lock, ready))
            for name in sorted(names)
        }
        asyncio.get_running_loop().call_later(3.3, ready.set)
        await asyncio.sleep(2)
        tasks["w3"].cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        trace.append((loop_time(), "done"))

    run_virtual(main(), max_virtual_seconds=1000)
    return trace


def trace_digest(seed: int) -> str:
    return hashlib.sha256(json.dumps(scenario_trace(seed)).encode()).hexdigest()


def test_the_same_seeded_program_gives_the_same_trace_every_time() -> None:
    first = scenario_trace(42)
    assert len(first) > 200
    assert scenario_trace(42) == first
    assert scenario_trace(43) != first


def test_the_trace_is_the_same_in_another_process_with_another_hash_seed() -> None:
    code = "from tests.unit.test_sim_loop import trace_digest; print(trace_digest(42))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == trace_digest(42)


def test_the_clock_reads_zero_before_any_loop_runs() -> None:
    assert VirtualClock().monotonic() == 0.0
    assert VirtualClock().now() == DEFAULT_EPOCH
    assert VirtualClock(epoch=DEFAULT_EPOCH + timedelta(days=1)).now() > DEFAULT_EPOCH
