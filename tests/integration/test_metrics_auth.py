"""/metrics over TLS, for ServiceAccounts that RBAC lets read it, on the real API server.

A real operator serves its metrics the way the chart deploys it (``metricsSecure``
is the default): a scrape without a token, or with one the API server does not
know, gets 401; a ServiceAccount's real token (TokenRequest) gets 403 until the
account is bound to the chart's ``metrics-reader`` ClusterRole, then 200 and the
metrics. The chart's own operator role suffices to review the tokens. A mounted
certificate is served and read again when it changes (in process, on loopback).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from headroom.objects.certificates import CertificatePolicy, fresh
from headroom.serving.metrics import OperatorMetrics
from headroom.serving.scrape import CERT_FILE, KEY_FILE, MetricsServer
from headroom_dev.controlplane import ControlPlane
from headroom_dev.operator import OperatorProcess
from tests.integration.metrics_access_support import SECURE, Accounts
from tests.integration.test_chart import installed, operator_as_service_account
from tests.polling import eventually

__all__ = ["installed"]  # a fixture of the chart's tests, used here too


def test_only_a_bound_service_account_reads_the_metrics(
    run_operator: Callable[..., OperatorProcess], accounts: Accounts
) -> None:
    operator = run_operator(SECURE)
    assert operator.metrics_url.startswith("https://")
    prometheus, stranger = accounts.token("prometheus"), accounts.token("stranger")
    accounts.grant("prometheus")

    assert operator.scrape()[0] == 401  # no token
    assert operator.scrape("not-a-token")[0] == 401
    status, text = operator.scrape(stranger)
    assert (status, text) == (403, "Forbidden")
    status, text = operator.scrape(prometheus)
    assert status == 200, text
    assert "\nheadroom_active_entries " in text, text[:2000]
    # Probes stay plain HTTP on their own port, for the kubelet, with no token.
    assert operator.get("/readyz") == (200, "ok")
    # A refusal is cached for seconds, not for good: bound now, served soon.
    accounts.grant("stranger")
    eventually(lambda: _assert_status(operator.scrape(stranger), 200), timeout=30)
    assert "Traceback" not in operator.tail(200)


def test_the_metrics_endpoint_speaks_only_tls(
    run_operator: Callable[..., OperatorProcess], accounts: Accounts
) -> None:
    """The self-signed certificate is one no client trusts by default (Prometheus skips
    verification for it); plain HTTP to the port gets no metrics."""
    operator = run_operator(SECURE)
    token = accounts.token("prometheus")
    accounts.grant("prometheus")
    with pytest.raises(ssl.SSLCertVerificationError):
        operator.scrape(token, ssl.create_default_context())
    plain = http.client.HTTPConnection("127.0.0.1", operator.metrics_port, timeout=5)
    try:
        plain.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
        answer = plain.getresponse()
        assert answer.status == 400, answer.status  # a TLS server's answer to plain HTTP
        assert b"headroom_" not in answer.read()
    except (ConnectionError, http.client.HTTPException):
        pass  # or it closed the connection: no metrics either
    finally:
        plain.close()


def test_the_charts_operator_role_may_review_scrapes(
    installed: None,
    control_plane: ControlPlane,
    tmp_path: Path,
    accounts: Accounts,
) -> None:
    """As the chart's ServiceAccount (its ClusterRole alone): tokens and access are
    reviewed, nothing is refused to the operator."""
    operator = operator_as_service_account(control_plane, tmp_path, SECURE).start()
    try:
        token = accounts.token("prometheus")
        accounts.grant("prometheus")
        status, text = operator.scrape(token)
        assert status == 200, text + operator.tail(50)
        assert operator.scrape(accounts.token("stranger"))[0] == 403
        assert "cannot review" not in operator.tail(200)
    finally:
        operator.stop()


@pytest.mark.parametrize("resource", ["tokenreviews", "subjectaccessreviews"])
def test_each_review_right_is_necessary(
    installed: None,
    control_plane: ControlPlane,
    tmp_path: Path,
    accounts: Accounts,
    kubectl: Callable[..., Any],
    resource: str,
) -> None:
    """Without one of the two rules the scrape cannot be reviewed: 503, and the
    operator says why (it keeps deciding: only the scrape is refused)."""
    role = json.loads(kubectl("get", "clusterrole", "headroom-operator", "-o", "json").stdout)
    kept = [r for r in role["rules"] if r.get("resources") != [resource]]
    assert len(kept) == len(role["rules"]) - 1
    role["rules"] = kept
    result = kubectl("replace", "-f", "-", input=json.dumps(role))
    assert result.returncode == 0, result.stderr
    operator = operator_as_service_account(control_plane, tmp_path, SECURE).start()
    try:
        token = accounts.token("prometheus")
        accounts.grant("prometheus")
        status, text = operator.scrape(token)
        assert status == 503, text
        assert "cannot review a scrape of /metrics: 403" in operator.tail(50)
        assert operator.get("/readyz") == (200, "ok")
    finally:
        operator.stop()


def _assert_status(answer: tuple[int, str], status: int) -> None:
    assert answer[0] == status, answer


# -- a mounted certificate, in process --------------------------------------------------


def _write_pair(directory: Path, names: tuple[str, ...]) -> bytes:
    """A CA-signed pair for ``names`` in ``directory``; the CA's PEM."""
    now = datetime.now(UTC)
    bundle = fresh(CertificatePolicy(names, timedelta(days=30), timedelta(days=3)), now)
    (directory / CERT_FILE).write_bytes(bundle.cert)
    (directory / KEY_FILE).write_bytes(bundle.key)
    return bundle.ca_cert


async def _served(port: int, ca_pem: bytes) -> x509.Certificate:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der)
    finally:
        writer.close()


async def test_a_mounted_certificate_is_served_and_reloaded(tmp_path: Path) -> None:
    first_ca = _write_pair(tmp_path, ("headroom-metrics", "127.0.0.1"))
    server = MetricsServer(
        OperatorMetrics(lambda: None),
        "127.0.0.1",
        0,
        reviewer=object(),  # type: ignore[arg-type]  # no scrape here, only handshakes
        cert_dir=str(tmp_path),
    )
    await server.start()
    keeper = asyncio.create_task(server.keep_certificate(period=0.05))
    try:
        first = await _served(server.port, first_ca)
        (tmp_path / KEY_FILE).write_text("not a key")  # half-written: the old pair stays
        await asyncio.sleep(0.2)
        assert await _served(server.port, first_ca) == first
        second_ca = _write_pair(tmp_path, ("headroom-metrics", "127.0.0.1"))
        for _ in range(100):
            try:
                second = await _served(server.port, second_ca)
                break
            except ssl.SSLCertVerificationError:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("the renewed certificate was never served")
        assert second != first
    finally:
        keeper.cancel()
        await server.stop()
