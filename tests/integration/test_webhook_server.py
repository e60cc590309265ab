"""The webhook's HTTPS server on loopback: real TLS, real sockets, no API server.

It answers only once a certificate is loaded, swaps certificates for new
handshakes without a restart (reached by IP, so with no SNI, as the API server
dials a URL webhook), and answers a malformed body with 400, not a crash.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from headroom.objects.certificates import CertificatePolicy, fresh
from headroom.serving.webhook import PATH, WebhookServer

POLICY = CertificatePolicy(("headroom-webhook", "127.0.0.1"), timedelta(days=30), timedelta(days=3))
REVIEW = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "object": {
            "metadata": {
                "labels": {"headroom.dev/claim": "true"},
                "annotations": {"headroom.dev/ram": "1Gi"},
            },
            "spec": {"containers": []},
        },
    },
}


@pytest.fixture
async def server() -> AsyncIterator[WebhookServer]:
    webhook = WebhookServer("127.0.0.1", 0)
    await webhook.start()
    yield webhook
    await webhook.stop()


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca_pem.decode())


async def served_certificate(port: int, ca_pem: bytes) -> x509.Certificate:
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(ca_pem))
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der)
    finally:
        writer.close()


async def post(port: int, ca_pem: bytes, body: bytes) -> tuple[int, str]:
    connector = aiohttp.TCPConnector(ssl=client_context(ca_pem))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(
            f"https://127.0.0.1:{port}{PATH}",
            data=body,
            headers={"Content-Type": "application/json"},
        ) as response,
    ):
        return response.status, await response.text()


async def test_no_handshake_completes_before_a_certificate_is_loaded(
    server: WebhookServer,
) -> None:
    assert not server.ready
    bundle = fresh(POLICY, datetime.now(UTC))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await served_certificate(server.port, bundle.ca_cert)
    await server.load(bundle.cert, bundle.key)
    assert server.ready
    status, text = await post(server.port, bundle.ca_cert, json.dumps(REVIEW).encode())
    assert status == 200
    response = json.loads(text)["response"]
    assert response["uid"] == "u-1"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"


async def test_a_new_certificate_is_served_to_new_handshakes(server: WebhookServer) -> None:
    first = fresh(POLICY, datetime.now(UTC))
    await server.load(first.cert, first.key)
    assert (await served_certificate(server.port, first.ca_cert)).public_bytes(
        encoding=Encoding.PEM
    ) == first.cert
    second = fresh(POLICY, datetime.now(UTC))
    await server.load(second.cert, second.key)
    assert (await served_certificate(server.port, second.ca_cert)).public_bytes(
        encoding=Encoding.PEM
    ) == second.cert
    with pytest.raises(ssl.SSLError):  # the old CA no longer verifies what is served
        await served_certificate(server.port, first.ca_cert)


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"[]", b'{"apiVersion": "admission.k8s.io/v1"}', b"[" * 100_000, b"\xff\xfe"],
)
async def test_a_malformed_body_is_400_and_the_server_lives_on(
    server: WebhookServer, body: bytes
) -> None:
    bundle = fresh(POLICY, datetime.now(UTC))
    await server.load(bundle.cert, bundle.key)
    status, text = await post(server.port, bundle.ca_cert, body)
    assert status == 400, text
    assert "not an AdmissionReview" in text
    status, _ = await post(server.port, bundle.ca_cert, json.dumps(REVIEW).encode())
    assert status == 200


async def test_a_denial_names_the_annotation(server: WebhookServer) -> None:
    bundle = fresh(POLICY, datetime.now(UTC))
    await server.load(bundle.cert, bundle.key)
    bad = json.loads(json.dumps(REVIEW))
    bad["request"]["object"]["metadata"]["annotations"]["headroom.dev/ram"] = "8 gigs"
    status, text = await post(server.port, bundle.ca_cert, json.dumps(bad).encode())
    assert status == 200
    response = json.loads(text)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert "annotation headroom.dev/ram" in response["status"]["message"]
    assert "'8 gigs'" in response["status"]["message"]


async def test_each_review_is_reported_with_its_result_and_time() -> None:
    """What ``headroom_webhook_reviews_total{result}`` and ``_review_seconds`` count."""
    reviews: list[tuple[str, float]] = []
    webhook = WebhookServer("127.0.0.1", 0, on_review=lambda *seen: reviews.append(seen))
    await webhook.start()
    try:
        bundle = fresh(POLICY, datetime.now(UTC))
        await webhook.load(bundle.cert, bundle.key)
        request: dict = REVIEW["request"]  # type: ignore[assignment]
        pod = request["object"]
        plain = {**pod, "metadata": {"labels": {}}}
        pinned = {**pod, "spec": {"containers": [], "nodeName": "n1"}}
        for obj in (pod, plain, pinned):
            body = json.dumps({**REVIEW, "request": {**request, "object": obj}}).encode()
            assert (await post(webhook.port, bundle.ca_cert, body))[0] == 200
        assert (await post(webhook.port, bundle.ca_cert, b"{"))[0] == 400
    finally:
        await webhook.stop()
    assert [result for result, _ in reviews] == ["patched", "allowed", "denied", "error"]
    assert all(0 <= seconds < 5 for _, seconds in reviews)
