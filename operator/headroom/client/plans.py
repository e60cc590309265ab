"""One claim procedure, run synchronously or under asyncio.

Claiming is a small protocol: create, poll until decided (through ``Queued``),
withdraw on a timeout, fail over to the next node, clean up when interrupted,
heartbeat. Written twice (blocking and async) the two copies would drift, so it is
written once, as a generator that *yields* what it needs done — an API call
(:class:`Call`) or a pause (:class:`Sleep`) — and receives the result, or the
exception, back. :func:`run` does those steps in the calling thread;
:func:`run_async` runs each call in a worker thread (``asyncio.to_thread``: the
official client blocks, the event loop must not) and pauses with
``asyncio.sleep``. Interruptions (``KeyboardInterrupt``, ``SystemExit`` from a
SIGTERM handler, task cancellation) are thrown into the procedure like any other
exception, so its clean-up (delete what was created) runs in either world.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """Run ``fn(*args, **kwargs)`` (blocking) and send back its result."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Sleep:
    seconds: float


Step = Call | Sleep
Plan = Generator[Step, Any, T]


def call(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Generator[Step, Any, R]:
    """``result = yield from call(fn, ...)``: typed as ``fn`` returns."""
    result: R = yield Call(fn, args, kwargs)
    return result


def pause(seconds: float) -> Generator[Step, Any, None]:
    yield Sleep(seconds)


def run(plan: Plan[T], sleep: Callable[[float], None] = time.sleep) -> T:
    """Run a procedure in this thread; ``sleep`` may raise to stop it."""
    advance: Callable[[], Step] = partial(plan.send, None)
    while True:
        try:
            step = advance()
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            if isinstance(step, Sleep):
                sleep(step.seconds)
                advance = partial(plan.send, None)
            else:
                advance = partial(plan.send, step.fn(*step.args, **step.kwargs))
        except BaseException as error:  # the procedure decides what an interruption does
            advance = partial(plan.throw, error)


async def run_async(plan: Plan[T]) -> T:
    """Run a procedure without blocking the event loop: calls in worker threads.

    A call cannot be stopped once its thread runs it, so a cancellation that comes
    during one waits for it to end (every call has a timeout) and is then thrown
    into the procedure: its clean-up knows what the call did (e.g. that the create
    landed), instead of racing it.
    """
    advance: Callable[[], Step] = partial(plan.send, None)
    while True:
        try:
            step = advance()
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                advance = partial(plan.send, None)
            else:
                advance = partial(plan.send, await _to_the_end(step))
        except BaseException as error:  # cancellation too: the clean-up runs
            advance = partial(plan.throw, error)


async def _to_the_end(step: Call) -> Any:
    future = asyncio.ensure_future(asyncio.to_thread(step.fn, *step.args, **step.kwargs))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([future])
        if not future.cancelled():
            future.exception()  # retrieved: the cancellation is what the procedure sees
        raise
