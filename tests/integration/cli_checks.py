"""What every command-line test checks: how a failure is printed, and odd kubeconfigs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from headroom_dev.controlplane import ControlPlane

Cli = Callable[..., subprocess.CompletedProcess[str]]
#: ``hold(*flags, command=[...], via="module"|"kubectl")``: the argv of ``hold``.
Hold = Callable[..., list[str]]
VENV_BIN = Path(sys.executable).parent


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a command line with the virtualenv's scripts on the PATH (for kubectl's plugins)."""
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False, env=env)


def kubeconfig_like_admin(control_plane: ControlPlane, path: Path, **change: str) -> Path:
    """The admin kubeconfig with ``server``, ``certificate-authority`` (of the cluster)
    or ``client-certificate``/``client-key`` replaced."""
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    for key, value in change.items():
        (cluster if key in ("server", "certificate-authority") else user)[key] = value
    path.write_text(yaml.safe_dump(config))
    return path


def assert_one_line_error(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), result.stderr
    for part in parts:
        assert part in lines[0], result.stderr
