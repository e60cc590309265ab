"""An asyncio event loop on virtual time, for deterministic simulations.

Why a whole loop and not a patched ``time.monotonic``: the control code sleeps,
times out and schedules with asyncio, and asyncio reads time only through
``loop.time()``. A loop whose ``time()`` is a number we move, and whose "wait
for I/O" step jumps that number to the next timer instead of waiting, runs a
simulated hour in milliseconds with every asyncio primitive unchanged (sleep,
wait_for, timeout, Event, tasks, cancellation).

Determinism is the other half. With no I/O and no threads, the order of
callbacks is a function of the program alone, except for three process-level
leaks that this module closes:

- the cyclic garbage collector runs at allocation-count thresholds carried over
  from before the simulation, and finalizing an abandoned async generator
  schedules a callback: it is paused while a simulation runs (refcounting, which
  is deterministic, still frees everything else);
- ``asyncio.all_tasks()`` iterates a WeakSet in address order: cleanup cancels
  tasks in creation order instead (:meth:`VirtualEventLoop.tasks`);
- threads (``run_in_executor``, ``to_thread``, ``getaddrinfo``) and file
  descriptors would bring real time back: they fail loudly.

Two guards turn silent hangs into errors that name the stuck tasks: virtual time
passing a bound (a livelock, e.g. a retry loop that never succeeds) and too many
loop iterations at one instant (a busy loop that never lets time advance).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import weakref
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar, cast

T = TypeVar("T")

DEFAULT_EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
"""What ``VirtualClock.now()`` answers at virtual time 0."""

DEFAULT_MAX_STEPS_PER_INSTANT = 100_000
_CLEANUP_VIRTUAL_SECONDS = 3600.0


class SimulationError(RuntimeError):
    """The simulated program cannot go on; the message names the tasks still pending."""


class VirtualTimeExceededError(SimulationError):
    """Virtual time would pass the run's bound: a livelock, or a bound too small."""


class BusyLoopError(SimulationError):
    """Too many loop iterations without virtual time advancing."""


class DeadlockError(SimulationError):
    """Nothing is ready and no timer is set, yet the main coroutine has not finished."""


class RealIOError(SimulationError):
    """Something tried to use a thread or a file descriptor on the virtual loop."""


