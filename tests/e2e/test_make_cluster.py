"""The real-node path: `make cluster CLUSTER_ONCE=1` runs the whole demo and exits 0.

The node, the image and the chart as a person gets them: the make target builds
or reuses everything, brings the node up, `helm install`s the chart, runs the demo
(a Job holding memory through `headroom hold`, a reservation too big for the node,
one whose owner never heartbeats), checks every outcome and tears it all down.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

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
