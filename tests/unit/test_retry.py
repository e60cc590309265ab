"""``retry_call``'s rules, on the simulation's virtual loop (time is exact, nothing waits).

Each test scripts what the call answers attempt by attempt, and checks when each
attempt was made against the delays a twin backoff (same seed) draws.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import pytest

from headroom.kube.backoff import Backoff
from headroom.kube.retry import api_failure, retry_call, transient
from headroom.kube.transport import ApiError, ApiUnavailableError
from headroom_dev.sim.loop import VirtualClock, run_virtual


def backoffs(seed: int = 7) -> tuple[Backoff, Backoff]:
    """The one retry_call uses, and a twin that says what it will draw."""
    return (
        Backoff(base=0.2, cap=1.0, rng=random.Random(seed)),
        Backoff(base=0.2, cap=1.0, rng=random.Random(seed)),
    )


@dataclass
class Script:
    """A call that fails with each of ``failures`` in turn, then returns ``result``."""

    failures: list[Exception]
    result: str = "done"
    times: list[float] = field(default_factory=list)

    async def __call__(self) -> str:
        self.times.append(asyncio.get_running_loop().time())
        if self.failures:
            raise self.failures.pop(0)
        return self.result


def sums(delays: list[float]) -> list[float]:
    total, out = 0.0, [0.0]
    for delay in delays:
        total += delay
        out.append(total)
    return out


def test_a_call_that_succeeds_is_made_once_and_draws_no_delay() -> None:
    backoff, twin = backoffs()
    script = Script([])

    async def main() -> str:
        return await retry_call(script, backoff=backoff)

    assert run_virtual(main(), max_virtual_seconds=10) == "done"
    assert script.times == [0.0]
    assert backoff.next() == twin.next()  # nothing drawn: the first delay is still to come


def test_transient_failures_are_tried_again_after_the_backoff_s_delays() -> None:
    backoff, twin = backoffs()
    failures: list[Exception] = [
        ApiUnavailableError("refused"),
        ApiError(503, "ServiceUnavailable", ""),
        ApiError(429, "TooManyRequests", ""),
        ApiError(500, "InternalError", ""),
    ]
    script = Script(list(failures))
    told: list[tuple[Exception, float, float]] = []

    async def main() -> str:
        return await retry_call(
            script,
            backoff=backoff,
            on_retry=lambda error, delay: told.append(
                (error, delay, asyncio.get_running_loop().time())
            ),
        )

    assert run_virtual(main(), max_virtual_seconds=60) == "done"
    delays = [twin.next() for _ in failures]
    assert script.times == pytest.approx(sums(delays))
    # Told each failure and its delay before sleeping it, at the failed attempt's time.
    assert [error for error, _, _ in told] == failures
    assert [delay for _, delay, _ in told] == delays
    assert [at for _, _, at in told] == pytest.approx(sums(delays)[:-1])


@pytest.mark.parametrize("status", [400, 403, 404, 409, 410, 422])
def test_an_answer_that_says_no_is_raised_at_once_by_default(status: int) -> None:
    backoff, _ = backoffs()
    script = Script([ApiError(status, "No", "")])

    async def main() -> str:
        return await retry_call(script, backoff=backoff)

    with pytest.raises(ApiError) as raised:
        run_virtual(main(), max_virtual_seconds=10)
    assert raised.value.status == status
    assert script.times == [0.0]


def test_an_error_that_is_not_an_api_failure_is_never_retried() -> None:
    backoff, _ = backoffs()
    script = Script([RuntimeError("a bug")])

    async def main() -> str:
        return await retry_call(script, backoff=backoff, retry_on=api_failure)

    with pytest.raises(RuntimeError):
        run_virtual(main(), max_virtual_seconds=10)
    assert script.times == [0.0]


def test_retry_on_decides_what_is_tried_again() -> None:
    backoff, twin = backoffs()
    script = Script([ApiError(403, "Forbidden", ""), ApiError(404, "NotFound", "")])

    async def main() -> str:
        return await retry_call(script, backoff=backoff, retry_on=api_failure)

    assert run_virtual(main(), max_virtual_seconds=60) == "done"
    assert script.times == pytest.approx(sums([twin.next(), twin.next()]))


def test_attempts_bound_the_calls_and_the_last_failure_is_raised_without_a_delay() -> None:
    backoff, twin = backoffs()
    last = ApiUnavailableError("third")
    script = Script([ApiUnavailableError("first"), ApiUnavailableError("second"), last])

    async def main() -> str:
        return await retry_call(script, backoff=backoff, attempts=3)

    with pytest.raises(ApiUnavailableError) as raised:
        run_virtual(main(), max_virtual_seconds=60)
    assert raised.value is last
    delays = [twin.next(), twin.next()]
    assert script.times == pytest.approx(sums(delays))
    assert backoff.next() == twin.next()  # no delay was drawn after the last attempt


def test_a_deadline_stops_before_an_attempt_that_would_start_past_it() -> None:
    backoff, twin = backoffs()
    delays = [twin.next() for _ in range(4)]
    # Room for the first two delays, not for the third.
    deadline = sum(delays[:2]) + delays[2] / 2
    script = Script([ApiUnavailableError(str(n)) for n in range(10)])

    async def main() -> str:
        return await retry_call(script, backoff=backoff, deadline=deadline, clock=VirtualClock())

    with pytest.raises(ApiUnavailableError) as raised:
        run_virtual(main(), max_virtual_seconds=60)
    assert str(raised.value) == "2"
    assert script.times == pytest.approx(sums(delays[:2]))


def test_retry_call_never_resets_the_caller_s_backoff() -> None:
    backoff, twin = backoffs()

    async def main() -> None:
        await retry_call(Script([ApiUnavailableError("x")]), backoff=backoff)
        await retry_call(Script([ApiUnavailableError("y")]), backoff=backoff)

    run_virtual(main(), max_virtual_seconds=60)
    twin.next()
    twin.next()
    assert backoff.next() == twin.next()  # the third delay: it kept growing


def test_cancelling_the_caller_while_it_backs_off_ends_it() -> None:
    backoff, _ = backoffs()
    script = Script([ApiUnavailableError(str(n)) for n in range(100)])

    async def main() -> int:
        task = asyncio.create_task(retry_call(script, backoff=backoff))
        await asyncio.sleep(2.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        made = len(script.times)
        await asyncio.sleep(10)
        return made

    made = run_virtual(main(), max_virtual_seconds=60)
    assert len(script.times) == made  # nothing after the cancel
    assert made > 1


def test_bad_bounds_are_refused() -> None:
    backoff, _ = backoffs()

    async def no_attempts() -> str:
        return await retry_call(Script([]), backoff=backoff, attempts=0)

    async def a_deadline_without_a_clock() -> str:
        return await retry_call(Script([]), backoff=backoff, deadline=5.0)

    with pytest.raises(ValueError, match="attempts"):
        run_virtual(no_attempts(), max_virtual_seconds=1)
    with pytest.raises(ValueError, match="clock"):
        run_virtual(a_deadline_without_a_clock(), max_virtual_seconds=1)


@pytest.mark.parametrize(
    ("error", "is_transient", "is_api_failure"),
    [
        (ApiUnavailableError("no answer"), True, True),
        (ApiError(429, "TooManyRequests", ""), True, True),
        (ApiError(500, "InternalError", ""), True, True),
        (ApiError(504, "GatewayTimeout", ""), True, True),
        (ApiError(409, "Conflict", ""), False, True),
        (ApiError(404, "NotFound", ""), False, True),
        (ApiError(403, "Forbidden", ""), False, True),
        (ApiError(422, "Invalid", ""), False, True),
        (ValueError("bad bundle"), False, False),
        (TimeoutError(), False, False),
    ],
)
def test_the_two_rules(error: Exception, is_transient: bool, is_api_failure: bool) -> None:
    assert transient(error) is is_transient
    assert api_failure(error) is is_api_failure
