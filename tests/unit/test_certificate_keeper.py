"""The certificate keeper's protocol against a small in-memory API: races and rotations.

The real API server is in tests/integration/test_webhook.py; here time travels, so a
CA rotation (months apart in production) is two passes of the loop.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509

from headroom.control.certificates import CertificateKeeper, CertificateTarget
from headroom.kube.transport import JSON, ApiError
from headroom.objects.certificates import CertificatePolicy, service_names

SECRETS = "/api/v1/namespaces/ops/secrets"
CONFIGURATION = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/headroom"
POLICY = CertificatePolicy(
    service_names("headroom-webhook", "ops"), timedelta(days=365), timedelta(days=90)
)


class TinyApi:
    """get/create/replace/json_patch with resourceVersions, 404 and 409, as the server."""

    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}
        self.version = 0
        self.writes: list[str] = []

    def _stored(self, path: str, body: JSON) -> JSON:
        self.version += 1
        body = copy.deepcopy(body)
        body.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[path] = body
        return copy.deepcopy(body)

    async def get(self, path: str) -> JSON:
        await asyncio.sleep(0)
        if path not in self.objects:
            raise ApiError(404, "NotFound", path)
        return copy.deepcopy(self.objects[path])

    async def create(self, path: str, body: JSON) -> JSON:
        await asyncio.sleep(0)
        full = f"{path}/{body['metadata']['name']}"
        if full in self.objects:
            raise ApiError(409, "AlreadyExists", full)
        self.writes.append(f"create {full}")
        return self._stored(full, body)

    async def replace(self, path: str, body: JSON) -> JSON:
        await asyncio.sleep(0)
        current = self.objects[path]["metadata"]["resourceVersion"]
        if body["metadata"].get("resourceVersion") != current:
            raise ApiError(409, "Conflict", path)
        self.writes.append(f"replace {path}")
        return self._stored(path, body)

    async def json_patch(self, path: str, operations: list[JSON]) -> JSON:
        await asyncio.sleep(0)
        body = copy.deepcopy(self.objects[path])
        for op in operations:
            *parents, leaf = [int(p) if p.isdigit() else p for p in op["path"].split("/")[1:]]
            target: Any = body
            for part in parents:
                target = target[part]
            if op["op"] == "test":
                if target[leaf] != op["value"]:
                    raise ApiError(422, "Invalid", "test failed")
            else:
                target[leaf] = op["value"]
        self.writes.append(f"patch {path} {json.dumps(operations)[:40]}")
        return self._stored(path, body)


class Clock:
    def __init__(self) -> None:
        self.at = datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return 0.0


def keeper(api: TinyApi, clock: Clock, served: list[bytes], configuration: str | None) -> Any:
    async def serve(cert: bytes, key: bytes) -> None:
        served.append(cert)

    target = CertificateTarget("ops", "headroom-webhook-cert", configuration, POLICY)
    return CertificateKeeper(api, target, serve, clock=clock, period=10)  # type: ignore[arg-type]


def configuration() -> JSON:
    return {
        "metadata": {"name": "headroom"},
        "webhooks": [
            {"name": "gate.headroom.dev", "clientConfig": {"service": {"name": "s"}}},
            {"name": "other.headroom.dev", "clientConfig": {"service": {"name": "s"}}},
        ],
    }


def published(api: TinyApi) -> list[bytes]:
    webhooks = api.objects[CONFIGURATION]["webhooks"]
    return [base64.b64decode(w["clientConfig"]["caBundle"]) for w in webhooks]


def issuer(pem: bytes) -> x509.Name:
    return x509.load_pem_x509_certificate(pem).issuer


def test_replicas_racing_at_first_start_make_one_secret_and_serve_it() -> None:
    api, clock = TinyApi(), Clock()
    api._stored(CONFIGURATION, configuration())
    served: list[list[bytes]] = [[], [], []]

    async def main() -> None:
        keepers = [keeper(api, clock, s, "headroom") for s in served]
        await asyncio.gather(*(k.sync() for k in keepers))

    asyncio.run(main())
    creates = [w for w in api.writes if w.startswith("create")]
    assert creates == [f"create {SECRETS}/headroom-webhook-cert"]
    secret = api.objects[f"{SECRETS}/headroom-webhook-cert"]
    cert = base64.b64decode(secret["data"]["tls.crt"])
    assert all(s == [cert] for s in served)
    trust = base64.b64decode(secret["data"]["ca-bundle.crt"])
    assert published(api) == [trust, trust]


def test_a_ca_rotation_publishes_the_new_ca_before_serving_its_certificate() -> None:
    api, clock = TinyApi(), Clock()
    api._stored(CONFIGURATION, configuration())
    served: list[bytes] = []
    one = keeper(api, clock, served, "headroom")
    asyncio.run(one.sync())
    first_ca = x509.load_pem_x509_certificate(published(api)[0]).subject
    # Serving certificates renewed on time, then the CA enters its last third.
    for days in (61, 122, 183, 244):
        clock.at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=days)
        asyncio.run(one.sync())
    rotated = published(api)[0]
    cas = [c.subject for c in x509.load_pem_x509_certificates(rotated)]
    assert len(cas) == 2
    assert cas[1] == first_ca
    assert issuer(served[-1]) == first_ca  # still the old CA's: it was not yet trusted
    clock.at += timedelta(seconds=10)
    asyncio.run(one.sync())
    assert issuer(served[-1]) == cas[0]  # now the new CA's, which the bundle trusts
    assert published(api)[0] == rotated


def test_what_is_served_is_always_trusted_by_what_is_published() -> None:
    api, clock = TinyApi(), Clock()
    api._stored(CONFIGURATION, configuration())
    checked: list[bytes] = []

    async def serve(cert: bytes, key: bytes) -> None:
        webhooks = api.objects[CONFIGURATION]["webhooks"]
        if "caBundle" in webhooks[0]["clientConfig"]:  # nothing published at first start
            trust = x509.load_pem_x509_certificates(published(api)[0])
            leaf = x509.load_pem_x509_certificate(cert)
            assert leaf.issuer in [ca.subject for ca in trust]
            assert leaf.not_valid_after_utc > clock.at
            checked.append(cert)

    target = CertificateTarget("ops", "headroom-webhook-cert", "headroom", POLICY)
    one = CertificateKeeper(api, target, serve, clock=clock, period=10)  # type: ignore[arg-type]
    start = clock.at
    for hours in range(0, 24 * 800, 24 * 7):  # weekly for two years: two CA rotations
        clock.at = start + timedelta(hours=hours)
        asyncio.run(one.sync())
    assert len(set(checked)) >= 10


def test_without_a_configuration_the_certificate_is_still_kept() -> None:
    api, clock = TinyApi(), Clock()
    served: list[bytes] = []
    asyncio.run(keeper(api, clock, served, "headroom").sync())
    asyncio.run(keeper(api, clock, served, None).sync())
    assert len(served) == 2
    assert served[0] == served[1]
