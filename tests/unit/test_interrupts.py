"""The harness's stop and lock (headroom_dev.interrupts), with real signals and a real flock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from headroom_dev.interrupts import LockHeldError, StopOnSignals, Stopped, hold_lock


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    saved = {each: signal.getsignal(each) for each in (signal.SIGINT, signal.SIGTERM)}
    yield
    for each, handler in saved.items():
        signal.signal(each, handler)


@pytest.mark.usefixtures("restored_handlers")
def test_the_first_signal_stops_and_later_ones_are_only_recorded() -> None:
    signals = StopOnSignals()
    signals.arm()
    with pytest.raises(Stopped) as stopped:  # raised by the handler, in this thread
        os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.exit_code == 143
    os.kill(os.getpid(), signal.SIGINT)  # during the clean-up: recorded, not raised
    assert signals.received == signal.SIGTERM


@pytest.mark.usefixtures("restored_handlers")
def test_a_signal_before_arming_is_raised_by_arm() -> None:
    """The moment between installing the handlers and entering the ``try`` is covered."""
    signals = StopOnSignals()
    os.kill(os.getpid(), signal.SIGINT)  # recorded only
    assert signals.received == signal.SIGINT
    with pytest.raises(Stopped) as stopped:
        signals.arm()
    assert stopped.value.exit_code == 130


@pytest.mark.usefixtures("restored_handlers")
def test_a_shielded_clean_up_is_not_interrupted() -> None:
    signals = StopOnSignals()
    signals.arm()
    signals.shield()
    os.kill(os.getpid(), signal.SIGINT)
    assert signals.received == signal.SIGINT


def test_a_signal_ignored_by_the_parent_still_stops() -> None:
    """As a script's background job inherits SIGINT ignored."""
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        from headroom_dev.interrupts import StopOnSignals, Stopped
        signals = StopOnSignals()
        try:
            signals.arm()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except Stopped as stopped:
            sys.exit(stopped.exit_code)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        timeout=30,
        check=False,
    )
    assert result.returncode == 130


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    refused = rf"in use by another run \(pid {os.getpid()}\)"
    with hold_lock(tmp_path), pytest.raises(LockHeldError, match=refused), hold_lock(tmp_path):
        pass
    with hold_lock(tmp_path):  # released: the next run takes it
        pass


def test_a_dead_holder_leaves_no_lock(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from headroom_dev.interrupts import hold_lock
        with hold_lock(Path({str(tmp_path)!r})):
            os._exit(9)  # dies holding it, no clean-up
        """
    )
    assert subprocess.run([sys.executable, "-c", script], timeout=30, check=False).returncode == 9
    with hold_lock(tmp_path):
        pass
