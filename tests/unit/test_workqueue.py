"""The keyed work queue's promises, on the simulation's virtual loop (time is exact).

Each pass of a key waits on a gate the test opens, so a test decides when a pass
ends, and what was added meanwhile.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.kube.workqueue import WorkQueue
from headroom_dev.sim.loop import VirtualClock, run_virtual


def now() -> float:
    return asyncio.get_running_loop().time()


@dataclass
class Recorder:
    """What the passes did: when each key's pass started and ended, and how many ran at once."""

    starts: list[tuple[str, float, int]] = field(default_factory=list)  # key, time, seq
    running: dict[str, int] = field(default_factory=dict)
    most_at_once: int = 0
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)  # keys whose current pass fails
    seq: int = 0
    queue: WorkQueue[str] | None = None
    hold: bool = True  # passes wait for the test to open their gate

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    async def process(self, key: str) -> None:
        self.starts.append((key, now(), self.tick()))
        self.running[key] = self.running.get(key, 0) + 1
        self.most_at_once = max(self.most_at_once, self.running[key])
        try:
            if self.hold:
                gate = self.gates[key] = asyncio.Event()
                await gate.wait()
            if key in self.failing:
                self.failing.discard(key)
                assert self.queue is not None
                self.queue.add_rate_limited(key)
            elif self.queue is not None:
                self.queue.forget(key)
        finally:
            self.running[key] -= 1

    def finish(self, key: str, *, fail: bool = False) -> bool:
        gate = self.gates.pop(key, None)
        if gate is None:
            return False
        if fail:
            self.failing.add(key)
        gate.set()
        return True

    def times(self, key: str) -> list[float]:
        return [t for k, t, _ in self.starts if k == key]


def queue_for(recorder: Recorder, seed: int = 1) -> WorkQueue[str]:
    queue = WorkQueue(recorder.process, clock=VirtualClock(), rng=random.Random(seed), base=1.0)
    recorder.queue = queue
    return queue


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_key_added_many_times_before_its_pass_is_processed_once() -> None:
    async def main() -> list[float]:
        recorder = Recorder(hold=False)
        queue = queue_for(recorder)
        for _ in range(3):
            queue.add("a")
        queue.add("b")
        await settle()
        assert queue.idle
        return [t for k, t, _ in recorder.starts if k == "a"]

    assert run_virtual(main(), max_virtual_seconds=10) == [0.0]


def test_an_add_during_a_pass_processes_the_key_once_more_after_it_never_at_once() -> None:
    async def main() -> Recorder:
        recorder = Recorder()
        queue = queue_for(recorder)
        queue.add("a")
        await settle()
        assert queue.is_processing("a")
        for _ in range(3):
            queue.add("a")  # dirty: not a second pass now
        await settle()
        assert len(recorder.starts) == 1
        await asyncio.sleep(1)
        recorder.finish("a")
        await settle()
        assert len(recorder.starts) == 2  # requeued because dirty, once
        recorder.finish("a")
        await settle()
        assert queue.idle
        return recorder

    recorder = run_virtual(main(), max_virtual_seconds=10)
    assert recorder.times("a") == [0.0, 1.0]
    assert recorder.most_at_once == 1


def test_add_after_keeps_the_earliest_time_a_later_one_never_hides_a_sooner_one() -> None:
    async def main() -> Recorder:
        recorder = Recorder(hold=False)
        queue = queue_for(recorder)
        queue.add_after("a", 10)
        queue.add_after("a", 2)  # sooner: it wins (a second timer on a key once dropped it)
        queue.add_after("a", 7)  # later than the one pending: nothing changes
        assert queue.waiting("a") == 2.0
        await asyncio.sleep(20)
        return recorder

    recorder = run_virtual(main(), max_virtual_seconds=30)
    assert recorder.times("a") == [2.0]


def test_add_after_while_the_key_is_processed_runs_it_again_after_the_pass() -> None:
    async def main() -> Recorder:
        recorder = Recorder()
        queue = queue_for(recorder)
        queue.add("a")
        await settle()
        queue.add_after("a", 1)
        await asyncio.sleep(3)  # the timer fired during the pass: dirty
        recorder.finish("a")
        await settle()
        recorder.finish("a")
        await settle()
        return recorder

    assert run_virtual(main(), max_virtual_seconds=10).times("a") == [0.0, 3.0]


def test_failures_back_off_per_key_doubling_jittered_to_the_cap_and_forget_starts_over() -> None:
    async def main() -> tuple[list[float], list[float], int]:
        recorder = Recorder(hold=False)
        queue = WorkQueue(
            recorder.process, clock=VirtualClock(), rng=random.Random(7), base=1.0, cap=8.0
        )
        delays = [queue.add_rate_limited("a") for _ in range(6)]
        failures = queue.failures("a")
        queue.forget("a")
        again = [queue.add_rate_limited("a")]
        queue.forget("a")
        # Another key's failures are its own.
        again.append(queue.add_rate_limited("b"))
        await queue.shut_down()
        return delays, again, failures

    delays, again, failures = run_virtual(main(), max_virtual_seconds=10)
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True)), delays
    assert len(set(delays)) == len(delays)  # jittered, not one fixed step
    assert failures == 6
    assert all(0.5 <= d <= 1.0 for d in again), again


