"""The decision key: read (or create) its Secret, and finish adopting older statuses.

Why adoption exists, and why it is safe, is said in ``headroom.objects.stamp``.
"""

from __future__ import annotations

import base64
import logging
import secrets

from headroom.api.paths import resource_path
from headroom.kube.transport import ApiError, Transport
from headroom.objects.stamp import ADOPTED_ANNOTATION, KEY_FIELD, DecisionKey

log = logging.getLogger(__name__)


async def load_key(transport: Transport, namespace: str, name: str) -> DecisionKey:
    """The key from Secret ``namespace/name``, created with 32 random bytes if absent."""
    path = resource_path("", "v1", "secrets", namespace)
    for _ in range(3):
        try:
            secret = await transport.get(f"{path}/{name}")
            annotations = (secret.get("metadata") or {}).get("annotations") or {}
            # A Secret from before adoption existed carries no mark: its key is established.
            adopting = annotations.get(ADOPTED_ANNOTATION) == "false"
            return DecisionKey(base64.b64decode(secret["data"][KEY_FIELD]), adopting)
        except ApiError as error:
            if not error.not_found:
                raise
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "annotations": {ADOPTED_ANNOTATION: "false"}},
            "type": "Opaque",
            "data": {KEY_FIELD: base64.b64encode(secrets.token_bytes(32)).decode()},
        }
        try:
            await transport.create(path, body)
            log.warning(
                "created decision key Secret %s/%s: statuses stamped before it will be "
                "adopted and stamped again",
                namespace,
                name,
            )
        except ApiError as error:
            if not error.conflict:  # 409: another replica created it first; read that one
                raise
    raise RuntimeError(f"decision key Secret {namespace}/{name} could not be read or created")


async def mark_adopted(transport: Transport, namespace: str, secret: str) -> None:
    """Every status carries a stamp of this key now: unverifiable ones are distrusted again."""
    path = resource_path("", "v1", "secrets", namespace, secret)
    await transport.merge_patch(path, {"metadata": {"annotations": {ADOPTED_ANNOTATION: "true"}}})
