"""Gated pods with the real kube-scheduler and garbage collector (issue 19).

The nodes here are Node objects without a kubelet (one real node per machine; see
test_on_node.py for pods that run): what is checked is that kube-scheduler holds a
gated pod (``PodScheduled=False SchedulingGated``), binds it exactly where its
reservation was admitted once the operator pins and ungates it, and that the
garbage collector deletes the reservation with its pod.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane
from headroom_dev.nodes import create_node
from headroom_dev.operator import OperatorProcess
from tests.integration.test_external_gpus import device_plugin_pod
from tests.integration.test_pod_gates import GATE, claim_pod, gates_of, untaint
from tests.polling import eventually


@pytest.fixture(scope="module")
def api(controllers_api: client.ApiClient) -> client.ApiClient:
    return controllers_api


@pytest.fixture
def operator(controllers_plane: ControlPlane, tmp_path: Path) -> Iterator[OperatorProcess]:
    process = OperatorProcess(controllers_plane.kubeconfig, tmp_path).start()
    yield process
    process.stop()


@pytest.fixture
def pool(api: client.ApiClient) -> Iterator[tuple[str, str, dict[str, str]]]:
    """A full node and a free one, Ready and labelled with a pool of their own."""
    core = client.CoreV1Api(api)
    name = f"p{uuid.uuid4().hex[:8]}"
    nodes = {size: f"{size}-{name}" for size in ("full", "free")}
    for size, node in nodes.items():
        create_node(core, node, memory="8Gi", labels={"pool": name, "size": size})
        untaint(core, node)
    namespace = f"gates-{name}"
    core.create_namespace({"metadata": {"name": namespace}})
    yield namespace, name, nodes
    core.delete_namespace(namespace)
    for node in nodes.values():
        core.delete_node(node)


def scheduled(pod: client.V1Pod) -> tuple[str, str]:
    found = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
    assert len(found) == 1, f"{pod.metadata.name}: no PodScheduled condition yet"
    return found[0].status, found[0].reason or ""


def test_the_scheduler_binds_a_gated_pod_only_where_its_memory_was_admitted(
    api: client.ApiClient, operator: OperatorProcess, pool: tuple[str, str, dict[str, str]]
) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    namespace, label, nodes = pool
    only_full = {"pool": label, "size": "full"}
    filler = claim_pod("filler", label, "6Gi", spec={"nodeSelector": only_full})
    core.create_namespaced_pod(namespace, filler)

    def bound(name: str) -> str:
        pod = core.read_namespaced_pod(name, namespace)
        assert pod.spec.node_name, (gates_of(pod), pod.status.conditions)
        return str(pod.spec.node_name)

    assert eventually(lambda: bound("filler"), timeout=30) == nodes["full"]

    picky = claim_pod("picky", label, "4Gi", spec={"nodeSelector": only_full})
    core.create_namespaced_pod(namespace, picky)
    core.create_namespaced_pod(namespace, claim_pod("easy", label, "4Gi"))
    assert eventually(lambda: bound("easy"), timeout=30) == nodes["free"]

    def held_by_the_gate() -> None:
        pod = core.read_namespaced_pod("picky", namespace)
        assert gates_of(pod) == [GATE]
        assert scheduled(pod) == ("False", "SchedulingGated")  # what kubectl get pod shows
        assert not pod.spec.node_name

    eventually(held_by_the_gate, timeout=30)
    assert rsv.get(custom, namespace, "picky")["status"]["phase"] == "Queued"

    core.delete_namespaced_pod("filler", namespace, grace_period_seconds=0)
    assert eventually(lambda: bound("picky"), timeout=30) == nodes["full"]

    def collected() -> None:  # the garbage collector follows the ownerReference
        names = [r["metadata"]["name"] for r in rsv.list_all(custom, namespace)]
        assert "filler" not in names, names

    eventually(collected, timeout=60)


def test_a_gated_gpu_pod_is_bound_where_its_gpu_is_free_not_where_the_most_ram_is(
    api: client.ApiClient, operator: OperatorProcess
) -> None:
    """Issue 30's test for a GPU held by another pod: the node with the most RAM has its
    only GPU held by a device-plugin pod; the opted-in pod is bound by kube-scheduler to the
    other node, and its reservation is there."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    label = f"g{uuid.uuid4().hex[:8]}"
    nodes = {"roomy": f"roomy-{label}", "free": f"free-{label}"}
    gfd = {"pool": label, "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "81920"}
    for size, memory in (("roomy", "256Gi"), ("free", "32Gi")):
        create_node(core, nodes[size], memory=memory, labels=gfd)
        untaint(core, nodes[size])
    namespace = f"gpus-{label}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        core.create_namespaced_pod(namespace, device_plugin_pod("cuda", nodes["roomy"]))
        pod = claim_pod("train", label, "4Gi", annotations={"headroom.dev/vram": "40Gi"})
        core.create_namespaced_pod(namespace, pod)

        def bound() -> str:
            found = core.read_namespaced_pod("train", namespace)
            assert found.spec.node_name, (gates_of(found), found.status.conditions)
            return str(found.spec.node_name)

        assert eventually(bound, timeout=30) == nodes["free"]
        reservation = rsv.get(custom, namespace, "train")
        assert reservation["spec"]["node"] == nodes["free"]
        assert reservation["status"]["phase"] == "Admitted"
    finally:
        core.delete_namespace(namespace)
        for node in nodes.values():
            core.delete_node(node)