class _VirtualSelector:
    """Stands where the loop's selector stands: "waiting" moves virtual time."""

    def __init__(self, loop: VirtualEventLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        self._loop._advance(timeout)
        return []

    def register(self, fileobj: Any, events: int, data: Any = None) -> NoReturn:
        raise RealIOError(f"real I/O on the virtual loop (file object {fileobj!r})")

    modify = register

    def unregister(self, fileobj: Any) -> NoReturn:
        raise RealIOError(f"real I/O on the virtual loop (file object {fileobj!r})")

    def get_map(self) -> dict[Any, Any]:
        return {}

    def close(self) -> None:
        pass


class VirtualEventLoop(asyncio.BaseEventLoop):
    """An event loop whose clock only moves when nothing is ready to run.

    ``time()`` starts at ``start``; whenever no callback is ready, the loop jumps
    straight to the earliest timer. ``max_virtual_seconds`` (from ``start``)
    bounds the run; ``max_steps_per_instant`` bounds loop iterations at one
    virtual instant.
    """

    def __init__(
        self,
        *,
        start: float = 0.0,
        max_virtual_seconds: float | None = None,
        max_steps_per_instant: int = DEFAULT_MAX_STEPS_PER_INSTANT,
    ) -> None:
        super().__init__()
        self._selector = _VirtualSelector(self)
        self._now = float(start)
        self.start = float(start)
        self.limit: float | None = (
            None if max_virtual_seconds is None else self.start + max_virtual_seconds
        )
        self.max_steps_per_instant = max_steps_per_instant
        self._steps_at_instant = 0
        self._task_seq = itertools.count()
        self._tasks: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
        self.clock = VirtualClock(self)

    # -- time ----------------------------------------------------------------------------

    def time(self) -> float:
        return self._now

    def _advance(self, timeout: float | None) -> None:
        """The selector's wait: jump to the next timer, or fail if there is none."""
        if timeout is None:
            raise DeadlockError(
                f"deadlock at virtual time {self._now:.6f}: nothing is ready and no timer "
                f"is set, so nothing can ever happen again{self.describe_pending()}"
            )
        if timeout <= 0:
            return
        # The loop asks for min(next timer - now, one day): land exactly on the timer.
        when: float = self._scheduled[0]._when  # type: ignore[attr-defined]
        target = when if when - self._now <= timeout else self._now + timeout
        if self.limit is not None and target > self.limit:
            raise VirtualTimeExceededError(
                f"virtual time would pass its bound of {self.limit - self.start:g} s "
                f"(next timer at {target:.6f}): a livelock, or the bound is too small"
                f"{self.describe_pending()}"
            )
        self._now = max(self._now, target)
        self._steps_at_instant = 0

    def _run_once(self) -> None:
        super()._run_once()  # type: ignore[misc]
        self._steps_at_instant += 1
        if self._steps_at_instant > self.max_steps_per_instant:
            self._steps_at_instant = 0
            raise BusyLoopError(
                f"{self.max_steps_per_instant} loop iterations at virtual time "
                f"{self._now:.6f} without time advancing: a busy loop "
                f"(e.g. `while True: await asyncio.sleep(0)`){self.describe_pending()}"
            )

    # -- tasks in creation order -----------------------------------------------------------

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = super().create_task(coro, **kwargs)
        self._tasks[task] = next(self._task_seq)
        return task

    def tasks(self) -> list[asyncio.Task[Any]]:
        """Tasks not yet done, in the order they were created (deterministic)."""
        return [t for t in list(self._tasks.keys()) if not t.done()]

    def describe_pending(self, limit: int = 12) -> str:
        """A few lines naming each pending task and where it waits, for error messages."""
        pending = self.tasks()
        if not pending:
            return ""
        lines = [f"\npending tasks ({len(pending)}):"]
        for task in pending[:limit]:
            lines.append(f"  {task.get_name()}: {_where(task)}")
        if len(pending) > limit:
            lines.append(f"  ... and {len(pending) - limit} more")
        return "\n".join(lines)

    # -- no threads, no file descriptors ----------------------------------------------------

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass  # nothing to wake: the loop never blocks

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> NoReturn:
        raise RealIOError(
            f"run_in_executor({getattr(func, '__qualname__', func)!r}) on the virtual loop: "
            "threads run in real time and would make the simulation nondeterministic"
        )


def _refuse(name: str) -> Callable[..., NoReturn]:
    def refuse(self: VirtualEventLoop, *args: Any, **kwargs: Any) -> NoReturn:
        raise RealIOError(f"{name}() on the virtual loop: no real I/O in a simulation")

    refuse.__name__ = name
    return refuse


for _name in (
    "sock_connect",
    "sock_accept",
    "sock_recv",
    "sock_recv_into",
    "sock_sendall",
    "sock_sendfile",
    "create_connection",
    "create_server",
    "create_unix_connection",
    "create_unix_server",
    "create_datagram_endpoint",
    "connect_read_pipe",
    "connect_write_pipe",
    "subprocess_exec",
    "subprocess_shell",
    "getaddrinfo",
    "getnameinfo",
    "add_reader",
    "add_writer",
    "add_signal_handler",
):
    setattr(VirtualEventLoop, _name, _refuse(_name))


def _where(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    frame = getattr(coro, "cr_frame", None)
    # Follow the await chain to the innermost coroutine: that is where it waits.
    inner: Any = coro
    while getattr(inner, "cr_await", None) is not None:
        inner = inner.cr_await
        frame = getattr(inner, "cr_frame", None) or frame
    name = getattr(coro, "__qualname__", repr(coro))
    if frame is None:
        return name
    return f"{name} at {frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"


@dataclass(frozen=True)
class VirtualClock:
    """The clock the control code reads in a simulation: loop time and a UTC datetime.

    Without a loop it reads the running loop, so one instance can be created
    before the loop exists and passed to everything; before any loop runs it
    reads 0 (set-up code that creates objects before the simulation starts).
    """

    loop: asyncio.AbstractEventLoop | None = None
    epoch: datetime = DEFAULT_EPOCH

    def monotonic(self) -> float:
        """Seconds, as ``loop.time()``: what timers and deadlines use."""
        loop = self.loop
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return 0.0
        return loop.time()

    def now(self) -> datetime:
        """An aware UTC datetime: the epoch plus the loop's time."""
        return self.epoch + timedelta(seconds=self.monotonic())


@contextlib.contextmanager
def _gc_paused(pause: bool) -> Iterator[None]:
    was_enabled = gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause and was_enabled:
            gc.enable()


def run_virtual(
    main: Coroutine[Any, Any, T],
    *,
    max_virtual_seconds: float,
    start: float = 0.0,
    max_steps_per_instant: int = DEFAULT_MAX_STEPS_PER_INSTANT,
    pause_gc: bool = True,
) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualEventLoop`; return its result.

    Raises :class:`VirtualTimeExceededError` if virtual time would pass ``start +
    max_virtual_seconds``, :class:`BusyLoopError` after ``max_steps_per_instant``
    iterations at one instant, :class:`DeadlockError` if nothing can ever happen
    again, and whatever ``main`` raises. Tasks still running when ``main`` ends
    are cancelled in creation order and awaited, as ``asyncio.run`` does.
    Inside, ``asyncio.get_running_loop().clock`` is the run's :class:`VirtualClock`.
    """
    loop = VirtualEventLoop(
        start=start,
        max_virtual_seconds=max_virtual_seconds,
        max_steps_per_instant=max_steps_per_instant,
    )
    with _gc_paused(pause_gc):
        try:
            task = loop.create_task(main, name="main")
            return cast(T, loop.run_until_complete(task))
        finally:
            _shut_down(loop)


def _shut_down(loop: VirtualEventLoop) -> None:
    """Cancel what is left (creation order), let it finish, close the loop."""
    try:
        pending = loop.tasks()
        if pending:
            # Cleanup gets its own bound: the run's may be the very thing that was exceeded.
            loop.limit = loop.time() + _CLEANUP_VIRTUAL_SECONDS
            for task in pending:
                task.cancel()
            with contextlib.suppress(SimulationError):
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        with contextlib.suppress(SimulationError):
            loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
