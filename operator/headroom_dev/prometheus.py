"""The real Prometheus (Debian's, put in the cache by ``make prometheus``) for the alert tests.

The shipped alert rules and the dashboard are only worth something if a real
Prometheus accepts them and finds the operator's series, so the tests run the
real ``promtool`` on the rules and a real ``prometheus`` scraping a running
operator. :func:`scrape_config` is the one place that says how the operator is
scraped (plain HTTP today); when metrics move behind TLS and a bearer token, that
function alone changes.
"""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from headroom_dev.operator import OperatorProcess
from headroom_dev.process import Child, ControlPlaneError, binary, free_port

BUILD, SCRIPT = "make prometheus", "hack/prometheus.sh"


def promtool() -> Path:
    """The ``promtool`` binary; a loud error naming ``make prometheus`` if missing."""
    return binary("promtool", BUILD, SCRIPT)


def prometheus() -> Path:
    """The ``prometheus`` server binary; a loud error naming ``make prometheus`` if missing."""
    return binary("prometheus", BUILD, SCRIPT)


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool()), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


def scrape_config(
    job: str, operator: OperatorProcess, token_file: Path | None = None
) -> dict[str, Any]:
    """How Prometheus scrapes a running operator's metrics endpoint: over HTTPS with a
    bearer token read from ``token_file`` when the endpoint is secure (the operator's
    self-signed certificate is not verified, as the ServiceMonitor's default), plain
    HTTP when the operator was started with ``metricsSecure: false``."""
    config: dict[str, Any] = {
        "job_name": job,
        "metrics_path": "/metrics",
        "static_configs": [{"targets": [f"127.0.0.1:{operator.metrics_port}"]}],
    }
    if not operator.metrics_secure:
        return {**config, "scheme": "http"}
    if token_file is None:
        raise ValueError("a secure metrics endpoint needs a token_file")
    return {
        **config,
        "scheme": "https",
        "tls_config": {"insecure_skip_verify": True},
        "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
    }


class PrometheusError(RuntimeError):
    """A query Prometheus refused, with its error."""


class PrometheusServer:
    """A Prometheus on a loopback port with a temporary data directory, scraping the given
    jobs every ``interval`` and evaluating ``rule_files`` as often; removed on :meth:`stop`."""

    def __init__(
        self,
        scrape_configs: list[dict[str, Any]],
        rule_files: Sequence[Path] = (),
        interval: str = "1s",
    ) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="headroom-prometheus-"))
        self.port = free_port()
        self.config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": scrape_configs,
        }
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(self.config))
        argv = [
            str(prometheus()),
            f"--config.file={config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
        ]
        self.child = Child("prometheus", argv, self.workdir / "prometheus.log")

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        self.child.start()
        self.child.wait_until(lambda: self._get("/-/ready")[0] == 200, timeout)
        return self

    def stop(self) -> None:
        self.child.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def tail(self, lines: int = 30) -> str:
        return self.child.tail(lines)

    def _get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data``; :class:`PrometheusError` with Prometheus'
        own error if it answered ``status: error``."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        status, body = self._get(f"/api/v1/{path}{query}")
        answer = json.loads(body)
        if status != 200 or answer.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {answer.get('error', body[:300])}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector's samples; a scalar as one sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets_up(self) -> list[str]:
        """The scrape URLs whose last scrape succeeded."""
        active = self.api("targets", state="active")["activeTargets"]
        return [t["scrapeUrl"] for t in active if t["health"] == "up"]

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Query ``expr`` until it returns samples; a loud error with the log if never."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"prometheus: {expr!r} still empty after {timeout:.0f}s; log:\n{self.tail()}"
                )
            time.sleep(0.25)


def service_monitor_scrape(
    job: str, endpoint: dict[str, Any], targets: list[str], token_file: Path
) -> dict[str, Any]:
    """The scrape config the Prometheus Operator makes of one ServiceMonitor endpoint, for
    a Prometheus outside the cluster: its scheme, path and TLS settings as the chart
    rendered them; the targets (pod addresses) and the token file, which in a cluster
    would be the endpoints of the Service and the Prometheus pod's own token, given."""
    config: dict[str, Any] = {
        "job_name": job,
        "scheme": endpoint.get("scheme", "http"),
        "metrics_path": endpoint.get("path", "/metrics"),
        "static_configs": [{"targets": targets}],
    }
    if config["scheme"] != "https":
        return config
    tls = endpoint.get("tlsConfig") or {}
    unknown = set(tls) - {"insecureSkipVerify", "serverName"}
    if unknown:
        raise ValueError(f"tlsConfig keys this harness does not translate: {sorted(unknown)}")
    config["tls_config"] = {
        key: tls[name]
        for name, key in (
            ("insecureSkipVerify", "insecure_skip_verify"),
            ("serverName", "server_name"),
        )
        if name in tls
    }
    if "bearerTokenFile" in endpoint or "authorization" in endpoint:
        config["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
    return config
