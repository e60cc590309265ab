"""``headroom hold -- CMD``: the command runs while the claim is held, and the claim is
gone when it ends, however it ends; a refused claim never runs it.

The commands are small Python programs: one reads its reservation back from the API
(proving it was Admitted while it ran), one exits with a code, one counts the signals
it receives (proving each signal sent to ``hold`` reaches it exactly once).
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane, free_port
from tests.integration.cli_checks import Hold, assert_one_line_error, kubeconfig_like_admin, run
from tests.integration.stand_in import UUIDS, DeviceAdmitter

READS_ITS_RESERVATION = textwrap.dedent(
    """
    import os, sys
    from kubernetes import client, config
    namespace, name = os.environ["HEADROOM_RESERVATION"].split("/")
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=sys.argv[1]))
    obj = api.get_namespaced_custom_object(
        "headroom.dev", "v1alpha1", namespace, "reservations", name)
    print(os.environ["HEADROOM_RESERVATION"], obj["spec"]["ramMB"], obj["status"]["phase"])
    """
)
COUNTS_SIGNALS = textwrap.dedent(
    """
    import signal, sys, time
    received = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda n, f: received.append(n))
    print("ready", flush=True)
    while not received:
        time.sleep(0.05)
    time.sleep(1)  # a second copy of the signal would arrive meanwhile
    print("received", *[signal.Signals(n).name for n in received], flush=True)
    sys.exit(40 + len(received))
    """
)


def test_the_command_runs_while_the_claim_is_admitted_then_it_is_released(
    claim_node: str,
    hold: Hold,
    control_plane: ControlPlane,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    command = [sys.executable, "-c", READS_ITS_RESERVATION, str(control_plane.kubeconfig)]
    result = run(hold("--node", claim_node, "--ram", "2048", "--name", "job", command=command))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [f"{namespace}/job", "2048", "Admitted"]
    assert f"hold: holding {namespace}/job on node {claim_node}" in result.stderr
    assert f"hold: released {namespace}/job" in result.stderr
    assert rsv.list_all(custom, namespace) == []
    through_kubectl = run(
        hold("--node", claim_node, "--ram", "1024", command=command, via="kubectl")
    )
    assert through_kubectl.returncode == 0, through_kubectl.stderr
    assert through_kubectl.stdout.split()[1:] == ["1024", "Admitted"]
    assert rsv.list_all(custom, namespace) == []


def test_the_command_sees_the_gpu_devices_of_its_claim(
    device_admitter: DeviceAdmitter,
    hold: Hold,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """Admitted on two GPUs (a stand-in writes the status as the operator would)."""
    echo = ["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES" "$HEADROOM_DEVICES"']
    argv = hold("--node", "gpu-node", "--ram", "0", "--vram", "4096", "--gpus", "2", command=echo)
    result = run(argv)
    assert result.returncode == 0, result.stderr
    both = ",".join(UUIDS)
    assert result.stdout.split() == [both, both]
    assert "replaces" not in result.stderr
    assert rsv.list_all(custom, namespace) == []
    inherited = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
    )
    assert inherited.returncode == 0, inherited.stderr
    assert inherited.stdout.split() == [both, both]
    assert f"hold: CUDA_VISIBLE_DEVICES={both} replaces the inherited '0'" in inherited.stderr
    device_admitter.ids = ("gfd-0",)  # an inventory without UUIDs: CUDA is left alone
    synthetic = subprocess.run(
        hold("--node", "gpu-node", "--ram", "0", "--vram", "4096", command=echo),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "3"},
    )
    assert synthetic.returncode == 0, synthetic.stderr
    assert synthetic.stdout.split() == ["3", "gfd-0"]
    bad = run(hold("--node", "gpu-node", "--vram", "1", "--ram", "0", "--gpus", "-1", command=echo))
    assert bad.returncode == 2
    assert_one_line_error(bad, "--gpus: Invalid value: -1: should be greater than or equal to 0")


@pytest.mark.parametrize(
    ("command", "code"),
    [
        ([sys.executable, "-c", "import sys; sys.exit(7)"], 7),
        (["sh", "-c", "kill -KILL $$"], 128 + signal.SIGKILL),
        (["/nonexistent/command"], 127),
    ],
    ids=["exit-7", "killed", "not-found"],
)
def test_the_exit_code_is_the_commands_and_the_claim_is_released(
    claim_node: str,
    hold: Hold,
    custom: client.CustomObjectsApi,
    namespace: str,
    command: list[str],
    code: int,
) -> None:
    result = run(hold("--node", claim_node, "--ram", "1024", command=command))
    assert result.returncode == code, result.stderr
    assert "hold: released" in result.stderr
    assert rsv.list_all(custom, namespace) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_hold_reaches_the_command_once_then_the_claim_is_released(
    claim_node: str,
    hold: Hold,
    custom: client.CustomObjectsApi,
    namespace: str,
    signum: signal.Signals,
) -> None:
    argv = hold(
        "--node", claim_node, "--ram", "1024", command=[sys.executable, "-c", COUNTS_SIGNALS]
    )
    holder = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        assert [r["status"]["phase"] for r in rsv.list_all(custom, namespace)] == ["Admitted"]
        holder.send_signal(signum)
        out, err = holder.communicate(timeout=30)
    finally:
        holder.kill()
    assert holder.returncode == 41, err  # the command's own code: it got the signal once
    assert out.split() == ["received", signum.name]
    assert "hold: released" in err
    assert rsv.list_all(custom, namespace) == []


def test_a_refused_claim_never_runs_the_command(
    claim_node: str, hold: Hold, custom: client.CustomObjectsApi, namespace: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    result = run(hold("--node", claim_node, "--ram", "16384", command=["touch", str(marker)]))
    assert result.returncode == 1, result.stderr
    assert_one_line_error(
        result,
        f"on node {claim_node}: Rejected (InsufficientRAM)",
        "requested 16384 MiB, allocatable 8192 MiB",
        "the command was not run",
    )
    assert not marker.exists()
    assert rsv.list_all(custom, namespace) == []


def test_no_decision_within_the_timeout_exits_3_and_withdraws_the_claim(
    claim_node: str, hold: Hold, custom: client.CustomObjectsApi, namespace: str, tmp_path: Path
) -> None:
    rsv.create(custom, namespace, "big", claim_node, 6144)
    assert rsv.wait_for(custom, namespace, "big")["status"]["phase"] == "Admitted"
    marker = tmp_path / "ran"
    flags = ("--node", claim_node, "--ram", "4096", "--wait", "5m", "--timeout", "2s")
    # "big" stays alive all along: a loaded machine slows hold's start-up past the 3 s
    # stale window, and the room freed by a reclaim must not decide the claim instead.
    done = threading.Event()

    def beat() -> None:
        while not done.wait(0.5):
            rsv.heartbeat(custom, namespace, "big")

    beating = threading.Thread(target=beat, daemon=True)
    rsv.heartbeat(custom, namespace, "big")
    beating.start()
    try:
        result = run(hold(*flags, command=["touch", str(marker)]))
    finally:
        done.set()
        beating.join()
    assert result.returncode == 3, result.stderr
    assert "queued on node" in result.stderr  # it waited in the queue, then gave up
    assert result.stderr.splitlines()[-1].startswith("Error: no decision on reservation")
    assert not marker.exists()
    assert [r["metadata"]["name"] for r in rsv.list_all(custom, namespace)] == ["big"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--wait", "25h"), '--wait: Invalid value: "25h": must be at most 24h'),
        (("--wait", ".5s"), '--wait: Invalid value: ".5s": spec.wait in body should match'),
        (("--ram", "0"), "at least one of --ram and --vram must be above 0"),
        (("-l", "gpu=a100"), "-l/--selector: only with --node auto"),
    ],
)
def test_a_bad_argument_exits_2_and_runs_nothing(
    hold: Hold,
    custom: client.CustomObjectsApi,
    namespace: str,
    crds: list[str],
    tmp_path: Path,
    flags: tuple[str, ...],
    message: str,
) -> None:
    marker = tmp_path / "ran"
    argv = hold("--node", "n1", "--ram", "64", *flags, command=["touch", str(marker)])
    result = run(argv)
    assert result.returncode == 2, result.stderr
    assert_one_line_error(result, message)
    assert not marker.exists()
    assert rsv.list_all(custom, namespace) == []
    without_command = run(argv[: argv.index("--")])
    assert without_command.returncode == 2
    assert_one_line_error(without_command, "the command to run goes after --")


READS_THE_TERMINAL_THEN_COUNTS_SIGNALS = textwrap.dedent(
    """
    import signal, sys, time
    received = []
    signal.signal(signal.SIGINT, lambda n, f: received.append(n))
    print("ready", flush=True)
    print("read", input(), flush=True)  # stopped (SIGTTIN) unless it has the terminal
    while not received:
        time.sleep(0.05)
    time.sleep(1)
    sys.exit(40 + len(received))
    """
)


def test_at_a_terminal_the_command_reads_it_and_ctrl_c_reaches_it_once(
    claim_node: str, hold: Hold, custom: client.CustomObjectsApi, namespace: str
) -> None:
    command = [sys.executable, "-c", READS_THE_TERMINAL_THEN_COUNTS_SIGNALS]
    argv = hold("--node", claim_node, "--ram", "1024", command=command)
    pid, terminal = pty.fork()
    if pid == 0:  # the child: hold, the foreground job of a new terminal
        os.execv(argv[0], argv)
    try:
        screen = read_until(terminal, b"ready")
        os.write(terminal, b"hello\n")
        screen += read_until(terminal, b"read hello")
        os.write(terminal, b"\x03")  # Ctrl-C
        screen += read_until(terminal, b"hold: released")
        _, status = os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 41, screen.decode(errors="replace")
    assert rsv.list_all(custom, namespace) == []


def read_until(terminal: int, wanted: bytes, timeout: float = 30) -> bytes:
    seen, deadline = b"", time.monotonic() + timeout
    while wanted not in seen:
        if time.monotonic() > deadline or not select.select([terminal], [], [], 1)[0]:
            if time.monotonic() > deadline:
                raise AssertionError(f"{wanted!r} not seen on the terminal: {seen!r}")
            continue
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # the other side closed
            break
        seen += chunk
    assert wanted in seen, seen
    return seen


def test_an_unreachable_cluster_exits_4_and_runs_nothing(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    port = free_port()
    closed = kubeconfig_like_admin(
        control_plane, tmp_path / "closed.kubeconfig", server=f"https://127.0.0.1:{port}"
    )
    marker = tmp_path / "ran"
    argv = [sys.executable, "-m", "headroom", "hold", "--kubeconfig", str(closed), "-n", namespace]
    result = run([*argv, "--node", "n1", "--ram", "64", "--", "touch", str(marker)])
    assert result.returncode == 4, result.stderr
    assert_one_line_error(result, f"cannot reach the API server at https://127.0.0.1:{port}")
    assert not marker.exists()
