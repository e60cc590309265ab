"""The built binaries and the child processes the local cluster runs them as.

Shared by the API-only control plane (:mod:`headroom_dev.controlplane`) and the
controllers started beside it (:mod:`headroom_dev.controllers`). Children get
``PR_SET_PDEATHSIG`` so that a killed test run cannot leave one behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import random
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_BIN_DIR = Path.home() / ".cache" / "headroom" / "bin" / "current"
_PR_SET_PDEATHSIG = 1


class ControlPlaneError(RuntimeError):
    """The control plane could not be started; the message says why and where the logs are."""


def bin_dir() -> Path:
    """Where ``hack/controlplane/build.sh`` put the binaries (``$HEADROOM_BIN_DIR`` overrides)."""
    return Path(os.environ.get("HEADROOM_BIN_DIR", DEFAULT_BIN_DIR))


def binary(
    name: str, build: str = "make controlplane", script: str = "hack/controlplane/build.sh"
) -> Path:
    """Path of a built binary; a loud error naming the command that builds it if missing."""
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        raise ControlPlaneError(f"{name} not found at {path}: run `{build}` ({script})")
    return path


def kubectl_for(kubeconfig: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run("get", "rsv", input=yaml_text)``: the built kubectl with ``kubeconfig``."""
    path = str(binary("kubectl"))

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [path, f"--kubeconfig={kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    return run


_LOWEST_PORT = 10_000
_handed_out: set[int] = set()


def ephemeral_ports(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> range:
    """The kernel's ephemeral range: where every outgoing connection's source port,
    and every ``bind(port=0)``, comes from."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def free_port(rng: random.Random | None = None) -> int:
    """A loopback TCP port for a child to listen on, free now and likely to stay free
    until the child binds it, seconds later.

    Not one the kernel hands out (``bind(port=0)``): that comes from the ephemeral
    range, which every outgoing connection takes its source port from too, so a busy
    test run (etcd and kube-apiserver talking while a plane starts) can take it
    before the child binds it (CI saw kube-controller-manager fail on "address
    already in use"). Ports below that range are never taken that way; one is picked
    at random there, never twice in this process, and checked free by binding it.
    """
    rng = rng or random.SystemRandom()
    ephemeral = ephemeral_ports()
    if ephemeral.start - _LOWEST_PORT < 1000:  # a machine that left no room below
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            return port
    for _ in range(1000):
        port = rng.randrange(_LOWEST_PORT, ephemeral.start)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise ControlPlaneError(f"no free loopback port in {_LOWEST_PORT}..{ephemeral.start - 1}")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Child:
    """One child process with its log file."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.popen = None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_until(self, ready: Callable[[], bool], timeout: float) -> None:
        """Poll ``ready`` until it is true; a loud error with the log if the child
        exits or the time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise ControlPlaneError(
                    f"{self.name} exited while starting; its log ({self.log}) ends:\n{self.tail()}"
                )
            with contextlib.suppress(OSError, http.client.HTTPException, ssl.SSLError):
                if ready():
                    return
            time.sleep(0.1)
        raise ControlPlaneError(
            f"{self.name} not ready after {timeout:.0f}s; its log ({self.log}) ends:\n{self.tail()}"
        )


def https_get(port: int, path: str, context: ssl.SSLContext) -> tuple[int, bytes]:
    """A GET on a loopback HTTPS port: status and body."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()
