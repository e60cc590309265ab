"""Gated pods on the real node, the way users run them (issue 19).

The chart's operator (image, ``helm install``, webhook on by default) runs on the
node; Jobs whose pod template opts in are gated by the webhook, which the API server
reaches through its Service (aggregator routing over the EndpointSlice of the ready
operator pod), reserved by the operator, pinned, ungated, bound by kube-scheduler
and run by the kubelet. The tests share one release and run in file order.

Needs root (containerd, runc, the CNI bridge): ``make test`` builds and installs
what it needs (``make node image``); nothing here skips.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from headroom_dev.cluster import RELEASE_NAMESPACE, NodeCluster
from tests.integration.polling import eventually

TEAM = "gated"
GATE = "headroom.dev/admission"
RSV = "reservations.headroom.dev"
VALUES: dict[str, Any] = {"config": {"sweepPeriod": "1s", "reclaimedRetention": "10m"}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[NodeCluster]:
    with NodeCluster() as cluster:
        took = cluster.install(VALUES)
        print(f"figures: {cluster.figures}; helm install -> operator Ready {took:.1f}s")
        cluster.kubectl("create", "namespace", TEAM)
        yield cluster


@pytest.fixture(scope="module")
def claim_mb(cluster: NodeCluster) -> int:
    """A claim two of which fit on the node, three do not."""
    node = cluster.node.name

    def allocatable() -> int:
        items = cluster.get("nodeheadrooms")["items"]
        [status] = [i["status"] for i in items if i["metadata"]["name"] == node]
        return int(status["allocatableRAMMB"])

    room: int = eventually(allocatable, timeout=30)
    return room * 2 // 5


def job(name: str, claim_mb: int, *, parallelism: int, seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "labels": {"headroom.dev/claim": "true"},
                    "annotations": {"headroom.dev/ram": f"{claim_mb}Mi"},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "work",
                            "image": "localhost/headroom/busybox:1",
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", f"sleep {seconds}"],
                            "resources": {"requests": {"memory": "16Mi", "cpu": "10m"}},
                        }
                    ],
                },
            },
        },
    }


def job_pods(cluster: NodeCluster, name: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = cluster.get(
        "pods", "-n", TEAM, "-l", f"batch.kubernetes.io/job-name={name}"
    )["items"]
    return pods


def gated(pod: dict[str, Any]) -> bool:
    return GATE in [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def reservations(cluster: NodeCluster) -> dict[str, dict[str, Any]]:
    items = cluster.get(RSV, "-n", TEAM)["items"]
    return {i["metadata"]["name"]: i for i in items}


def test_a_job_runs_two_at_a_time_where_room_is_for_two(
    cluster: NodeCluster, claim_mb: int
) -> None:
    began = time.monotonic()
    cluster.apply([job("train", claim_mb, parallelism=3, seconds=8)])
    node = cluster.node.name

    def two_run_one_waits() -> tuple[list[str], str]:
        pods = job_pods(cluster, "train")
        assert len(pods) == 3, [p["metadata"]["name"] for p in pods]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        waiting = [p for p in pods if gated(p)]
        assert (len(running), len(waiting)) == (2, 1), [p["status"].get("phase") for p in pods]
        for pod in running:
            assert pod["spec"]["nodeName"] == node
            assert pod["metadata"]["annotations"]["headroom.dev/reservation"]
        [condition] = [c for c in waiting[0]["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert (condition["status"], condition["reason"]) == ("False", "SchedulingGated")
        return [p["metadata"]["name"] for p in running], waiting[0]["metadata"]["name"]

    first, third = eventually(two_run_one_waits, timeout=60)
    print(f"two pods Running {time.monotonic() - began:.1f}s after the Job was applied")
    status = reservations(cluster)[third]["status"]
    assert (status["phase"], status["queuePosition"]) == ("Queued", 1)

    def succeeded() -> None:
        done = cluster.get("job", "train", "-n", TEAM)["status"]
        assert done.get("succeeded") == 3, done

    eventually(succeeded, timeout=90)
    print(f"Job Succeeded {time.monotonic() - began:.1f}s after it was applied")
    held = reservations(cluster)
    assert sorted(held) == sorted([*first, third])  # one reservation per pod, no more
    for name, item in held.items():
        assert (item["status"]["phase"], item["status"]["reason"]) == (
            "Reclaimed",
            "OwnerPodFinished",
        ), name

    def all_returned() -> None:
        items = cluster.get("nodeheadrooms")["items"]
        [status] = [i["status"] for i in items if i["metadata"]["name"] == node] or [{}]
        assert status.get("reservedRAMMB") == 0, status

    eventually(all_returned, timeout=15)


def test_helm_upgrade_keeps_every_gate_and_every_reservation(
    cluster: NodeCluster, claim_mb: int
) -> None:
    cluster.apply([job("blocker", claim_mb, parallelism=2, seconds=3600)])
    cluster.apply([job("waiter", claim_mb, parallelism=2, seconds=1)])

    def settled() -> dict[str, str]:
        pods = {p["metadata"]["name"]: p for p in job_pods(cluster, "waiter")}
        assert len(pods) == 2
        assert all(gated(p) for p in pods.values())
        held = reservations(cluster)
        uids = {name: held[name]["metadata"]["uid"] for name in pods}
        assert all(held[name]["status"].get("phase") == "Queued" for name in pods)
        return uids

    before = eventually(settled, timeout=60)
    cluster.install({"config": {"summaryInterval": "2s"}}, upgrade=True)
    assert eventually(settled, timeout=60) == before  # the same gates, the same reservations

    cluster.kubectl("delete", "job", "blocker", "-n", TEAM, "--wait=false")

    def waiters_done() -> None:
        done = cluster.get("job", "waiter", "-n", TEAM)["status"]
        assert done.get("succeeded") == 2, done

    eventually(waiters_done, timeout=120)
    operator = cluster.get("pods", "-n", RELEASE_NAMESPACE, "-l", "app.kubernetes.io/name=headroom")
    restarts = [
        s["restartCount"] for p in operator["items"] for s in p["status"]["containerStatuses"]
    ]
    assert restarts, operator
    assert not any(restarts), restarts