def test_a_failed_pass_waits_for_its_backoff_even_if_the_key_was_added_meanwhile() -> None:
    async def main() -> Recorder:
        recorder = Recorder()
        queue = queue_for(recorder, seed=3)
        queue.add("a")
        await settle()
        queue.add("a")  # dirty, but the pass fails: the backoff decides
        recorder.finish("a", fail=True)
        await settle()
        assert len(recorder.starts) == 1
        deadline = queue.waiting("a")
        assert deadline is not None
        assert 0.5 <= deadline <= 1.0
        await asyncio.sleep(1.5)
        recorder.finish("a")
        await settle()
        return recorder

    recorder = run_virtual(main(), max_virtual_seconds=10)
    assert len(recorder.times("a")) == 2
    assert 0.5 <= recorder.times("a")[1] <= 1.0


def test_an_exception_in_one_pass_stops_neither_that_key_nor_the_others() -> None:
    async def main() -> list[str]:
        done: list[str] = []

        async def process(key: str) -> None:
            if key == "bad" and "bad" not in done:
                done.append("bad")
                raise RuntimeError("boom")
            done.append(key)

        queue = WorkQueue(process, clock=VirtualClock(), rng=random.Random(1))
        queue.add("bad")
        queue.add("good")
        await settle()
        queue.add("bad")
        await settle()
        return done

    assert run_virtual(main(), max_virtual_seconds=10) == ["bad", "good", "bad"]


def test_shut_down_cancels_timers_and_waits_for_the_pass_in_flight() -> None:
    async def main() -> tuple[Recorder, bool]:
        recorder = Recorder()
        queue = queue_for(recorder)
        queue.add("a")
        queue.add_after("b", 5)
        await settle()
        asyncio.get_running_loop().call_later(1, recorder.finish, "a")
        await queue.shut_down()  # returns once the pass of "a" ended
        ended = recorder.running["a"] == 0
        queue.add("c")  # nothing after shut-down
        await asyncio.sleep(10)
        return recorder, ended

    recorder, ended = run_virtual(main(), max_virtual_seconds=20)
    assert ended
    assert [k for k, _, _ in recorder.starts] == ["a"]


def test_shut_down_cancels_a_pass_that_outlives_its_grace() -> None:
    async def main() -> float:
        recorder = Recorder()
        queue = WorkQueue(recorder.process, clock=VirtualClock(), rng=random.Random(1), grace=2)
        queue.add("a")
        await settle()
        await queue.shut_down()  # nobody opens the gate: cancelled after 2 s
        assert recorder.running["a"] == 0
        return now()

    assert run_virtual(main(), max_virtual_seconds=20) == 2.0


KEYS = ("a", "b", "c")
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(KEYS), st.just(0.0)),
        st.tuples(st.just("add_after"), st.sampled_from(KEYS), st.floats(0.1, 5.0)),
        st.tuples(st.just("done"), st.sampled_from(KEYS), st.just(0.0)),
        st.tuples(st.just("fail"), st.sampled_from(KEYS), st.just(0.0)),
        st.tuples(st.just("wait"), st.just(""), st.floats(0.0, 3.0)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_no_interleaving_runs_a_key_twice_at_once_or_loses_an_add(
    ops: list[tuple[str, str, float]],
) -> None:
    """Whatever the order of adds, delayed adds, passes ending and failing: a key is in
    one pass at most at a time, and every add is followed by a pass of its key that
    started after it (an add during a pass included)."""

    async def main() -> tuple[Recorder, list[tuple[str, int]]]:
        recorder = Recorder()
        queue = queue_for(recorder, seed=len(ops))
        adds: list[tuple[str, int]] = []
        for op, key, value in ops:
            if op == "add":
                adds.append((key, recorder.tick()))
                queue.add(key)
            elif op == "add_after":
                adds.append((key, recorder.tick()))
                queue.add_after(key, value)
            elif op in ("done", "fail"):
                recorder.finish(key, fail=op == "fail")
            else:
                await asyncio.sleep(value)
            await asyncio.sleep(0)
        # Let every pass end (none fails now) and every timer fire.
        for _ in range(200):
            for key in list(recorder.gates):
                recorder.finish(key)
            await asyncio.sleep(1)
            if queue.idle and all(queue.waiting(k) is None for k in KEYS):
                break
        assert queue.idle
        return recorder, adds

    recorder, adds = run_virtual(main(), max_virtual_seconds=1000)
    assert recorder.most_at_once <= 1
    for key, at in adds:
        assert any(k == key and seq > at for k, _, seq in recorder.starts), (key, at)
