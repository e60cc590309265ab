"""The webhook certificates: issued for the Service's names, renewed in time, rotated safely."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

from cryptography import x509

from headroom.objects.certificates import (
    Bundle,
    CertificatePolicy,
    bundle_from_secret,
    ca_bundle_patch,
    fresh,
    published_bundle,
    renewal,
    secret_body,
    service_names,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NAMES = service_names("headroom-webhook", "headroom-system", ("127.0.0.1",))
POLICY = CertificatePolicy(NAMES, ca_validity=timedelta(days=365), validity=timedelta(days=90))


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def sans(pem: bytes) -> set[str]:
    ext = cert(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in ext.get_values_for_type(x509.IPAddress)} | set(
        ext.get_values_for_type(x509.DNSName)
    )


def trusted_by(leaf: bytes, trust: bytes) -> bool:
    for ca in x509.load_pem_x509_certificates(trust):
        try:
            cert(leaf).verify_directly_issued_by(ca)
            return True
        except Exception:
            continue
    return False


def test_service_names_are_what_the_api_server_dials() -> None:
    assert service_names("svc", "ns") == (
        "svc",
        "svc.ns",
        "svc.ns.svc",
        "svc.ns.svc.cluster.local",
    )


def test_a_fresh_bundle_is_a_ca_and_a_serving_certificate_for_every_name() -> None:
    bundle = fresh(POLICY, T0)
    assert sans(bundle.cert) == set(NAMES)
    assert trusted_by(bundle.cert, bundle.trust)
    assert bundle.trust == bundle.ca_cert
    ca = cert(bundle.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert(bundle.cert).not_valid_after_utc == T0 + timedelta(days=90)
    assert renewal(bundle, POLICY, T0) is None


def test_the_serving_certificate_is_renewed_in_its_last_third_by_the_same_ca() -> None:
    bundle = fresh(POLICY, T0)
    # Lifetime is 90 days + 5 minutes of backdating: renewal starts just after day 60.
    assert renewal(bundle, POLICY, T0 + timedelta(days=59)) is None
    plan = renewal(bundle, POLICY, T0 + timedelta(days=61))
    assert plan is not None
    renewed, reason = plan
    assert "last third" in reason
    assert renewed.ca_cert == bundle.ca_cert
    assert renewed.trust == bundle.trust
    assert renewed.cert != bundle.cert
    assert renewed.key != bundle.key
    assert trusted_by(renewed.cert, bundle.trust)


def test_a_changed_service_name_reissues_the_serving_certificate() -> None:
    bundle = fresh(POLICY, T0)
    moved = CertificatePolicy(service_names("other", "ns"), POLICY.ca_validity, POLICY.validity)
    plan = renewal(bundle, moved, T0 + timedelta(hours=1))
    assert plan is not None
    assert sans(plan[0].cert) == set(moved.names)
    assert plan[0].ca_cert == bundle.ca_cert


def test_a_ca_rotation_never_serves_a_certificate_the_api_server_does_not_trust() -> None:
    bundle = fresh(POLICY, T0)
    published = bundle.trust
    late = T0 + timedelta(days=250)  # the CA is in its last third
    # Keep the serving certificate valid meanwhile (as renewals would have).
    bundle = _with_cert(bundle, renewal(bundle, POLICY, T0 + timedelta(days=200)))
    plan = renewal(bundle, POLICY, late, published)
    assert plan is not None
    rotated, reason = plan
    assert "CA" in reason
    assert rotated.ca_cert != bundle.ca_cert
    assert rotated.cert == bundle.cert  # still the old CA's: the new one is not published
    trust = x509.load_pem_x509_certificates(rotated.trust)
    assert [c.subject for c in trust] == [
        cert(rotated.ca_cert).subject,
        cert(bundle.ca_cert).subject,
    ]
    # Until the new CA is published, the old serving certificate stays.
    assert renewal(rotated, POLICY, late, published) is None
    # Published: the serving certificate comes from the new CA, and both stay trusted.
    plan = renewal(rotated, POLICY, late, rotated.trust)
    assert plan is not None
    final = plan[0]
    assert trusted_by(final.cert, rotated.trust)
    assert cert(final.cert).issuer == cert(rotated.ca_cert).subject
    # Once the old CA expires it leaves the bundle.
    after = T0 + timedelta(days=366)
    pruned = renewal(final, POLICY, after, final.trust)
    assert pruned is not None
    assert len(x509.load_pem_x509_certificates(pruned[0].trust)) == 1


def _with_cert(bundle: Bundle, plan: tuple[Bundle, str] | None) -> Bundle:
    assert plan is not None
    return plan[0]


def test_an_unreadable_bundle_is_replaced() -> None:
    garbage = Bundle(b"x", b"y", b"z", b"w", b"v")
    plan = renewal(garbage, POLICY, T0)
    assert plan is not None
    assert "cannot be read" in plan[1]
    assert renewal(None, POLICY, T0) is not None


def test_the_secret_round_trips() -> None:
    bundle = fresh(POLICY, T0)
    body = secret_body("headroom-webhook-cert", bundle)
    assert body["type"] == "kubernetes.io/tls"
    assert body["metadata"] == {"name": "headroom-webhook-cert"}
    assert set(body["data"]) == {"ca.crt", "ca.key", "tls.crt", "tls.key", "ca-bundle.crt"}
    assert bundle_from_secret(body) == bundle
    assert bundle_from_secret({"data": {"tls.crt": "!!"}}) is None
    assert bundle_from_secret(None) is None
    assert bundle_from_secret({"data": {**body["data"], "tls.key": "not base64!"}}) is None


def test_the_ca_bundle_is_patched_only_where_it_differs() -> None:
    trust = fresh(POLICY, T0).trust
    wanted = base64.b64encode(trust).decode()
    configuration = {
        "metadata": {"resourceVersion": "7"},
        "webhooks": [
            {"name": "a", "clientConfig": {"caBundle": wanted}},
            {"name": "b", "clientConfig": {"url": "https://x"}},
            {"name": "c", "clientConfig": {"caBundle": "b2xk"}},
        ],
    }
    assert ca_bundle_patch(configuration, trust) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": wanted},
        {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": wanted},
    ]
    for webhook in configuration["webhooks"]:
        webhook["clientConfig"]["caBundle"] = wanted
    assert ca_bundle_patch(configuration, trust) == []
    assert published_bundle(configuration) == trust * 3
    assert published_bundle({"webhooks": [{"clientConfig": {"caBundle": "%%"}}]}) == b""


def test_a_ca_key_that_cannot_sign_for_its_certificate_gets_a_fresh_bundle() -> None:
    """Caught at once, not at the next serving renewal months later (the client
    certificate for the extender is issued from it every period)."""
    bundle = fresh(POLICY, T0)
    other = fresh(POLICY, T0)
    for key in (other.ca_key, b"not a key"):
        broken = Bundle(bundle.ca_cert, key, bundle.cert, bundle.key, bundle.trust)
        plan = renewal(broken, POLICY, T0)
        assert plan is not None
        assert plan[1] == "the stored CA key cannot sign for its certificate"
        assert plan[0].ca_cert != bundle.ca_cert
    assert renewal(bundle, POLICY, T0) is None
