"""The newcomer path: `make dev DEV_ONCE=1` runs the whole demo and exits 0."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_dev_once_runs_the_demo() -> None:
    result = subprocess.run(
        ["make", "dev", "DEV_ONCE=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "export KUBECONFIG=" in result.stdout
    assert "every demo outcome reached" in result.stdout
    for line in (
        "too-big        Rejected   InsufficientRAM",
        "forgotten      Reclaimed  HeartbeatStale",
        "short-lived    Reclaimed  Expired",
    ):
        assert line in result.stdout
