"""A keyed work queue, as client-go's ``util/workqueue`` and controller-runtime use it.

A level-triggered controller does not act on events: it is told *which* object to
look at (its key) and reconciles it from what it knows now. That only holds if the
plumbing under it keeps four promises, which the operator once hand-rolled per
component (busy flags, "stirred" sets, timer maps, per-object failure counters),
each a little differently and one with a lost delay:

- **dedupe**: a key added many times before it is processed is processed once;
- **one at a time**: a key is never processed twice at once; an ``add`` while it is
  processed marks it *dirty*, and it is processed again once the pass ends
  (requeue-if-dirty), so a change seen during a pass is never lost;
- **add after**: ``add_after(key, delay)`` keeps the *earliest* pending time per key,
  as client-go's delaying queue does (a later one never hides a sooner one);
- **per-key backoff**: ``add_rate_limited`` requeues after ``base·2^(n-1)`` seconds,
  capped, jittered in ``[d/2, d]``, ``n`` the key's failures in a row since
  ``forget``. A key retried by its backoff waits for it: changes seen during the
  failed pass do not requeue it at once (client-go would), or a pod whose events
  keep coming would be retried at the rate of its events, not of its backoff.

One task per key, not N workers: a pass may wait long on the API (a call retried
while the server is away, a lock other keys hold), and a fixed pool would let a few
slow keys hold up every other one; the keys are the objects the component follows,
so their number is bounded by the cluster, not by the events. Order across keys is
the order of their ``add`` (tasks start in creation order); whatever needs a stricter
order (the placement of gated pods) takes a fair lock inside the pass.

Time is the running event loop's: timers are ``call_later``, deadlines read from the
injected clock (the simulation's virtual loop and clock make both virtual). The random
source for the jitter is injected too, so a run replays exactly from a seed.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from headroom.kube.clock import Clock

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Runs ``process(key)`` for each key added: deduped, one pass per key at a time."""

    def __init__(
        self,
        process: Callable[[K], Awaitable[None]],
        *,
        clock: Clock,
        rng: random.Random,
        base: float = 0.5,
        cap: float = 30.0,
        grace: float = 2.0,
        name: str = "work queue",
    ) -> None:
        self._process, self._clock, self._rng = process, clock, rng
        self._base, self._cap, self._grace, self._name = base, cap, grace, name
        self._tasks: dict[K, asyncio.Task[None]] = {}  # queued or in a pass
        self._processing: set[K] = set()  # in a pass now
        self._dirty: set[K] = set()  # added during its pass: processed again after
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}  # deadline, timer
        self._failures: dict[K, int] = {}
        self._shutting_down = False

    # -- adding ------------------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Process ``key`` soon: once, however often it is added before its pass starts."""
        if self._shutting_down:
            return
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._tasks:
            self._tasks[key] = asyncio.get_running_loop().create_task(
                self._work(key), name=f"{self._name} {key}"
            )

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` in ``delay`` seconds, or sooner if an earlier add is pending."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        deadline = self._clock.monotonic() + delay
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= deadline:
                return  # the sooner one stands
            pending[1].cancel()
        timer = asyncio.get_running_loop().call_later(delay, self._fire, key)
        self._timers[key] = (deadline, timer)

    def add_rate_limited(self, key: K) -> float:
        """A pass failed: add ``key`` again after its backoff (returned, in seconds)."""
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        ceiling = min(self._cap, self._base * 2.0 ** min(failures - 1, 32))
        delay = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        self._dirty.discard(key)  # the backoff decides when it is looked at again
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """A pass succeeded: the key's next failure starts its backoff over."""
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        """Failures in a row since ``forget`` (client-go's ``NumRequeues``)."""
        return self._failures.get(key, 0)

    # -- what it holds -----------------------------------------------------------------------

    def is_processing(self, key: K) -> bool:
        return key in self._processing

    def waiting(self, key: K) -> float | None:
        """When ``key`` is to be added by ``add_after`` (monotonic), if it is."""
        pending = self._timers.get(key)
        return pending[0] if pending is not None else None

    @property
    def idle(self) -> bool:
        """Nothing queued nor in a pass (timers may be pending)."""
        return not self._tasks

    # -- running -----------------------------------------------------------------------------

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def _work(self, key: K) -> None:
        try:
            while True:
                self._processing.add(key)
                try:
                    await self._process(key)
                except asyncio.CancelledError:
                    raise
                except Exception:  # one key must never stop the others
                    log.exception("%s: %s not processed", self._name, key)
                finally:
                    self._processing.discard(key)
                if key not in self._dirty or self._shutting_down:
                    return
                self._dirty.discard(key)
        finally:
            self._dirty.discard(key)
            self._tasks.pop(key, None)

    async def shut_down(self) -> None:
        """Add nothing more, cancel the timers and what has not started; wait for the
        passes in flight (at most ``grace`` seconds, then they are cancelled)."""
        self._shutting_down = True
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        tasks = list(self._tasks.items())
        for key, task in tasks:
            if key not in self._processing:
                task.cancel()
        if not tasks:
            return
        _, late = await asyncio.wait([task for _, task in tasks], timeout=self._grace)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=self._grace)
