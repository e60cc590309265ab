"""The webhook's certificates: what to issue, when to renew, and how they sit in a Secret.

Why the operator manages them (as Kueue's cert rotator does) instead of the chart
(``genCA`` in a template): a chart generates a new CA on every ``helm upgrade``
(or must look up the old one, which ``helm template`` and GitOps tools cannot),
and nothing renews what it generated before it expires. Here one CA and one
serving certificate live in a Secret shared by every replica; any replica may
create it (the API server's create is the tie-break) and renew it (the Secret's
resourceVersion is the tie-break), and every replica serves what is in it.

Renewal, with no moment where the API server distrusts what is served:

- the serving certificate is issued again, by the same CA, once less than a third
  of its lifetime is left, or when it no longer names the Service (config changed);
- the CA is replaced once less than a third of *its* lifetime is left. The new CA
  joins the trust bundle (``ca-bundle.crt``, the webhook configuration's
  ``caBundle``) next to the old one, while the old serving certificate stays in
  use; the serving certificate is issued by the new CA only once the published
  ``caBundle`` trusts it. CAs that have expired leave the bundle.

Pure: no I/O. ``now`` is always given, so tests can travel in time.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, TRUST = (
    "ca.crt",
    "ca.key",
    "tls.crt",
    "tls.key",
    "ca-bundle.crt",
)
#: Renew when less than this fraction of a certificate's lifetime is left.
RENEW_FRACTION = 3
#: Clocks of the replicas and the API server may differ by this much.
_BACKDATE = timedelta(minutes=5)


class CertificateError(ValueError):
    """A Secret whose certificates cannot be read; it is replaced by a new one."""


@dataclass(frozen=True, slots=True)
class CertificatePolicy:
    """Who the serving certificate is for, and for how long certificates live."""

    names: tuple[str, ...]  # DNS names and IP addresses, the first one is the CN
    ca_validity: timedelta
    validity: timedelta


@dataclass(frozen=True, slots=True)
class Bundle:
    """The CA that signs, the serving pair, and the CAs the API server must trust (PEM)."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes
    trust: bytes


