"""The real-node path: `make cluster CLUSTER_ONCE=1` runs the whole demo and exits 0.

The node, the image and the chart as a person gets them: the make target builds
or reuses everything, brings the node up, `helm install`s the chart, runs the demo
(a Job holding memory through `headroom hold`, a reservation too big for the node,
one whose owner never heartbeats), checks every outcome and tears it all down.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_make_cluster_once_runs_the_demo() -> None:
    result = subprocess.run(
        ["make", "cluster", "CLUSTER_ONCE=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert "export KUBECONFIG=" in result.stdout
    assert "operator Ready in" in result.stdout
    for line in (
        "too-big    Rejected   InsufficientRAM",
        "forgotten  Reclaimed  HeartbeatStale",
        "Job train: Succeeded; its claim was Admitted while it ran and released after",
        "every demo outcome reached",
    ):
        assert line in result.stdout
    assert not (ROOT / ".cluster").exists()
    # Nothing of the node is left behind.
    assert not Path("/run/headroom-node").exists()


def test_ctrl_c_tears_the_cluster_down() -> None:
    """A person stops `make cluster` with Ctrl-C: the terminal sends SIGINT to the whole
    foreground process group; the node (which runs in its own session, so that a
    crashed driver cannot take it down half-way) must still be cleaned up."""
    with subprocess.Popen(
        ["make", "cluster"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a shell's foreground job
    ) as make:
        assert make.stdout is not None
        seen = []
        for line in make.stdout:
            seen.append(line)
            if "Ctrl-C to stop" in line:
                break
        else:
            pytest.fail("make cluster ended before it was up:\n" + "".join(seen[-60:]))
        assert Path("/run/headroom-node/kubelet.pid").exists()
        os.killpg(make.pid, signal.SIGINT)
        rest, _ = make.communicate(timeout=240)
    out = "".join(seen) + rest
    assert "make cluster: stopped by SIGINT; the kubelet, containerd" in out, out[-3000:]
    assert not Path("/run/headroom-node").exists(), out[-3000:]
    assert not (ROOT / ".cluster").exists()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    assert " hr0:" not in links.stdout
    left = subprocess.run(["pgrep", "-f", "headroom-node"], capture_output=True, text=True)
    assert left.stdout == "", left.stdout
