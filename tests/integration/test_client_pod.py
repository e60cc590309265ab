"""The claim library from inside a pod: in-cluster configuration, the service account's
namespace, and ``owner_pod=True`` naming the pod itself (``$POD_NAME``).

A pod is simulated the way the official client sees one: ``KUBERNETES_SERVICE_HOST``
and ``_PORT`` point at the API server, and a service-account directory holds a real
token (TokenRequest), the cluster's CA and the namespace. The service account has
only a tenant's rights on Reservations, so it cannot read NodeHeadrooms: heartbeats
come at the documented default interval.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from kubernetes import client

from headroom.client import (
    DEFAULT_HEARTBEAT_INTERVAL,
    ClaimRefusedError,
    InvalidClaimError,
    claim,
    connect,
)
from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane

TENANT_RULES = [
    {
        "apiGroups": ["headroom.dev"],
        "resources": ["reservations"],
        "verbs": ["create", "get", "list", "patch", "delete"],
    }
]


@pytest.fixture
def pod_environment(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """A service account with a tenant's rights, its mounted files, and a pod's variables;
    no kubeconfig anywhere. Returns the service-account directory."""
    rbac = client.RbacAuthorizationV1Api(core.api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "trainer"}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "claims"}, "rules": TENANT_RULES})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "claims"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "claims"},
            "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": namespace}],
        },
    )
    token = core.create_namespaced_service_account_token(
        "trainer", namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    mounted = tmp_path / "serviceaccount"
    mounted.mkdir()
    (mounted / "token").write_text(token)
    (mounted / "ca.crt").write_bytes((control_plane.pki / "ca.crt").read_bytes())
    (mounted / "namespace").write_text(namespace)
    server = urlparse(control_plane.url)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", str(server.hostname))
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config
    return mounted


def make_pod(core: client.CoreV1Api, namespace: str, labels: dict[str, str]) -> str:
    name = f"trainer-{uuid.uuid4().hex[:6]}"
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    core.create_namespaced_pod(namespace, body)
    return name


def test_in_a_pod_the_claim_names_its_own_pod_as_owner(
    claim_node: str,
    control_plane: ControlPlane,
    pod_environment: Path,
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pod = make_pod(core, namespace, {"headroom.dev/owner": "true"})
    monkeypatch.setenv("POD_NAME", pod)
    connection = connect(service_account=pod_environment)
    assert connection.namespace == namespace  # from the service account's namespace file
    assert connection.api.configuration.host == control_plane.url  # in-cluster configuration
    with claim(claim_node, ram_mb=1024, owner_pod=True, connection=connection) as held:
        obj = rsv.get(custom, namespace, held.name)
        assert obj["spec"]["owner"] == {"pod": pod}
        assert obj["status"]["phase"] == "Admitted"
        # NodeHeadrooms are not readable with a tenant's rights: the documented default.
        assert held.heartbeat_interval_from == "default"
        assert held.heartbeat_interval == DEFAULT_HEARTBEAT_INTERVAL
    assert rsv.list_all(custom, namespace) == []


def test_an_owner_pod_without_the_label_is_refused_and_without_pod_name_nothing_is_sent(
    claim_node: str,
    pod_environment: Path,
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connection = connect(service_account=pod_environment)
    monkeypatch.delenv("POD_NAME", raising=False)
    with pytest.raises(InvalidClaimError, match=r"\$POD_NAME, which is not set"):
        claim(claim_node, ram_mb=1024, owner_pod=True, connection=connection)
    monkeypatch.setenv("POD_NAME", make_pod(core, namespace, {}))
    with (
        pytest.raises(ClaimRefusedError) as refused,
        claim(claim_node, ram_mb=1024, owner_pod=True, connection=connection),
    ):
        pytest.fail("the block of a refused claim must not run")
    assert refused.value.reason == "OwnerPodNotLabelled"
    assert rsv.list_all(custom, namespace) == []
