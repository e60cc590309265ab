"""The node chosen by the real kube-scheduler among the nodes where the ledger has room
(issue 30 item 1, being built: filter and prioritize only, no bind yet).

A second stock kube-scheduler (profile ``headroom``) asks the operator, as its extender,
which feasible nodes have room; kube-scheduler's own predicates (CPU here) still hold.
Until the bind verb is built the DefaultBinder binds, so these tests check only where
pods go, and the operator records a bound claim pod as it records any running one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from headroom_dev.controlplane import ControlPlane
from headroom_dev.nodes import create_node
from headroom_dev.operator import OperatorProcess
from headroom_dev.process import free_port
from headroom_dev.scheduler import SCHEDULER_NAME, HeadroomScheduler
from tests.integration.polling import eventually
from tests.integration.test_pod_gates import untaint


@pytest.fixture(scope="module")
def api(controllers_api: client.ApiClient) -> client.ApiClient:
    return controllers_api


@pytest.fixture
def extender(controllers_plane: ControlPlane, tmp_path: Path) -> Iterator[OperatorProcess]:
    port = free_port()
    operator = OperatorProcess(
        controllers_plane.kubeconfig, tmp_path, {"extenderPort": port, "extenderHost": "127.0.0.1"}
    ).start()
    operator.wait_ready(body="ok")
    scheduler = HeadroomScheduler(controllers_plane, f"http://127.0.0.1:{port}").start()
    yield operator
    scheduler.stop()
    operator.stop()


@pytest.fixture
def pool(api: client.ApiClient) -> Iterator[tuple[str, str, dict[str, str]]]:
    """Three Ready nodes of a pool of their own: ``roomy`` (most RAM, 1 CPU), ``cpu``
    (32 GiB, 8 CPUs) and ``small`` (8 GiB, 8 CPUs)."""
    core = client.CoreV1Api(api)
    label = f"x{uuid.uuid4().hex[:8]}"
    nodes = {size: f"{size}-{label}" for size in ("roomy", "cpu", "small")}
    for size, memory in (("roomy", "256Gi"), ("cpu", "32Gi"), ("small", "8Gi")):
        create_node(core, nodes[size], memory=memory, labels={"pool": label})
        untaint(core, nodes[size])
    status = {"capacity": {"cpu": "1"}, "allocatable": {"cpu": "1"}}
    core.patch_node_status(nodes["roomy"], {"status": status})
    namespace = f"ext-{label}"
    core.create_namespace({"metadata": {"name": namespace}})
    yield namespace, label, nodes
    core.delete_namespace(namespace)
    for node in nodes.values():
        core.delete_node(node)


def claim_pod(name: str, pool: str, ram: str, cpu: str = "100m") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"headroom.dev/claim": "true"},
            "annotations": {"headroom.dev/ram": ram},
        },
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "nodeSelector": {"pool": pool},
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
            ],
        },
    }


def bound_to(core: client.CoreV1Api, namespace: str, name: str) -> str:
    pod = core.read_namespaced_pod(name, namespace)
    assert pod.spec.node_name, pod.status.conditions
    return str(pod.spec.node_name)


def test_the_scheduler_places_a_claim_pod_where_the_ledger_has_room_and_its_cpu_fits(
    api: client.ApiClient, extender: OperatorProcess, pool: tuple[str, str, dict[str, str]]
) -> None:
    core = client.CoreV1Api(api)
    namespace, label, nodes = pool
    # The most RAM is on roomy, but its one CPU does not hold 2: kube-scheduler's verdict.
    core.create_namespaced_pod(namespace, claim_pod("cpu-bound", label, "4Gi", cpu="2"))
    assert eventually(lambda: bound_to(core, namespace, "cpu-bound"), timeout=30) == nodes["cpu"]
    # 16 GiB fits on roomy and cpu only; the node policy (spread) prefers the most RAM left.
    core.create_namespaced_pod(namespace, claim_pod("big", label, "16Gi"))
    assert eventually(lambda: bound_to(core, namespace, "big"), timeout=30) == nodes["roomy"]


def test_a_claim_pod_no_node_has_room_for_waits_saying_why(
    api: client.ApiClient, extender: OperatorProcess, pool: tuple[str, str, dict[str, str]]
) -> None:
    core = client.CoreV1Api(api)
    namespace, label, _ = pool
    core.create_namespaced_pod(namespace, claim_pod("huge", label, "1Ti"))

    def unschedulable() -> str:
        pod = core.read_namespaced_pod("huge", namespace)
        found = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
        assert found, "not tried yet"
        assert found[0].reason == "Unschedulable", found[0]
        return str(found[0].message)

    message = eventually(unschedulable, timeout=30)
    assert "headroom: InsufficientRAM" in message
    assert not core.read_namespaced_pod("huge", namespace).spec.node_name
