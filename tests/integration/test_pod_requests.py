"""Memory the scheduler gave away, on the real control plane (issue 19, item 7).

Pods are bound here by setting ``spec.nodeName`` (no scheduler runs on this plane);
the kube-scheduler books the same request, and so does the ledger now.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.integration.test_pod_gates import claim_pod, finish
from tests.polling import eventually

Start = Callable[..., OperatorProcess]


def bound_pod(name: str, node: str, request: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": {"memory": request}}}
            ],
        },
    }


def headroom(custom: client.CustomObjectsApi, node: str) -> dict[str, Any]:
    items = custom.list_cluster_custom_object("headroom.dev", "v1alpha1", "nodeheadrooms")["items"]
    statuses = [i["status"] for i in items if i["metadata"]["name"] == node]
    assert len(statuses) == 1, statuses
    status: dict[str, Any] = statuses[0]
    return status


def test_pods_requests_leave_the_limit_and_come_back_when_they_end(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"req-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="10Gi")  # limit 10240 − 1024 = 9216 MiB
    run_operator()
    core.create_namespaced_pod(namespace, bound_pod("web", node, "2Gi"))

    def booked(pods_mb: int, allocatable_mb: int) -> None:
        status = headroom(custom, node)
        assert (status["podRequestsMB"], status["allocatableRAMMB"]) == (pods_mb, allocatable_mb)

    eventually(lambda: booked(2048, 7168))
    rsv.create(custom, namespace, "big", node, 8192)
    refused = rsv.wait_for(custom, namespace, "big")["status"]
    assert refused["reason"] == "InsufficientRAM"
    assert "(total 10240 × 1 − reserve 1024 − pods 2048 − reserved 0)" in refused["message"]

    rsv.create(custom, namespace, "patient", node, 8192, wait="5m")
    rsv.wait_for(custom, namespace, "patient", phases=("Queued",))
    finish(core, namespace, "web")  # Succeeded: its memory is free again
    assert rsv.wait_for(custom, namespace, "patient")["status"]["phase"] == "Admitted"
    eventually(lambda: booked(0, 1024))


def test_a_pod_with_a_claim_counts_only_by_what_it_asked_beyond_it(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"req-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="10Gi", labels={"pool": node})
    run_operator()
    body = claim_pod("train", node, "2Gi", gated=False, node_name=node)
    body["spec"]["containers"][0]["resources"] = {"requests": {"memory": "3Gi"}}
    core.create_namespaced_pod(namespace, body)
    rsv.wait_for(custom, namespace, "train")  # recorded where it runs: 2 GiB held

    def booked() -> None:
        status = headroom(custom, node)
        assert (status["reservedRAMMB"], status["podRequestsMB"]) == (2048, 1024)
        assert status["allocatableRAMMB"] == 9216 - 2048 - 1024

    eventually(booked)
    core.delete_namespaced_pod("train", namespace, grace_period_seconds=0)

    def all_back() -> None:  # its claim released, its request gone with it
        assert headroom(custom, node)["allocatableRAMMB"] == 9216

    eventually(all_back)


def test_a_launchers_reservation_on_another_node_hides_nothing_of_its_own_request(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """A launcher running on X reserves on Y for its workers (issue 29, item 13): X still
    carries the launcher's whole request, Y none of it, before and after the release."""
    here, there = (f"req-{uuid.uuid4().hex[:6]}" for _ in range(2))
    make_node(here, memory="10Gi")
    make_node(there, memory="10Gi")
    run_operator()
    launcher = bound_pod("launcher", here, "3Gi")
    launcher["metadata"]["labels"] = {"headroom.dev/owner": "true"}
    core.create_namespaced_pod(namespace, launcher)

    eventually(lambda: assert_pods(custom, here, 3072))
    rsv.create(custom, namespace, "workers", there, 2048, owner={"pod": "launcher"})
    assert rsv.wait_for(custom, namespace, "workers")["status"]["phase"] == "Admitted"
    # X's limit is still 10240 − 1024 − 3072 = 6144 MiB: the claim on Y hides nothing
    # there (it hid 2048 MiB, and 7168 MiB was admitted on X).
    rsv.create(custom, namespace, "on-x", here, 7168)
    refused = rsv.wait_for(custom, namespace, "on-x")["status"]
    assert (refused["phase"], refused["reason"]) == ("Rejected", "InsufficientRAM")
    assert "(total 10240 × 1 − reserve 1024 − pods 3072 − reserved 0)" in refused["message"]
    rsv.create(custom, namespace, "fits-x", here, 6144)
    assert rsv.wait_for(custom, namespace, "fits-x")["status"]["phase"] == "Admitted"
    eventually(lambda: assert_pods(custom, there, 0))


def assert_pods(custom: client.CustomObjectsApi, node: str, pods_mb: int) -> None:
    assert headroom(custom, node)["podRequestsMB"] == pods_mb
