"""A benchmark stopped by Ctrl-C, or by a script's SIGINT then SIGTERM, stops its
operator, kube-apiserver and etcd, removes the control plane's directory, says so in
one line and exits 130, whatever the second signal lands on (issue 33).

B9 (bench/gpus.py) stands for every benchmark: they all run their main through
headroom_dev.interrupts.stop_cleanly. It runs in its own session and process group,
as a shell's foreground job, and the signals go to the whole group, as Ctrl-C sends
them, once its first operator runs. About 30 s for the two.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
STOPPED = "bench/gpus.py: stopped by SIGINT; its operators, kube-apiserver and etcd are stopped"
#: Seconds from the first signal to the whole process group gone (the operator's own
#: stop is bounded by 20 s, the control plane's children by 10 s each).
PROMPT = 60.0


def operator_and_plane(bench: subprocess.Popen[str], within: float) -> Path:
    """Once the benchmark's first operator runs: the control plane's work directory
    (etcd's --data-dir is inside it)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert bench.poll() is None, "the benchmark ended before its operator ran"
        children = psutil.Process(bench.pid).children(recursive=True)
        lines = []
        with contextlib.suppress(psutil.Error):
            lines = [" ".join(child.cmdline()) for child in children]
        etcd = [m for line in lines if (m := re.search(r"--data-dir[= ](\S+)/etcd", line))]
        if etcd and any("-m headroom run" in line for line in lines):
            return Path(etcd[0].group(1))
        time.sleep(0.1)
    raise AssertionError(f"no operator after {within:.0f}s")


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["then-term", "twice"])
def test_a_benchmark_stops_cleanly_on_a_second_signal_too(second: signal.Signals) -> None:
    bench = subprocess.Popen(
        [sys.executable, "bench/gpus.py", "--quick", "--nodes", "20"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out = ""
    try:
        workdir = operator_and_plane(bench, within=120)
        os.killpg(bench.pid, signal.SIGINT)
        sent = time.monotonic()
        time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bench.pid, second)
        out, _ = bench.communicate(timeout=PROMPT)
        while group_alive(bench.pid) and time.monotonic() - sent < PROMPT:
            time.sleep(0.1)
        print(f"figures: gone {time.monotonic() - sent:.1f}s after the SIGINT")
    finally:
        if group_alive(bench.pid):
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
    assert not group_alive(bench.pid), out[-3000:]
    assert bench.returncode == 130, out[-3000:]
    assert out.count("stopped by SIG") == 1, out[-3000:]
    assert STOPPED in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert not workdir.exists(), out[-3000:]  # the control plane's stop ran to its end
