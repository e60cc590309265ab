"""The extender's HTTPS: only the scheduler's client certificate completes a handshake.

A real listener and real TLS handshakes on loopback (our own serving code; what
kube-scheduler itself sends is in ``tests/e2e/test_scheduler_extender.py``). The server
is not deciding, so a caller let in gets the standby's 503: an HTTP answer at all is
what a caller without the certificate must never get.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from headroom.api.config import EXTENDER_CLIENT
from headroom.objects.certificates import Bundle, CertificatePolicy, fresh, issue, renewal
from headroom.objects.clientcerts import client_renewal
from headroom.serving.extender import ExtenderServer

NOW = datetime.now(UTC)
POLICY = CertificatePolicy(("127.0.0.1",), timedelta(days=365), timedelta(days=90))
FILTER = {"Pod": {"metadata": {"name": "p", "namespace": "n"}}, "NodeNames": ["a"]}


def client_context(tmp: Path, trust: bytes, pair: tuple[bytes, bytes] | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=trust.decode())
    if pair is not None:
        cert, key = pair
        (tmp / "client.pem").write_bytes(key + b"\n" + cert)
        context.load_cert_chain(tmp / "client.pem")
    return context


def scheduler_pair(bundle: Bundle, at: datetime = NOW) -> tuple[bytes, bytes]:
    plan = client_renewal(None, bundle, EXTENDER_CLIENT, at, timedelta(days=90))
    assert plan is not None
    return plan.pair.cert, plan.pair.key


async def answer(port: int, context: ssl.SSLContext) -> int | str:
    """The HTTP status of a filter call, or why no answer came."""
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"https://127.0.0.1:{port}/filter", json=FILTER, ssl=context) as got,
        ):
            return got.status
    except (aiohttp.ClientError, ssl.SSLError, ConnectionError) as error:
        return f"no answer: {type(error).__name__}"


@pytest.fixture
async def server() -> AsyncIterator[ExtenderServer]:
    controller: Any = SimpleNamespace(gates=None, clock=None)
    extender = ExtenderServer(controller, "127.0.0.1", 0, deciding=lambda: False, tls=True)
    await extender.start()
    yield extender
    await extender.stop()


async def test_only_the_schedulers_client_certificate_gets_an_answer(
    server: ExtenderServer, tmp_path: Path
) -> None:
    bundle = fresh(POLICY, NOW)
    assert str(await answer(server.port, client_context(tmp_path, bundle.trust, None))).startswith(
        "no answer"
    )  # nothing loaded yet: no handshake completes
    await server.load(bundle)
    other_ca = fresh(POLICY, NOW)
    callers = {
        "the scheduler's": scheduler_pair(bundle),
        "none": None,
        "the webhook's serving pair (serverAuth only)": (bundle.cert, bundle.key),
        "a client pair from another CA": scheduler_pair(other_ca),
    }
    got = {
        who: await answer(server.port, client_context(tmp_path, bundle.trust, pair))
        for who, pair in callers.items()
    }
    assert got["the scheduler's"] == 503  # let in; a standby's answer
    refused = {who: str(status) for who, status in got.items() if who != "the scheduler's"}
    assert all(status.startswith("no answer") for status in refused.values()), refused


async def test_after_a_ca_rotation_clients_of_either_ca_get_an_answer(
    server: ExtenderServer, tmp_path: Path
) -> None:
    month_ago = NOW - timedelta(days=30)
    renewed = renewal(fresh(POLICY, NOW - timedelta(days=250)), POLICY, month_ago)
    assert renewed is not None
    bundle = renewed[0]  # its serving certificate is live, its CA in its last third now
    old_client = scheduler_pair(bundle, month_ago)
    rotation = renewal(bundle, POLICY, NOW)
    assert rotation is not None
    rotated = rotation[0]
    await server.load(rotated)
    trust = rotated.trust
    assert await answer(server.port, client_context(tmp_path, trust, old_client)) == 503
    new_client = scheduler_pair(rotated)
    assert await answer(server.port, client_context(tmp_path, trust, new_client)) == 503
    stranger = fresh(POLICY, NOW)
    client = issue(stranger.ca_cert, stranger.ca_key, ("x",), NOW, timedelta(days=1), client=True)
    assert str(await answer(server.port, client_context(tmp_path, trust, client))).startswith(
        "no answer"
    )
