"""The scheduler's client certificate for the extender (pure): when it is issued again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from headroom.objects.certificates import Bundle, CertificatePolicy, fresh, renewal
from headroom.objects.clientcerts import (
    ClientPair,
    client_from_secret,
    client_renewal,
    client_secret_body,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = CertificatePolicy(("headroom-webhook.ops.svc",), timedelta(days=365), timedelta(days=90))
NAME, VALIDITY = "headroom-scheduler", timedelta(days=90)


def first(bundle: Bundle) -> ClientPair:
    plan = client_renewal(None, bundle, NAME, T0, VALIDITY)
    assert plan is not None
    assert plan.reason == "no client certificate yet"
    assert not plan.new_ca
    return plan.pair


def test_a_new_client_certificate_is_for_client_auth_only_by_the_current_ca() -> None:
    bundle = fresh(POLICY, T0)
    pair = first(bundle)
    cert = x509.load_pem_x509_certificate(pair.cert)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(bundle.ca_cert))
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == NAME
    assert pair.trust == bundle.trust
    assert client_renewal(pair, bundle, NAME, T0 + timedelta(days=59), VALIDITY) is None


def test_it_is_issued_again_late_for_another_name_by_another_ca_or_unreadable() -> None:
    bundle = fresh(POLICY, T0)
    pair = first(bundle)
    late = client_renewal(pair, bundle, NAME, T0 + timedelta(days=61), VALIDITY)
    assert late is not None
    assert "last third" in late.reason
    renamed = client_renewal(pair, bundle, "someone-else", T0, VALIDITY)
    assert renamed is not None
    assert "not for someone-else" in renamed.reason
    other = client_renewal(pair, fresh(POLICY, T0), NAME, T0, VALIDITY)
    assert other is not None
    assert "not signed by a trusted CA" in other.reason
    garbage = client_renewal(ClientPair(b"x", b"y", b"z"), bundle, NAME, T0, VALIDITY)
    assert garbage is not None
    assert "cannot be read" in garbage.reason


def test_a_ca_rotation_keeps_the_pair_trusts_both_cas_and_says_so() -> None:
    """The old CA's certificate is kept (every replica trusts it, whether it has read the
    rotation yet or not) until its last third, then issued by the new CA."""
    bundle = fresh(POLICY, T0)
    at = T0 + timedelta(days=250)  # the CA is in its last third
    renewed = client_renewal(first(bundle), bundle, NAME, at - timedelta(days=30), VALIDITY)
    assert renewed is not None  # the first one is late by then
    pair = renewed.pair
    rotation = renewal(bundle, POLICY, at)
    assert rotation is not None
    rotated = rotation[0]
    again = client_renewal(pair, rotated, NAME, at, VALIDITY)
    assert again is not None
    assert again.reason == "a new CA is trusted"
    assert again.new_ca
    assert (again.pair.cert, again.pair.key) == (pair.cert, pair.key)
    assert len(x509.load_pem_x509_certificates(again.pair.trust)) == 2
    later = client_renewal(again.pair, rotated, NAME, at + timedelta(days=40), VALIDITY)
    assert later is not None
    assert "last third" in later.reason
    assert not later.new_ca
    cert = x509.load_pem_x509_certificate(later.pair.cert)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(rotated.ca_cert))


def test_only_the_trusted_cas_changed_keeps_the_pair() -> None:
    bundle = fresh(POLICY, T0)
    issued = first(bundle)
    pair = ClientPair(issued.cert, issued.key, b"an older bundle")
    kept = client_renewal(pair, bundle, NAME, T0, VALIDITY)
    assert kept is not None
    assert kept.reason == "a new CA is trusted"
    assert (kept.pair.cert, kept.pair.key, kept.pair.trust) == (pair.cert, pair.key, bundle.trust)


def test_the_client_secret_round_trips() -> None:
    bundle = fresh(POLICY, T0)
    pair = first(bundle)
    body = client_secret_body("headroom-scheduler-client", pair)
    assert body["type"] == "kubernetes.io/tls"
    assert set(body["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert client_from_secret(body) == pair
    assert client_from_secret({"data": {"tls.crt": "!!"}}) is None
    assert client_from_secret(None) is None


def test_a_replica_a_pass_behind_a_rotation_never_takes_the_new_ca_out() -> None:
    """Its bundle still trusts only the old CA; ca.crt, written by the replica that
    rotated, trusts both: nothing to write (rolling the scheduler back and forth)."""
    at = T0 + timedelta(days=250)  # the CA is in its last third
    bundle = fresh(POLICY, T0)
    renewed = client_renewal(first(bundle), bundle, NAME, at - timedelta(days=30), VALIDITY)
    assert renewed is not None
    rotation = renewal(bundle, POLICY, at)
    assert rotation is not None
    written = client_renewal(renewed.pair, rotation[0], NAME, at, VALIDITY)
    assert written is not None
    assert client_renewal(written.pair, bundle, NAME, at, VALIDITY) is None  # the stale view


def test_only_an_expired_ca_leaves_the_ca_file() -> None:
    old = fresh(POLICY, T0)
    at = T0 + timedelta(days=250)
    rotation = renewal(old, POLICY, at)
    assert rotation is not None
    rotated = rotation[0]
    expired = T0 + timedelta(days=366)  # the old CA is gone by then
    issued = client_renewal(None, rotated, NAME, expired - timedelta(days=10), VALIDITY)
    assert issued is not None
    pair = issued.pair
    assert len(x509.load_pem_x509_certificates(pair.trust)) == 2
    pruned = renewal(rotated, POLICY, expired)
    assert pruned is not None
    left = client_renewal(pair, pruned[0], NAME, expired, VALIDITY)
    assert left is not None
    assert left.reason == "an expired CA is no longer trusted"
    assert (left.pair.cert, left.new_ca) == (pair.cert, False)
    assert x509.load_pem_x509_certificates(left.pair.trust) == [
        x509.load_pem_x509_certificate(rotated.ca_cert)
    ]
