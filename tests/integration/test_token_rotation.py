"""A service-account token from a file is read again, as the kubelet rotates it.

A pod's projected token lives an hour at most, and is revoked once the object it is
bound to goes. Here, on the real API server, two tokens of one ServiceAccount are each
bound to a Secret of their own (TokenRequest ``boundObjectRef``): the file holds the
first, then the second, and the first Secret is deleted, which revokes the first token
at once, as a rotation followed by its expiry would. The operator's client (and kopf's
login, which reads the same file) goes on with the second; a client that kept the
first is refused.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from headroom.handlers.wiring import connection_info
from headroom.kube.client import Credentials, KubeClient
from headroom.kube.transport import ApiError
from headroom_dev.controlplane import ControlPlane

REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
BODY = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
#: kube-apiserver caches a token's authentication this long (its token cache's TTL).
CACHED = 10


def bound_token(core: client.CoreV1Api, namespace: str, account: str, secret: str) -> str:
    made = core.create_namespaced_secret(namespace, {"metadata": {"name": secret}})
    request = {
        "spec": {
            "audiences": [],
            "expirationSeconds": 600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Secret",
                "name": secret,
                "uid": made.metadata.uid,
            },
        }
    }
    answer = core.create_namespaced_service_account_token(account, namespace, request)
    token: str = answer.status.token
    return token


async def who(kube: KubeClient) -> str:
    review = await kube.create(REVIEW, BODY)
    name: str = review["status"]["userInfo"]["username"]
    return name


async def test_a_token_file_rotated_under_the_client_is_read_again(
    control_plane: ControlPlane, core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    account = f"rotated-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    first = bound_token(core, namespace, account, f"{account}-first")
    second = bound_token(core, namespace, account, f"{account}-second")
    token_file = tmp_path / "token"
    token_file.write_text(first + "\n")
    credentials = Credentials(
        server=control_plane.url,
        ca_file=str(control_plane.pki / "ca.crt"),
        token=f"Bearer {first}",
        token_file=str(token_file),
    )
    rereads = KubeClient(credentials, token_period=0.2)
    keeps = KubeClient(
        Credentials(credentials.server, credentials.ca_file, token=f"Bearer {first}")
    )
    try:
        user = f"system:serviceaccount:{namespace}:{account}"
        assert await who(rereads) == user
        assert await who(keeps) == user

        token_file.write_text(second + "\n")  # the kubelet's rotation
        core.delete_namespaced_secret(f"{account}-first", namespace)  # the first: revoked
        await asyncio.sleep(CACHED + 1)

        assert await who(rereads) == user
        with pytest.raises(ApiError) as refused:
            await who(keeps)
        assert refused.value.status == 401

        assert (await connection_info(credentials)).token == second  # kopf's next login
    finally:
        await rereads.close()
        await keeps.close()
