"""The newcomer path: `make dev DEV_ONCE=1` runs the whole demo and exits 0; `make dev`
stops cleanly at any moment, as a terminal's Ctrl-C or a script's
``kill -INT -- -PGID`` stops it, and a second run never starts over the first one's.

No terminal here: each run is its own session and process group
(``start_new_session``), as a shell's foreground job or a CI step, and the signal
goes to the whole group, as Ctrl-C sends it. Most runs start the recipe's own command
(RECIPE, what `make dev` runs) so that its exit code is seen as it is: GNU make,
signalled in the same instant, sometimes reports its child's end as "wait: No child
processes" and exits 2 on its own account.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_DIR = ROOT / ".dev" / "cluster"
STOPPED = "make dev: stopped by SIGINT; the operator, kube-apiserver and etcd are stopped"
PROMPT = 10.0  # seconds from the signal to the last process of the run gone
RECIPE = [".venv/bin/python", "-m", "headroom_dev.dev"]


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


def run_processes() -> str:
    """The processes of this checkout's run (etcd, kube-apiserver, the operator: each
    names a file under .dev/cluster on its command line), one per line."""
    found = subprocess.run(["pgrep", "-af", str(RUN_DIR)], capture_output=True, text=True)
    return found.stdout


def test_the_recipe_is_what_make_dev_runs() -> None:
    said = subprocess.run(["make", "-n", "dev"], cwd=ROOT, capture_output=True, text=True)
    assert " ".join(RECIPE) in said.stdout, said.stdout + said.stderr


def start(
    preexec: Callable[[], object] | None = None, command: list[str] = RECIPE
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=preexec,
    )


def until(make: subprocess.Popen[str], text: str) -> list[str]:
    assert make.stdout is not None
    seen = []
    for line in make.stdout:
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"make dev ended before {text!r}:\n" + "".join(seen[-40:]))


def interrupt(make: subprocess.Popen[str], seen: list[str]) -> str:
    """SIGINT to the run's process group; its whole output, once every process is gone."""
    os.killpg(make.pid, signal.SIGINT)
    sent = time.monotonic()
    rest, _ = make.communicate(timeout=60)  # EOF: the harness has exited too
    out = "".join(seen) + rest
    while run_processes() and time.monotonic() - sent < 30:
        time.sleep(0.2)
    took = time.monotonic() - sent
    print(f"figures: stopped {took:.1f}s after the SIGINT")
    assert took < PROMPT, out[-3000:]
    assert run_processes() == "", out[-3000:]
    assert not RUN_DIR.exists(), out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert out.count("stopped by SIG") == 1, out[-3000:]
    return out


@pytest.mark.parametrize(
    "moment",
    ["make dev: starting", "starting etcd and kube-apiserver", "starting the operator"],
    ids=["importing", "control-plane", "operator"],
)
def test_a_sigint_during_start_up_stops_it_cleanly(moment: str) -> None:
    """At each phase of the start: while Python imports, while etcd and kube-apiserver
    start, while the operator starts (the line before each is the cue)."""
    make = start()
    seen = until(make, moment)
    out = interrupt(make, seen)
    assert STOPPED in out or "make dev: stopped by SIGINT before anything was started" in out
    assert make.returncode == 130


def tour_commands() -> list[str]:
    """The README's tour: every command of its second block (the first is a watch)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A five-minute tour") :]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    assert len(blocks) >= 2, "the README lost its tour"
    return [line.split("  #")[0].strip() for line in blocks[1].splitlines() if line.strip()]


def take_the_tour(seen: list[str]) -> dict[str, str]:
    """Each tour command, in the shell the README describes (the printed export lines),
    until it exits 0 (the demo's decisions take a moment); its output by command."""
    exports = dict(re.findall(r"^  export (\w+)=(\S+)$", "".join(seen), re.MULTILINE))
    env = {**os.environ, **{k: v.replace("$PATH", os.environ["PATH"]) for k, v in exports.items()}}
    outputs = {}
    for command in tour_commands():
        deadline = time.monotonic() + 30
        while True:
            done = subprocess.run(
                ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60
            )
            if done.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        print(f"$ {command}\n{done.stdout}{done.stderr}")
        outputs[command] = done.stdout + done.stderr
    return outputs


def test_a_second_run_refuses_and_a_sigint_after_the_demo_stops_the_first() -> None:
    """On the way, the README's tour runs against the first run, as it says."""
    make = start()
    seen = until(make, "Ctrl-C to stop")
    said = take_the_tour(seen)
    why = next(out for command, out in said.items() if "why too-big" in command)
    assert "InsufficientRAM" in why, why
    [message] = [line for line in why.splitlines() if line.startswith("Message: ")]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert message.removeprefix("Message: ") in readme  # quoted as it is
    hold = next(out for command, out in said.items() if "headroom hold" in command)
    assert "Admitted" in hold, hold
    second = subprocess.run(
        ["make", "dev"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert second.returncode != 0
    assert "is in use by another run (pid" in second.stderr, second.stdout + second.stderr
    assert "control plane up" not in second.stdout
    assert run_processes() != ""  # the first one's cluster is untouched
    out = interrupt(make, seen)
    assert STOPPED in out, out[-3000:]
    assert make.returncode == 130


def test_a_background_job_of_a_script_stops_on_sigint_too() -> None:
    """A shell without job control starts a background job with SIGINT ignored
    (`make dev &` in a script): the harness still stops on it."""
    make = start(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN), ["make", "dev"])
    seen = until(make, "Ctrl-C to stop")
    out = interrupt(make, seen)
    assert STOPPED in out, out[-3000:]
    assert "Error 130" in out, out[-3000:]
    assert make.returncode == 2  # make, ignoring SIGINT as it inherited, reports the failure
