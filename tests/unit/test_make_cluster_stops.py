"""``make cluster``'s stop (headroom_dev.makecluster) with real signals, on a stand-in node.

The node, the control plane and helm are replaced by a stand-in whose stop takes a
while and goes through the locks and events a real stop goes through; the harness
around it (the handlers, the lock, the clean-up order, the line it prints, the exit
code) is the real one. A storm of signals that lands while the main thread is inside
that stop is what hung the harness this replaced: its SIGTERM handler set a
``threading.Event``, and a second signal re-entered the Event's lock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headroom_dev import kubelet, makecluster
from headroom_dev.interrupts import hold_lock

#: Seconds the stand-in's stop takes: the storm lands inside it.
STOP_SECONDS = 1.5
#: Seconds after which a run that has not exited is taken to hang (a real one exits
#: about STOP_SECONDS after the first signal).
HANG = 60

STAND_IN = textwrap.dedent(
    f"""
    import sys, threading, time
    from pathlib import Path
    from headroom_dev import cluster, kubelet, makecluster
    from headroom_dev.interrupts import hold_lock, run_program

    tmp = Path(sys.argv[1])
    makecluster.CLUSTER_DIR = tmp / ".cluster"
    kubelet.hold_node = lambda: hold_lock(tmp / "node")

    class Plane:
        def __init__(self, workdir):
            workdir.mkdir(parents=True)
            self.kubeconfig = workdir / "kubeconfig"
            self.kubeconfig.write_text("")
            self.url = "https://127.0.0.1:1"

    class Node:
        name = "stand-in"

    class StandIn:
        image = "stand-in:1"

        def __init__(self, workdir):
            self.plane, self.node = Plane(workdir), Node()

        def start(self, say):
            say("stand-in: starting")
            if "--slow-start" in sys.argv:
                time.sleep(600)  # until a signal
            return self

        def install(self, values):
            return 0.0

        def apply(self, manifest):
            return ""

        def stop(self):
            print("stand-in: stopping", flush=True)
            lock, event = threading.Lock(), threading.Event()
            until = time.monotonic() + {STOP_SECONDS}
            while time.monotonic() < until:  # the machinery a stop goes through
                event.set()
                event.clear()
                event.wait(0.0005)
                with lock:
                    pass
            print("stand-in: stopped", flush=True)

    cluster.NodeCluster = StandIn
    sys.exit(run_program("make cluster", "headroom_dev.makecluster", []))
    """
)


def running(pid: int) -> bool:
    """Not exited yet; asked without reaping it, so that its pid is never reused
    while the storm still sends to it."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None


def storm(pid: int, first: signal.Signals, then: signal.Signals) -> int:
    """``first`` once, then ``then`` as fast as it goes until the process exits; how many."""
    os.kill(pid, first)
    sent = 1
    while running(pid):
        os.kill(pid, then)
        sent += 1
        if sent % 50 == 0:
            time.sleep(0.001)  # let the process run too, even on one core
    return sent


def run_stand_in(tmp_path: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", STAND_IN, str(tmp_path), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def until(process: subprocess.Popen[str], text: str) -> list[str]:
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"ended before {text!r}:\n" + "".join(seen))


@pytest.mark.parametrize(
    ("flags", "moment"),
    [((), "Ctrl-C to stop"), (("--slow-start",), "stand-in: starting")],
    ids=["after-the-demo", "while-it-starts"],
)
@pytest.mark.parametrize(
    ("first", "then"),
    [
        (signal.SIGTERM, signal.SIGTERM),
        (signal.SIGINT, signal.SIGTERM),
        (signal.SIGINT, signal.SIGINT),
    ],
    ids=["term-storm", "int-then-term-storm", "int-storm"],
)
def test_a_storm_of_signals_during_the_stop_never_hangs_it(
    tmp_path: Path,
    flags: tuple[str, ...],
    moment: str,
    first: signal.Signals,
    then: signal.Signals,
) -> None:
    process = run_stand_in(tmp_path, *flags)
    seen = until(process, moment)
    assert process.stdout is not None
    rest: list[str] = []
    reader = threading.Thread(target=lambda: rest.append(process.stdout.read()))  # type: ignore[union-attr]
    sent: list[int] = []
    sender = threading.Thread(target=lambda: sent.append(storm(process.pid, first, then)))
    reader.start()
    sender.start()
    sender.join(HANG)  # the storm ends when the process exits
    hung = sender.is_alive()
    if hung:
        process.kill()
        sender.join()
    reader.join()
    process.wait()  # reaped only now: no pid reuse while the storm was sending
    out = "".join(seen + rest)
    assert not hung, f"still running {HANG}s after the first signal:\n{out}"
    print(f"figures: {sent[0]} signals sent while it stopped")
    assert sent[0] > 100, out  # a storm, not a couple
    assert process.returncode == 128 + first, out
    assert out.count("stand-in: stopped\n") == 1, out  # the stop ran once, to its end
    assert out.count("stopped by") == 1, out
    assert f"make cluster: stopped by {first.name}; {makecluster.CLEANED}" in out, out
    assert "Traceback" not in out, out
    assert not (tmp_path / ".cluster").exists(), out


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    saved = {each: signal.getsignal(each) for each in (signal.SIGINT, signal.SIGTERM)}
    yield
    for each, handler in saved.items():
        signal.signal(each, handler)


@pytest.mark.usefixtures("restored_handlers")
def test_a_second_make_cluster_refuses_at_once_and_touches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first_ones = tmp_path / ".cluster" / "kubeconfig"
    first_ones.parent.mkdir()
    first_ones.write_text("the first run's")
    monkeypatch.setattr(makecluster, "CLUSTER_DIR", tmp_path / ".cluster")
    monkeypatch.setattr(kubelet, "hold_node", lambda: hold_lock(tmp_path / "node"))
    with hold_lock(tmp_path / "node"):  # the first run
        assert makecluster.main([]) == 1
    said = capsys.readouterr()
    assert f"is in use by another run (pid {os.getpid()})" in said.err, said
    assert first_ones.read_text() == "the first run's"
