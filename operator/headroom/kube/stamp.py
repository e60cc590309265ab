"""Decision stamps: the operator trusts on rebuild only the statuses it wrote.

RBAC already keeps tenants away from ``reservations/status``; the stamp covers
everyone else who could write a status (a broad admin role, a misconfigured
controller). Each decision's status carries ``decisionStamp`` = HMAC-SHA256 over
the object's uid, the decision's id and its phase, keyed by a secret that only
the operator reads (a Secret in its own namespace, created on first start).
Forging a stamp requires reading that Secret, i.e. already being an admin of the
operator's namespace; copying a stamp from another object fails because the uid
differs. A status without a valid stamp is ignored and the reservation decided
again, with an ``UntrustedStatus`` Warning Event.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets

from headroom.kube.client import JSON, ApiError, KubeClient, resource_path

log = logging.getLogger(__name__)
KEY_FIELD = "decision-key"


class Stamper:
    """Signs and checks decision stamps; with no key, stamps nothing and trusts RBAC."""

    def __init__(self, key: bytes | None) -> None:
        self._key = key

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def sign(self, uid: str, decision_id: str, phase: str) -> str | None:
        if self._key is None:
            return None
        message = f"{uid}|{decision_id}|{phase}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:40]

    def trusted(self, obj: JSON) -> bool:
        """Whether the object's status was written by an operator holding the key."""
        if self._key is None:
            return True
        status = obj.get("status") or {}
        expected = self.sign(
            (obj.get("metadata") or {}).get("uid", ""),
            str(status.get("decisionID", "")),
            str(status.get("phase", "")),
        )
        return hmac.compare_digest(expected or "", str(status.get("decisionStamp", "")))


async def load_key(client: KubeClient, namespace: str, name: str) -> bytes:
    """The key from Secret ``namespace/name``, created with 32 random bytes if absent."""
    path = resource_path("", "v1", "secrets", namespace)
    for _ in range(3):
        try:
            secret = await client.get(f"{path}/{name}")
            return base64.b64decode(secret["data"][KEY_FIELD])
        except ApiError as error:
            if not error.not_found:
                raise
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "type": "Opaque",
            "data": {KEY_FIELD: base64.b64encode(secrets.token_bytes(32)).decode()},
        }
        try:
            await client.create(path, body)
            log.info("created decision key Secret %s/%s", namespace, name)
        except ApiError as error:
            if not error.conflict:  # 409: another replica created it first; read that one
                raise
    raise RuntimeError(f"decision key Secret {namespace}/{name} could not be read or created")
