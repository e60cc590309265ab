"""With the real kube-controller-manager and kube-scheduler (issue 12, items 1 and 5).

End-to-end rather than integration: what is checked is done by a Kubernetes
component, not by Headroom's code. The operator only sets an ownerReference; the
garbage collector is what must delete a NodeHeadroom with its Node, as on any
cluster. The other tests prove that the controllers the next steps (a node, pods
with ServiceAccount tokens) rely on do their work here.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from headroom.api.constants import GROUP, VERSION
from headroom_dev.controlplane import ControlPlane
from headroom_dev.nodes import create_node
from headroom_dev.operator import OperatorProcess
from tests.polling import eventually


@pytest.fixture(scope="module")
def api(controllers_api: client.ApiClient) -> client.ApiClient:
    return controllers_api


def found(read: Callable[[], Any]) -> Callable[[], Any]:
    """``read`` as a check for :func:`eventually`: a 404 is a failure to retry."""

    def check() -> Any:
        try:
            return read()
        except client.ApiException as error:
            if error.status == 404:
                raise AssertionError(f"not there yet: {error.reason}") from error
            raise

    return check


def read_node_headroom(custom: client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = custom.get_cluster_custom_object(
            GROUP, VERSION, "nodeheadrooms", name
        )
        return obj
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def test_the_garbage_collector_deletes_a_node_headroom_with_its_node(
    controllers_plane: ControlPlane, api: client.ApiClient, tmp_path: Path
) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    node = f"gc-{uuid.uuid4().hex[:8]}"
    uid = create_node(core, node, memory="16Gi").metadata.uid
    operator = OperatorProcess(controllers_plane.kubeconfig, tmp_path).start()
    try:

        def written() -> dict[str, Any]:
            headroom = read_node_headroom(custom, node)
            assert headroom is not None
            return headroom

        owners = eventually(written, timeout=30)["metadata"]["ownerReferences"]
        assert [(o["apiVersion"], o["kind"], o["name"], o["uid"]) for o in owners] == [
            ("v1", "Node", node, uid)
        ]
    finally:
        # Stopped before the Node goes, so that the operator (which also deletes a
        # NodeHeadroom whose Node it sees go) cannot be the one that deletes it.
        operator.stop()
    assert operator.popen is None
    assert read_node_headroom(custom, node) is not None

    core.delete_node(node)

    def collected() -> None:
        assert read_node_headroom(custom, node) is None

    # The collector notices a new resource type (the CRD installed after it
    # started) at its 30 s discovery resync, then deletes the orphan.
    eventually(collected, timeout=90)


def test_service_accounts_get_tokens_that_the_api_server_accepts(
    controllers_plane: ControlPlane, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    namespace = f"sa-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace}})

    # serviceaccount-controller, and root-ca-certificate-publisher with --root-ca-file.
    eventually(found(lambda: core.read_namespaced_service_account("default", namespace)), 30)
    ca_pem = (controllers_plane.pki / "ca.crt").read_text()

    def root_ca() -> None:
        maps = core.list_namespaced_config_map(namespace).items
        assert [m.data["ca.crt"] for m in maps if m.metadata.name == "kube-root-ca.crt"] == [ca_pem]

    eventually(root_ca, timeout=30)

    # serviceaccount-token-controller signs with --service-account-private-key-file.
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {
                "name": "default-token",
                "annotations": {"kubernetes.io/service-account.name": "default"},
            },
            "type": "kubernetes.io/service-account-token",
        },
    )

    def filled() -> dict[str, str]:
        data: dict[str, str] = core.read_namespaced_secret("default-token", namespace).data or {}
        assert {"token", "ca.crt", "namespace"} <= set(data)
        return data

    data = eventually(filled, timeout=30)
    assert base64.b64decode(data["ca.crt"]).decode() == ca_pem
    token = base64.b64decode(data["token"]).decode()

    # The API server verifies it with the matching --service-account-key-file.
    config = client.Configuration()
    config.host = controllers_plane.url
    config.ssl_ca_cert = str(controllers_plane.pki / "ca.crt")
    config.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(config) as as_sa:
        review = client.AuthenticationV1Api(as_sa).create_self_subject_review({})
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:default"

    # namespace-controller empties and removes a deleted namespace.
    core.delete_namespace(namespace)

    def namespace_gone() -> None:
        try:
            left = core.read_namespace(namespace)
        except client.ApiException as error:
            if error.status == 404:
                return
            raise
        conditions = [(c.type, c.status, c.message) for c in left.status.conditions or []]
        raise AssertionError(f"{namespace} still {left.status.phase}: {conditions}")

    eventually(namespace_gone, timeout=90)


def test_a_deployment_becomes_a_pod_that_the_scheduler_places(
    controllers_plane: ControlPlane, api: client.ApiClient
) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    namespace = f"deploy-{uuid.uuid4().hex[:8]}"
    node = f"sched-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace}})
    create_node(core, node, memory="8Gi", labels={"headroom.dev/test-node": node})
    # The ServiceAccount admission plugin is on here: pods wait for this account.
    eventually(found(lambda: core.read_namespaced_service_account("default", namespace)), 30)
    labels = {"app": "placed"}
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "placed"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        # Only this test's Node qualifies, whatever else exists.
                        "nodeSelector": {"headroom.dev/test-node": node},
                        # A new Node is tainted not-ready at admission; only the
                        # node-lifecycle controller (off: no kubelet here) lifts it.
                        "tolerations": [
                            {"key": "node.kubernetes.io/not-ready", "operator": "Exists"}
                        ],
                        "containers": [{"name": "main", "image": "placed:never-pulled"}],
                    },
                },
            },
        },
    )
    try:

        def placed() -> None:
            pods = core.list_namespaced_pod(namespace).items
            assert [p.spec.node_name for p in pods] == [node]
            owner = pods[0].metadata.owner_references[0]
            assert owner.kind == "ReplicaSet"
            assert owner.name.startswith("placed-")

        eventually(placed, timeout=60)
    finally:
        apps.delete_namespaced_deployment("placed", namespace)

        def cascaded() -> None:
            assert not apps.list_namespaced_replica_set(namespace).items

        eventually(cascaded, timeout=60)
        # The garbage collector deleted the pod gracefully, but no kubelet runs on
        # the Node to confirm it: finish that deletion as the kubelet would.
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        core.delete_node(node)
        core.delete_namespace(namespace)
