"""Stopping a long-running harness cleanly at any moment, and one run per directory.

A terminal's Ctrl-C and a script's ``kill -INT -- -PGID`` reach every process in the
group at once, at any phase. Python's own ``KeyboardInterrupt`` then surfaces as a
traceback from whatever library call was running, and a shell that starts a job in
the background without job control hands it SIGINT *ignored*, so the harness would
not stop at all. :class:`StopOnSignals` installs a handler for SIGINT and SIGTERM
whatever the inherited disposition, turns the first signal into :class:`Stopped`
raised where the harness is (so every ``with`` block unwinds and stops its
processes), and only records later ones, so the clean-up itself is never cut short.

:func:`hold_lock` takes an exclusive ``flock`` on a state directory: a second run
refuses instead of starting over the first one's files. The kernel drops the lock
when the holder dies, however it dies, so a crashed run never blocks the next.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):  # a stop, as KeyboardInterrupt is, not an error
    """A SIGINT or SIGTERM arrived; a BaseException so that no ``except Exception`` eats it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a job the signal ended (130, 143)."""
        return 128 + self.signum


class StopOnSignals:
    """Once armed (:meth:`arm`), the first SIGINT/SIGTERM raises :class:`Stopped`; later
    ones, and any that come before :meth:`arm` or after :meth:`shield`, are only
    recorded in :attr:`received`. Call :meth:`arm` inside the ``try`` that handles
    :class:`Stopped`, so that no moment is left where a signal escapes it."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._raising = False
        for each in HANDLED:
            signal.signal(each, self._handle)

    def arm(self) -> None:
        """From now on the first signal raises; one already received raises at once."""
        if self.received is not None:
            raise Stopped(self.received)
        self._raising = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = _first_delivered(signum, frame)
        if self._raising:
            self._raising = False
            raise Stopped(self.received)

    def shield(self) -> None:
        """From now on a signal does not interrupt: the clean-up under way finishes."""
        self._raising = False

    def ignore(self) -> None:
        """From now on a signal is ignored: for the process's last moments, once its
        stop is done. (Python restores the default handlers as it shuts down, and a
        signal then would end it by the signal, not with the exit code it chose.)"""
        self._raising = False
        for each in HANDLED:
            signal.signal(each, signal.SIG_IGN)


def _first_delivered(signum: int, frame: FrameType | None) -> int:
    """The signal that came first: ``signum``, unless this handler runs nested in the
    handler of an earlier one. Python runs a handler between two bytecodes of whatever
    runs, a handler's own first one included, so under a storm the SIGTERM that came
    just after a SIGINT can run, and raise, before the SIGINT handler's first line (seen:
    one run in five of test_make_cluster_stops' SIGINT-then-SIGTERM storms said SIGTERM)."""
    first = signum
    while frame is not None:
        if frame.f_code is StopOnSignals._handle.__code__:
            first = int(frame.f_locals.get("signum", first))
        frame = frame.f_back
    return first


#: A harness's ``main(argv, signals)``: handlers installed and armed; returns the exit code.
Program = Callable[[list[str] | None, StopOnSignals], int]


def run_program(label: str, module: str, argv: list[str] | None = None) -> int:
    """Install the handlers, then import ``module`` and run its ``main(argv, signals)``.

    Importing a harness (the Kubernetes client, pydantic, yaml) takes a moment; a
    Ctrl-C in that moment would otherwise print a traceback from deep inside an
    import. A stop that comes before the harness has started anything says so in
    one line, prefixed with ``label`` (``make dev``)."""
    signals = StopOnSignals()
    try:
        signals.arm()
        print(f"{label}: starting; Ctrl-C stops it at any moment", flush=True)
        program: Program = importlib.import_module(module).main
        return program(argv, signals)
    except Stopped as stopped:  # one that the program did not handle: nothing started
        name = signal.Signals(stopped.signum).name
        print(f"{label}: stopped by {name} before anything was started", flush=True)
        return stopped.exit_code
    finally:
        signals.ignore()


def stop_cleanly(label: str, program: Callable[[], int], cleaned: str) -> int:
    """Run ``program()`` (a benchmark's ``main``) so that a SIGINT or SIGTERM stops it as
    :class:`Stopped`: its ``with`` and ``finally`` blocks (and, under ``asyncio.run``,
    its cancelled tasks') stop what it started, later signals cannot cut that short,
    one line says so (``label: stopped by SIGINT; cleaned``) and the exit code is 130
    or 143."""
    signals = StopOnSignals()
    try:
        signals.arm()
        return program()
    except Stopped as stopped:
        name = signal.Signals(stopped.signum).name
        print(f"{label}: stopped by {name}; {cleaned}", flush=True)
        return stopped.exit_code
    finally:
        signals.ignore()


def run_holding(
    label: str,
    lock: contextlib.AbstractContextManager[None],
    run: Callable[[], int],
    signals: StopOnSignals,
    *,
    cleaned: str,
    when_held: str,
) -> int:
    """Run ``run()`` holding ``lock`` (:func:`hold_lock`), for a harness that stops on a
    signal (``make dev``, ``make cluster``). A second run refuses at once, touching
    nothing: ``label: <the holder>; when_held`` on stderr, exit 1. A stop says so in one
    line, ``label: stopped by SIGINT; cleaned``, and returns 128 + the first signal."""
    try:
        with lock:
            code = run()
    except LockHeldError as held:
        signals.shield()
        print(f"{label}: {held}; {when_held}", file=sys.stderr, flush=True)
        return 1
    except Stopped as stopped:
        code = stopped.exit_code
    if signals.received is not None:
        name = signal.Signals(signals.received).name
        print(f"{label}: stopped by {name}; {cleaned}", flush=True)
        return 128 + signals.received
    return code


class LockHeldError(RuntimeError):
    """Another run holds the directory's lock; the message names its pid."""


@contextlib.contextmanager
def hold_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory/lock`` for the block, or :class:`LockHeldError` at once."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "lock"
    with path.open("a+") as handle:  # opened close-on-exec: children never hold it
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise LockHeldError(f"{directory} is in use by another run (pid {holder})") from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)
