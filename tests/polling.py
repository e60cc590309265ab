"""Wait for what runs on its own (the operator, the API server, a scheduler), without a
fixed sleep: the one helper every test polls with, so a timeout reads the same
everywhere and always ends in the check's own failure, which says what was missing."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def eventually(
    check: Callable[[], Any],
    timeout: float = 15,
    *,
    every: float = 0.3,
    retry_on: tuple[type[Exception], ...] = (AssertionError,),
) -> Any:
    """Call ``check`` until it stops raising ``retry_on``; its value. After ``timeout``
    seconds, its last failure."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except retry_on:
            if time.monotonic() > deadline:
                raise
            time.sleep(every)


async def eventually_async(
    check: Callable[[], Any], within: float = 15, *, every: float = 0.05, what: str = ""
) -> Any:
    """:func:`eventually` in the test's own event loop, which the awaited code shares:
    ``check`` may be a coroutine function, and a check that answers ``False`` has not
    passed yet (``what`` then names it in the failure; any other answer has passed,
    so a check that means "not yet" answers a real bool). ``within``: seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                try:  # a check that never answers fails too, at the deadline
                    async with asyncio.timeout(max(deadline - time.monotonic(), every)):
                        value = await value
                except TimeoutError:
                    raise AssertionError(f"no answer within {within}s: {what or check}") from None
            if value is False:
                raise AssertionError(f"not within {within}s: {what or check}")
            return value
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(every)
