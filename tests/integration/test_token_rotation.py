"""A service-account token from a file is read again, as the kubelet rotates it.

A pod's projected token lives an hour at most, and is revoked once the object it is
bound to goes. Here, on the real API server, two tokens of one ServiceAccount are
requested (TokenRequest); the file holds the first, then the second. The API server
says which token each request carried (``credential-id``, the token's ``jti``): the
operator's client moves to the second within its period, and kopf's next login reads
it too; a client given the first as a string keeps sending the first.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from pathlib import Path

from kubernetes import client

from headroom.handlers.wiring import connection_info
from headroom.kube.client import Credentials, KubeClient
from headroom_dev.controlplane import ControlPlane

REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
BODY = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


def token_of(core: client.CoreV1Api, namespace: str, account: str) -> str:
    request = {"spec": {"audiences": [], "expirationSeconds": 600}}
    answer = core.create_namespaced_service_account_token(account, namespace, request)
    token: str = answer.status.token
    return token


def jti(token: str) -> str:
    """The token's own id, from its JWT claims (what the API server names it by)."""
    claims = token.split(".")[1]
    payload = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    return f"JTI={payload['jti']}"


async def sent(kube: KubeClient) -> tuple[str, str]:
    """Who the API server took the request for, and which token it carried."""
    info = (await kube.create(REVIEW, BODY))["status"]["userInfo"]
    [credential] = info["extra"][CREDENTIAL_ID]
    return info["username"], credential


async def test_a_token_file_rotated_under_the_client_is_read_again(
    control_plane: ControlPlane, core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    account = f"rotated-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    first, second = token_of(core, namespace, account), token_of(core, namespace, account)
    user = f"system:serviceaccount:{namespace}:{account}"
    token_file = tmp_path / "token"
    token_file.write_text(first + "\n")
    credentials = Credentials(
        server=control_plane.url,
        ca_file=str(control_plane.pki / "ca.crt"),
        token=f"Bearer {first}",
        token_file=str(token_file),
    )
    rereads = KubeClient(credentials, token_period=0.2)
    kept = Credentials(credentials.server, credentials.ca_file, token=f"Bearer {first}")
    keeps = KubeClient(kept)
    try:
        assert await sent(rereads) == (user, jti(first))
        token_file.write_text(second + "\n")  # the kubelet's rotation
        await asyncio.sleep(0.3)
        assert await sent(rereads) == (user, jti(second))
        assert await sent(keeps) == (user, jti(first))
        assert (await connection_info(credentials)).token == second  # kopf's next login
    finally:
        await rereads.close()
        await keeps.close()
