"""The scheduler's client certificate for the extender: what to issue, when, and its Secret.

kube-scheduler's extender calls carry no token (its ``tlsConfig`` has only certificate
files), and ``/bind`` binds a claim pod to any node where the ledger has room, past the
scheduler's predicates. So the extender accepts only callers that present a client
certificate issued by the operator's own CA (the webhook's, :mod:`.certificates`), with
the ``clientAuth`` usage: the webhook's serving certificate, signed by the same CA, is
not one. The operator writes that certificate into a Secret of its own, which the
scheduler mounts; the CA's key never leaves the webhook's Secret.

Renewal without a restart: kube-scheduler's client (client-go ``TLSConfigFor``) reads
its client certificate files again when they change, and the kubelet updates a mounted
Secret in place. The ``ca.crt`` it checks the extender's certificate with is read once
at its start, so when that changes (a CA rotation, once every ``caValidity``, and the
old CA's expiry) the operator restarts the scheduler's Deployment: a pod-template
annotation, :func:`restart_patch`, that follows ``ca.crt`` (until then its calls fail
and pods wait; none is bound unaccounted).

Pure: no I/O; ``now`` is always given.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from headroom.objects.certificates import (
    CA_CERT,
    TLS_CERT,
    TLS_KEY,
    Bundle,
    CertificateError,
    issue,
    late,
    signed_by,
    tls_secret,
)


@dataclass(frozen=True, slots=True)
class ClientPair:
    """A client certificate and key, and the CAs its holder checks the server with (PEM)."""

    cert: bytes
    key: bytes
    trust: bytes


@dataclass(frozen=True, slots=True)
class ClientRenewal:
    """The pair to write and why; ``new_ca``: its ``ca.crt`` trusts a CA the one it
    replaces did not (a CA rotation), which a running scheduler sees only when
    restarted."""

    pair: ClientPair
    reason: str
    new_ca: bool = False


def client_renewal(
    current: ClientPair | None, bundle: Bundle, name: str, now: datetime, validity: timedelta
) -> ClientRenewal | None:
    """What to write instead of ``current``, or None while it is good.

    A certificate from any live CA of the bundle's trust is kept until its last third:
    after a CA rotation every replica's extender still trusts it, whichever of them has
    read the rotation yet, and the one issued next (by the new CA) comes months later,
    when all of them trust that CA. ``ca.crt`` is the bundle's trust, so that a
    scheduler started after a CA rotation trusts the serving certificate of either CA.
    """
    trust = _trust_for(bundle.trust, current, now)
    reason = _client_problem(current, bundle, name, now)
    if reason is None:
        assert current is not None
        if current.trust == trust or _cas(current.trust) == _cas(trust) != set():
            return None  # the same CAs (in another order: a replica a pass behind)
        new_ca = bool(_cas(trust) - _cas(current.trust))
        why = "a new CA is trusted" if new_ca else "an expired CA is no longer trusted"
        return ClientRenewal(ClientPair(current.cert, current.key, trust), why, new_ca)
    try:
        cert, key = issue(bundle.ca_cert, bundle.ca_key, (name,), now, validity, client=True)
    except (ValueError, TypeError, CertificateError) as error:
        raise CertificateError(f"the CA cannot issue the client certificate: {error}") from error
    new_ca = current is not None and bool(_cas(trust) - _cas(current.trust))
    return ClientRenewal(ClientPair(cert, key, trust), reason, new_ca)


def _trust_for(bundle_trust: bytes, current: ClientPair | None, now: datetime) -> bytes:
    """The bundle's CAs, and any live CA the written ``ca.crt`` has that they lack: a
    replica whose view is a pass behind a CA rotation never takes the new CA out of it
    (which would roll the scheduler back to a CA about to be replaced). Only an
    expired CA leaves."""
    if current is None:
        return bundle_trust
    ours = _cas(bundle_trust)
    kept = [ca for ca in _listed(current.trust) if ca not in ours and ca.not_valid_after_utc > now]
    return bundle_trust + b"".join(ca.public_bytes(serialization.Encoding.PEM) for ca in kept)


def _listed(pems: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pems)
    except ValueError:
        return []


def _cas(pems: bytes) -> set[x509.Certificate]:
    return set(_listed(pems))


def _client_problem(
    current: ClientPair | None, bundle: Bundle, name: str, now: datetime
) -> str | None:
    if current is None:
        return "no client certificate yet"
    try:
        cert = x509.load_pem_x509_certificate(current.cert)
    except ValueError:
        return "the stored client certificate cannot be read"
    live = [ca for ca in _cas(bundle.trust) if ca.not_valid_after_utc > now]
    if not any(signed_by(cert, ca) for ca in live):
        return "the client certificate is not signed by a trusted CA"
    if cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME) != [
        x509.NameAttribute(NameOID.COMMON_NAME, name)
    ]:
        return f"the client certificate is not for {name}"
    if late(cert, now):
        return "the client certificate is in the last third of its lifetime"
    return None


def client_secret_body(name: str, pair: ClientPair) -> dict[str, Any]:
    """The Secret the scheduler mounts: ``tls.crt``, ``tls.key`` and ``ca.crt``."""
    return tls_secret(name, {TLS_CERT: pair.cert, TLS_KEY: pair.key, CA_CERT: pair.trust})


def client_from_secret(secret: Any) -> ClientPair | None:
    """The pair in a Secret; None if it holds none (absent keys, not base64)."""
    data = (secret or {}).get("data") if isinstance(secret, dict) else None
    if not isinstance(data, dict):
        return None
    try:
        cert, key, trust = (
            base64.b64decode(data[k], validate=True) for k in (TLS_CERT, TLS_KEY, CA_CERT)
        )
    except (KeyError, TypeError, binascii.Error):
        return None
    return ClientPair(cert, key, trust)


#: The scheduler's pod-template annotation that follows its ``ca.crt``: a change rolls it.
TRUST_ANNOTATION = "headroom.dev/extender-ca"


def trust_digest(trust: bytes) -> str:
    return hashlib.sha256(trust).hexdigest()[:16]


def restart_patch(deployment: Any, trust: bytes) -> dict[str, Any] | None:
    """The merge patch that restarts ``deployment`` (its pods read ``trust`` at start), or
    None if its pods were started with it already."""
    template = ((deployment or {}).get("spec") or {}).get("template") or {}
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    wanted = trust_digest(trust)
    if annotations.get(TRUST_ANNOTATION) == wanted:
        return None
    return {"spec": {"template": {"metadata": {"annotations": {TRUST_ANNOTATION: wanted}}}}}
