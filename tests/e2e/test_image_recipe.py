"""The container image's install and entrypoint steps work, run outside an engine.

There is no container engine here, so this runs the Dockerfile's own steps
(hack/image/install.sh) in fresh virtualenvs: the build stage makes wheels of the
project and its dependencies, the final stage installs from those wheels alone,
and the ENTRYPOINT command then runs from that environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin"


def run(binary_dir: Path, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{binary_dir}:{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)  # an image has no source tree on its path
    return subprocess.run(
        list(argv), capture_output=True, text=True, env=env, cwd=cwd, timeout=600, check=False
    )


def build_context(target: Path) -> Path:
    """What the build stage COPYs into /src, and nothing else (as the engine would)."""
    build_stage = DOCKERFILE.split("\nFROM ")[1]
    for line in re.findall(r"^COPY (.+) \./?\S*$", build_stage, re.MULTILINE):
        for name in line.split():
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(
                    source,
                    target / name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
                )
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy(source, target / name)
    return target


def test_dockerfile_shape() -> None:
    stages = re.findall(r"^FROM (\S+)", DOCKERFILE, re.MULTILINE)
    assert stages == ["python:3.11-slim", "python:3.11-slim"]
    final = DOCKERFILE.split("\nFROM ")[-1]
    assert "headroom-install runtime /wheels" in final
    assert re.search(r"^USER 65532:65532$", final, re.MULTILINE)
    assert "pip wheel" not in final
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", DOCKERFILE, re.MULTILINE)
    assert entrypoint
    assert json.loads(entrypoint.group(1)) == ["headroom", "run"]


def test_install_steps_and_entrypoint(tmp_path: Path) -> None:
    install = str(ROOT / "hack/image/install.sh")
    context = build_context(tmp_path / "src")
    wheels = tmp_path / "wheels"
    build = venv(tmp_path / "build")
    built = run(build, "sh", install, "build", str(context), str(wheels))
    assert built.returncode == 0, built.stderr[-2000:]
    assert any(w.name.startswith("headroom-") for w in wheels.iterdir())

    final = venv(tmp_path / "final")
    installed = run(final, "sh", install, "runtime", str(wheels))
    assert installed.returncode == 0, installed.stderr[-2000:]

    where = run(
        final,
        "python",
        "-c",
        "import headroom, importlib.util as u; print(headroom.__file__); "
        "print(u.find_spec('headroom_dev'), u.find_spec('pytest'))",
        cwd=tmp_path,
    )
    assert where.returncode == 0, where.stderr
    location, missing = where.stdout.splitlines()
    assert location.startswith(str(tmp_path / "final")), location  # the wheel, not the repo
    assert missing == "None None"  # no dev harness, no test tools in the image

    help_text = run(final, "headroom", "run", "--help", cwd=tmp_path)
    assert help_text.returncode == 0, help_text.stderr
    assert "--config" in help_text.stdout

    bad = tmp_path / "config.yaml"
    bad.write_text("limits: {systemReserveMb: 5}\n")
    refused = run(final, "headroom", "run", "--config", str(bad), cwd=tmp_path)
    assert refused.returncode == 2
    assert "limits.systemReserveMb" in refused.stderr