def service_names(service: str, namespace: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The names a Service is reached by, as the API server's service resolver uses them."""
    base = (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )
    return tuple(dict.fromkeys((*base, *extra)))


# -- issuing ----------------------------------------------------------------------------------


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=ca,
        crl_sign=ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(now: datetime, validity: timedelta) -> tuple[bytes, bytes]:
    """A self-signed CA: (certificate PEM, key PEM)."""
    key = _new_key()
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"headroom-webhook-ca@{int(now.timestamp())}")]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    names: tuple[str, ...],
    now: datetime,
    validity: timedelta,
    *,
    client: bool = False,
) -> tuple[bytes, bytes]:
    """A serving certificate for ``names`` signed by the CA: (certificate PEM, key PEM).
    ``client``: a client certificate for ``names[0]`` instead (``clientAuth``, no SAN)."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertificateError("ca.key: not an EC private key")
    key = _new_key()
    not_after = min(now + validity, ca_cert.not_valid_after_utc)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if not client:
        sans = x509.SubjectAlternativeName([_san(n) for n in names])
        builder = builder.add_extension(sans, critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def fresh(policy: CertificatePolicy, now: datetime) -> Bundle:
    """A new CA and a serving certificate it signed."""
    ca_cert, ca_key = new_ca(now, policy.ca_validity)
    cert, key = issue(ca_cert, ca_key, policy.names, now, policy.validity)
    return Bundle(ca_cert, ca_key, cert, key, ca_cert)


# -- renewing ---------------------------------------------------------------------------------


def late(cert: x509.Certificate, now: datetime) -> bool:
    """Less than a third of its lifetime left (or already expired)."""
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now < lifetime / RENEW_FRACTION


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _names(cert: x509.Certificate) -> set[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    return ips | set(sans.get_values_for_type(x509.DNSName))


def _trusted(pems: bytes, now: datetime) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(pems)
    except ValueError:
        return []
    return [c for c in certs if c.not_valid_after_utc > now]


def _pem(certs: list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def renewal(
    current: Bundle | None,
    policy: CertificatePolicy,
    now: datetime,
    published: bytes | None = None,
) -> tuple[Bundle, str] | None:
    """The bundle to write instead of ``current`` and why, or None while it is good.

    ``published`` is the ``caBundle`` the API server uses now (None: nothing is
    published, so nothing to wait for). Raises nothing for a bad ``current``: a
    bundle that cannot be read is replaced.
    """
    if current is None:
        return fresh(policy, now), "no certificate yet"
    try:
        ca = x509.load_pem_x509_certificate(current.ca_cert)
        cert = x509.load_pem_x509_certificate(current.cert)
    except ValueError:
        return fresh(policy, now), "the stored certificates cannot be read"
    if not _ca_key_matches(current.ca_key, ca):
        return fresh(policy, now), "the stored CA key cannot sign for its certificate"
    trust = [c for c in _trusted(current.trust, now) if c != ca]
    if late(ca, now):
        ca_cert, ca_key = new_ca(now, policy.ca_validity)
        bundle = x509.load_pem_x509_certificate(ca_cert)
        keep = [c for c in (ca, *trust) if c.not_valid_after_utc > now]
        # The old serving pair stays until the API server trusts the new CA.
        return Bundle(
            ca_cert, ca_key, current.cert, current.key, _pem([bundle, *keep])
        ), "the CA is in the last third of its lifetime"
    reason = _serving_problem(cert, ca, policy, now)
    pruned = _pem([ca, *trust])
    if reason is None:
        if pruned != current.trust:
            return Bundle(
                current.ca_cert, current.ca_key, current.cert, current.key, pruned
            ), "an expired CA leaves the trust bundle"
        return None
    if published is not None and not signed_by(cert, ca) and not _publishes(published, ca, now):
        return None  # the new CA is not trusted yet: keep serving the old certificate
    try:
        cert_pem, key_pem = issue(
            current.ca_cert, current.ca_key, policy.names, now, policy.validity
        )
    except (ValueError, TypeError, CertificateError):
        return fresh(policy, now), "the stored CA key cannot be used"
    return Bundle(current.ca_cert, current.ca_key, cert_pem, key_pem, pruned), reason


def _ca_key_matches(key_pem: bytes, ca: x509.Certificate) -> bool:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    return isinstance(key, ec.EllipticCurvePrivateKey) and key.public_key() == ca.public_key()


def _serving_problem(
    cert: x509.Certificate, ca: x509.Certificate, policy: CertificatePolicy, now: datetime
) -> str | None:
    if not signed_by(cert, ca):
        return "the serving certificate is not signed by the current CA"
    if not set(policy.names) <= _names(cert):
        return "the serving certificate does not name every Service name"
    if late(cert, now):
        return "the serving certificate is in the last third of its lifetime"
    return None


def _publishes(published: bytes, ca: x509.Certificate, now: datetime) -> bool:
    return any(c == ca for c in _trusted(published, now))


def not_after(cert_pem: bytes) -> datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


# -- the Secret -------------------------------------------------------------------------------


def secret_body(name: str, bundle: Bundle) -> dict[str, Any]:
    """The Secret that holds ``bundle`` (``kubernetes.io/tls``, plus the CA and the bundle)."""
    values = {
        CA_CERT: bundle.ca_cert,
        CA_KEY: bundle.ca_key,
        TLS_CERT: bundle.cert,
        TLS_KEY: bundle.key,
        TRUST: bundle.trust,
    }
    return tls_secret(name, values)


def tls_secret(name: str, values: dict[str, bytes]) -> dict[str, Any]:
    """A ``kubernetes.io/tls`` Secret holding ``values`` (each base64 in ``data``)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "kubernetes.io/tls",
        "data": {k: base64.b64encode(v).decode() for k, v in values.items()},
    }


def bundle_from_secret(secret: Any) -> Bundle | None:
    """The bundle in a Secret; None if it holds none (absent keys, not base64)."""
    data = (secret or {}).get("data") if isinstance(secret, dict) else None
    if not isinstance(data, dict):
        return None
    try:
        values = {
            k: base64.b64decode(data[k], validate=True)
            for k in (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY)
        }
        trust = base64.b64decode(data.get(TRUST) or data[CA_CERT], validate=True)
    except (KeyError, TypeError, binascii.Error):
        return None
    return Bundle(values[CA_CERT], values[CA_KEY], values[TLS_CERT], values[TLS_KEY], trust)


# -- the webhook configuration ----------------------------------------------------------------


def published_bundle(configuration: Any) -> bytes:
    """The caBundles of a MutatingWebhookConfiguration's webhooks, concatenated (PEM)."""
    webhooks = (configuration or {}).get("webhooks") or []
    found = b""
    for webhook in webhooks if isinstance(webhooks, list) else []:
        raw = ((webhook or {}).get("clientConfig") or {}).get("caBundle") or ""
        try:
            found += base64.b64decode(raw, validate=True)
        except (TypeError, binascii.Error):
            continue
    return found


def ca_bundle_patch(configuration: dict[str, Any], trust: bytes) -> list[dict[str, Any]]:
    """JSON patch that sets ``caBundle`` on every webhook whose bundle differs (empty if
    none does); it fails with 422 if the configuration moved since it was read."""
    wanted = base64.b64encode(trust).decode()
    operations: list[dict[str, Any]] = []
    for index, webhook in enumerate(configuration.get("webhooks") or []):
        client = (webhook or {}).get("clientConfig")
        if not isinstance(client, dict) or client.get("caBundle") == wanted:
            continue
        operations.append(
            {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": wanted}
        )
    if not operations:
        return []
    version = (configuration.get("metadata") or {}).get("resourceVersion", "")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *operations]
