"""The certificate keeper's protocol against a small in-memory API: races and rotations.

The real API server is in tests/integration/test_webhook.py; here time travels, so a
CA rotation (months apart in production) is two passes of the loop.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from headroom.control.certificates import (
    CertificateKeeper,
    CertificateTarget,
    ClientCertificateTarget,
)
from headroom.kube.transport import JSON, ApiError
from headroom.objects.certificates import Bundle, CertificatePolicy, service_names

SECRETS = "/api/v1/namespaces/ops/secrets"
CONFIGURATION = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/headroom"
POLICY = CertificatePolicy(
    service_names("headroom-webhook", "ops"), timedelta(days=365), timedelta(days=90)
)


class TinyApi:
    """get/create/replace/json_patch/merge_patch with resourceVersions, 404 and 409, as
    the server."""

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

    async def merge_patch(self, path: str, patch: JSON) -> JSON:
        await asyncio.sleep(0)
        if path not in self.objects:
            raise ApiError(404, "NotFound", path)

        def merged(into: Any, change: Any) -> Any:
            if not isinstance(change, dict) or not isinstance(into, dict):
                return change
            out = dict(into)
            for key, value in change.items():
                if value is None:
                    out.pop(key, None)
                else:
                    out[key] = merged(into.get(key), value)
            return out

        self.writes.append(f"merge {path}")
        return self._stored(path, merged(self.objects[path], patch))

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
    async def serve(bundle: Bundle) -> None:
        served.append(bundle.cert)

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

    async def serve(bundle: Bundle) -> None:
        webhooks = api.objects[CONFIGURATION]["webhooks"]
        if "caBundle" in webhooks[0]["clientConfig"]:  # nothing published at first start
            trust = x509.load_pem_x509_certificates(published(api)[0])
            leaf = x509.load_pem_x509_certificate(bundle.cert)
            assert leaf.issuer in [ca.subject for ca in trust]
            assert leaf.not_valid_after_utc > clock.at
            checked.append(bundle.cert)

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


CLIENTS = ClientCertificateTarget(
    "headroom-scheduler-client", "headroom-scheduler", timedelta(days=90)
)


def data(api: TinyApi, secret: str, key: str) -> bytes:
    return base64.b64decode(api.objects[f"{SECRETS}/{secret}"]["data"][key])


def test_replicas_racing_at_first_start_write_one_client_certificate_secret() -> None:
    api, clock = TinyApi(), Clock()
    target = CertificateTarget("ops", "headroom-webhook-cert", None, POLICY, CLIENTS)

    async def serve(bundle: Bundle) -> None:
        pass

    async def main() -> None:
        keepers = [
            CertificateKeeper(api, target, serve, clock=clock, period=10)  # type: ignore[arg-type]
            for _ in range(3)
        ]
        await asyncio.gather(*(k.sync() for k in keepers))

    asyncio.run(main())
    creates = sorted(w for w in api.writes if w.startswith("create"))
    assert creates == [
        f"create {SECRETS}/headroom-scheduler-client",
        f"create {SECRETS}/headroom-webhook-cert",
    ]
    client = api.objects[f"{SECRETS}/headroom-scheduler-client"]
    assert client["type"] == "kubernetes.io/tls"
    assert set(client["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert client["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "headroom-operator"}
    assert "ca.key" not in client["data"]  # the CA's key stays in the webhook's Secret


def test_the_client_certificate_is_always_one_the_extender_trusts_through_ca_rotations() -> None:
    """Weekly for two years (two CA rotations, eight client renewals): the Secret the
    scheduler mounts holds a live clientAuth certificate for headroom-scheduler issued
    by a CA the extender trusts (the webhook's bundle), and ca.crt is that bundle."""
    api, clock = TinyApi(), Clock()
    api._stored(CONFIGURATION, configuration())
    served: list[Bundle] = []

    async def serve(bundle: Bundle) -> None:
        served.append(bundle)

    target = CertificateTarget("ops", "headroom-webhook-cert", "headroom", POLICY, CLIENTS)
    one = CertificateKeeper(api, target, serve, clock=clock, period=10)  # type: ignore[arg-type]
    start, issued = clock.at, set()
    for hours in range(0, 24 * 800, 24 * 7):
        clock.at = start + timedelta(hours=hours)
        asyncio.run(one.sync())
        cert_pem = data(api, "headroom-scheduler-client", "tls.crt")
        cert = x509.load_pem_x509_certificate(cert_pem)
        trusted = x509.load_pem_x509_certificates(served[-1].trust)
        [ca] = [c for c in trusted if c.subject == cert.issuer]
        cert.verify_directly_issued_by(ca)
        assert cert.not_valid_before_utc <= clock.at < cert.not_valid_after_utc
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
            "headroom-scheduler"
        )
        assert data(api, "headroom-scheduler-client", "ca.crt") == served[-1].trust
        issued.add(cert_pem)
    assert len(issued) >= 8


