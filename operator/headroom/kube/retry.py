"""One call, tried again until it succeeds: the single retry loop of the operator.

Every part retries some API call that must succeed in the end (a lookup the
decider waits on, the pod calls of the gates, a Secret annotation, a watch).
Each once carried its own ``while True`` with a slightly different rule: which
answers are worth another try, whether a refusal is logged, whether it stops
after a few attempts or when this process is no longer leader. Here the loop is
written once, and every rule is a parameter the caller states:

- ``retry_on``: which failures are tried again; any other is raised at once.
  :func:`transient` (no answer, 429, 5xx) for calls whose refusals are final;
  :func:`api_failure` (any failed API call) for reads that must answer in the end,
  whatever the server says meanwhile (a 403 fixed by an administrator, say).
  What an answer *means* (404: gone, 409: someone else made it) is the call's own
  business: it turns it into a result before ``retry_call`` sees it.
- ``backoff``: the caller's :class:`~headroom.kube.backoff.Backoff`, so its base
  and cap stay the caller's, and so does when it starts over: ``retry_call``
  never resets it (a watch resets it on each event, the certificate keeper after
  each success).
- ``attempts`` / ``deadline``: an optional bound; past it the last failure is
  raised. Without one it tries until it succeeds, or until the caller's task is
  cancelled (cancellation is never retried).
- ``on_retry``: told each failure and the delay before the next attempt (the
  caller's log line).

A rule that depends on the world between attempts (is this process still the
leader? what does the record say now?) belongs to the call: it is made again
for every attempt, reads what it needs, and raises what must not be retried.

Sleeping is ``asyncio.sleep`` and the jitter is the backoff's injected random
source: on the simulation's virtual loop a run replays exactly from its seed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.transport import ApiError, ApiUnavailableError

__all__ = ["api_failure", "retry_call", "transient"]

T = TypeVar("T")


def transient(error: Exception) -> bool:
    """No answer, or one that says "not now" (429, 5xx): the same call may succeed later."""
    return isinstance(error, ApiUnavailableError) or (
        isinstance(error, ApiError) and error.retriable
    )


def api_failure(error: Exception) -> bool:
    """Any failed API call, refusals included: for a call that must succeed in the end."""
    return isinstance(error, (ApiError, ApiUnavailableError))


async def retry_call(
    call: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    retry_on: Callable[[Exception], bool] = transient,
    on_retry: Callable[[Exception, float], None] | None = None,
    attempts: int | None = None,
    deadline: float | None = None,
    clock: Clock | None = None,
) -> T:
    """``await call()`` until it returns; a failure ``retry_on`` accepts is tried again
    after ``backoff.next()`` seconds (``on_retry(error, delay)`` is told first).

    ``attempts`` bounds the calls made; ``deadline`` (monotonic, on ``clock``) the
    time: an attempt that would start past it is not made. Either way the last
    failure is raised, with no delay drawn after the last attempt made.
    """
    if attempts is not None and attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    if deadline is not None and clock is None:
        raise ValueError("a deadline needs the clock it is read on")
    made = 0
    while True:
        try:
            return await call()
        except Exception as error:
            made += 1
            if not retry_on(error) or (attempts is not None and made >= attempts):
                raise
            delay = backoff.next()
            if deadline is not None and clock is not None and clock.monotonic() + delay > deadline:
                raise
            if on_retry is not None:
                on_retry(error, delay)
            await asyncio.sleep(delay)
