"""Run the Headroom operator as a child process, the way a Deployment would.

A subprocess (not an in-process task) so that tests can SIGKILL it mid-flight,
restart it and prove the ledger is rebuilt from the API alone.

Probes and metrics listen on two free loopback ports. The harness opts in to plain
HTTP metrics (``metricsSecure: false``) unless the config asks for the secure
endpoint: the tests that read metrics are about the metrics, and the ones about
their protection (tests/integration/test_metrics_auth.py) scrape with real tokens
through :meth:`OperatorProcess.scrape`.
"""

from __future__ import annotations

import http.client
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from headroom_dev.controlplane import free_port


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        config: dict[str, Any] | None = None,
        args: tuple[str, ...] = (),
    ):
        """``args``: more of ``headroom run``'s flags (``--log-format=json``)."""
        self.kubeconfig = kubeconfig
        self.args = args
        self.workdir = workdir
        self.port = free_port()  # the probes'
        self.metrics_port = free_port()
        self.config = {
            "metricsSecure": False,
            **(config or {}),
            "probePort": self.port,
            "probeHost": "127.0.0.1",
            "metricsPort": self.metrics_port,
            "metricsHost": "127.0.0.1",
        }
        self.config_path = workdir / "headroom.yaml"
        self.log = workdir / "operator.log"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self, wait_ready: bool = True, timeout: float = 60) -> OperatorProcess:
        self.config_path.write_text(yaml.safe_dump(self.config))
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "headroom",
                    "run",
                    "--config",
                    str(self.config_path),
                    *self.args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        if wait_ready:
            self.wait_ready(timeout)
        return self

    @property
    def metrics_secure(self) -> bool:
        return bool(self.config["metricsSecure"])

    @property
    def metrics_url(self) -> str:
        scheme = "https" if self.metrics_secure else "http"
        return f"{scheme}://127.0.0.1:{self.metrics_port}/metrics"

    def get(self, path: str) -> tuple[int, str]:
        """GET a probe, or /metrics (with no token: 401 on the secure endpoint)."""
        if path == "/metrics":
            return self.scrape()
        return _get(http.client.HTTPConnection("127.0.0.1", self.port, timeout=5), path)

    def scrape(
        self, token: str | None = None, context: ssl.SSLContext | None = None
    ) -> tuple[int, str]:
        """GET /metrics, with ``Authorization: Bearer token`` if given; over TLS when the
        endpoint is secure (``context``: how to verify it; default: not at all, as for
        the self-signed certificate)."""
        if not self.metrics_secure:
            conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=5)
        else:
            if context is None:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(
                "127.0.0.1", self.metrics_port, timeout=5, context=context
            )
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return _get(conn, "/metrics", headers)

    def ready(self, body: str | None = None) -> bool:
        """/readyz answers 200 with exactly ``body`` if given, else "ok" or "standby": a
        replica whose webhook serves is ready while it rebuilds its ledger too (200
        "rebuilding the ledger"), and the tests wait for one that can decide or wait."""
        try:
            status, text = self.get("/readyz")
        except OSError:
            return False
        return status == 200 and (text in ("ok", "standby") if body is None else text == body)

    def wait_ready(self, timeout: float = 60, body: str | None = None) -> None:
        """Wait for /readyz; ``body="ok"`` waits for a leader that can decide, since a
        replica that has not yet taken the Lease is ready too (as "standby")."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(f"operator exited ({self.popen.returncode}):\n{self.tail()}")
            if self.ready(body):
                return
            time.sleep(0.05)
        raise TimeoutError(f"operator not ready ({body or 200}) after {timeout}s:\n{self.tail()}")

    def metrics(self) -> dict[str, float]:
        """Parsed /metrics: ``'name{label="v"}' -> value``."""
        status, text = self.get("/metrics")
        assert status == 200, text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                values[key] = float(value)
        return values

    def stop(self, timeout: float = 20) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.popen = None

    def kill(self) -> None:
        if self.popen is not None:
            self.popen.kill()
            self.popen.wait()
            self.popen = None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _get(
    conn: http.client.HTTPConnection, path: str, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()