def test_a_replica_a_pass_behind_still_trusts_the_client_certificate() -> None:
    """Two replicas, the second syncing every other week only (its view of the CAs a
    pass behind): for two years, through two CA rotations, the Secret's client
    certificate is trusted by the CAs each of them serves with."""
    api, clock = TinyApi(), Clock()
    api._stored(CONFIGURATION, configuration())
    served: dict[str, list[Bundle]] = {"a": [], "b": []}

    def keeper_of(name: str) -> CertificateKeeper:
        async def serve(bundle: Bundle) -> None:
            served[name].append(bundle)

        target = CertificateTarget("ops", "headroom-webhook-cert", "headroom", POLICY, CLIENTS)
        return CertificateKeeper(api, target, serve, clock=clock, period=10)  # type: ignore[arg-type]

    a, b = keeper_of("a"), keeper_of("b")
    start, rotations, ca_file = clock.at, set(), set()
    for week in range(0, 115):
        clock.at = start + timedelta(weeks=week)
        asyncio.run(a.sync())
        if week % 2 == 0:
            asyncio.run(b.sync())
        now = set(x509.load_pem_x509_certificates(data(api, "headroom-scheduler-client", "ca.crt")))
        gone = [ca for ca in ca_file - now if ca.not_valid_after_utc > clock.at]
        assert not gone, f"week {week}: a live CA left ca.crt (the scheduler restarted back)"
        ca_file = now
        cert = x509.load_pem_x509_certificate(data(api, "headroom-scheduler-client", "tls.crt"))
        for name, bundles in served.items():
            trusted = x509.load_pem_x509_certificates(bundles[-1].trust)
            issuers = [ca for ca in trusted if ca.subject == cert.issuer]
            assert issuers, f"week {week}: replica {name} does not trust the client certificate"
            cert.verify_directly_issued_by(issuers[0])
        rotations.add(served["a"][-1].ca_cert)
    assert len(rotations) >= 3  # the first CA and at least two rotations


DEPLOYMENT = "/apis/apps/v1/namespaces/ops/deployments/headroom-scheduler"


def restarting(api: TinyApi, clock: Clock, configuration: str | None) -> CertificateKeeper:
    """A keeper that also keeps the client Secret and restarts the scheduler's Deployment."""
    clients = ClientCertificateTarget(
        "headroom-scheduler-client", "headroom-scheduler", timedelta(days=90), "headroom-scheduler"
    )
    target = CertificateTarget("ops", "headroom-webhook-cert", configuration, POLICY, clients)

    async def serve(bundle: Bundle) -> None:
        pass

    return CertificateKeeper(api, target, serve, clock=clock, period=10)  # type: ignore[arg-type]


def test_the_scheduler_is_restarted_once_whenever_the_cas_it_must_trust_change() -> None:
    """Weekly for two years: its pod template always carries the digest of the ca.crt
    in the Secret it mounts, and is patched only when that changes (rotations, an
    expired CA leaving, the first install), never twice for one change."""
    api, clock = TinyApi(), Clock()
    api._stored(CONFIGURATION, configuration())
    api._stored(DEPLOYMENT, {"metadata": {"name": "headroom-scheduler"}, "spec": {}})
    one = restarting(api, clock, "headroom")
    start, seen = clock.at, []
    for week in range(0, 115):
        clock.at = start + timedelta(weeks=week)
        asyncio.run(one.sync())
        trust = data(api, "headroom-scheduler-client", "ca.crt")
        annotations = api.objects[DEPLOYMENT]["spec"]["template"]["metadata"]["annotations"]
        assert annotations["headroom.dev/extender-ca"] == hashlib.sha256(trust).hexdigest()[:16]
        if not seen or seen[-1] != trust:
            seen.append(trust)
    restarts = [w for w in api.writes if w == f"merge {DEPLOYMENT}"]
    assert len(restarts) == len(seen)  # one per ca.crt the scheduler had to read again
    assert len(seen) >= 5  # the first, two rotations, and the old CAs leaving


def test_without_the_schedulers_deployment_nothing_is_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, clock = TinyApi(), Clock()
    one = restarting(api, clock, None)
    with caplog.at_level(logging.WARNING):
        asyncio.run(one.sync())  # a 404 for the Deployment: said, not an error
        asyncio.run(one.sync())
    assert not [w for w in api.writes if "deployments" in w]
    missing = [r for r in caplog.records if "not found" in r.getMessage()]
    assert len(missing) == 1  # once per ca.crt, not every pass
    assert "restarted by hand" in missing[0].getMessage()


def test_a_restart_refused_keeps_every_certificate_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, clock = TinyApi(), Clock()
    api._stored(DEPLOYMENT, {"metadata": {"name": "headroom-scheduler"}, "spec": {}})

    async def forbidden(path: str, patch: JSON) -> JSON:
        raise ApiError(403, "Forbidden", "deployments is forbidden")

    api.merge_patch = forbidden  # type: ignore[method-assign]
    one = restarting(api, clock, None)
    with caplog.at_level(logging.WARNING):
        asyncio.run(one.sync())  # no exception: the certificates are kept
    assert f"{SECRETS}/headroom-scheduler-client" in api.objects
    [said] = [r.getMessage() for r in caplog.records if "not restarted" in r.getMessage()]
    assert "403 Forbidden" in said
