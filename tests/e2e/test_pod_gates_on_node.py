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

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from headroom_dev.cluster import RELEASE_NAMESPACE, NodeCluster
from tests.polling import eventually

TEAM = "gated"
GATE = "headroom.dev/admission"
RSV = "reservations.headroom.dev"
BUSYBOX = "localhost/headroom/busybox:1"
GATE_DOC = Path(__file__).resolve().parents[2] / "docs" / "tasks" / "gate-pods.md"


def sleeping(seconds: int) -> list[str]:
    return ["sh", "-c", f"sleep {seconds}"]


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
        # Written a moment after the operator is Ready: retried until it is there.
        found = [i.get("status") or {} for i in items if i["metadata"]["name"] == node]
        assert found, f"no NodeHeadroom for {node} yet"
        assert "allocatableRAMMB" in found[0], found[0]
        return int(found[0]["allocatableRAMMB"])

    room: int = eventually(allocatable, timeout=30)
    return room * 2 // 5


def readme_job() -> dict[str, Any]:
    """The Job of docs/tasks/gate-pods.md ("Gate your pods"), as written."""
    text = GATE_DOC.read_text()
    section = text[text.index("# Gate your pods") :]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match, f"{GATE_DOC} lost its Job example"
    body: dict[str, Any] = yaml.safe_load(match.group(1))
    return body


def test_the_readme_job_is_gated_as_it_says(cluster: NodeCluster, claim_mb: int) -> None:
    """The doc's Job with the test's namespace, sizes and image swapped in."""
    body = readme_job()
    assert body["spec"]["parallelism"] == 3
    assert body["spec"]["template"]["metadata"]["labels"] == {"headroom.dev/claim": "true"}
    body["metadata"] = {"name": "train", "namespace": TEAM}
    body["spec"]["template"]["metadata"]["annotations"]["headroom.dev/ram"] = f"{claim_mb}Mi"
    [container] = body["spec"]["template"]["spec"]["containers"]
    container |= {"image": BUSYBOX, "imagePullPolicy": "Never", "command": sleeping(8)}
    run_two_at_a_time(cluster, body)


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
                            "image": BUSYBOX,
                            "imagePullPolicy": "Never",
                            "command": sleeping(seconds),
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


def run_two_at_a_time(cluster: NodeCluster, body: dict[str, Any]) -> None:
    """A Job of three pods where room is for two: two run, the third waits gated with
    its position, then runs; every reservation is given back and the Job Succeeds."""
    began = time.monotonic()
    cluster.apply([body])
    node, name = cluster.node.name, body["metadata"]["name"]

    def two_run_one_waits() -> tuple[list[str], str]:
        pods = job_pods(cluster, name)
        assert len(pods) == 3, [p["metadata"]["name"] for p in pods]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        waiting = [p for p in pods if gated(p)]
        assert (len(running), len(waiting)) == (2, 1), [p["status"].get("phase") for p in pods]
        for pod in running:
            assert pod["spec"]["nodeName"] == node
            assert pod["metadata"]["annotations"]["headroom.dev/reservation"]
        conditions = waiting[0]["status"].get("conditions", [])
        scheduled = [
            (c["status"], c.get("reason")) for c in conditions if c["type"] == "PodScheduled"
        ]
        assert scheduled == [("False", "SchedulingGated")], conditions
        return [p["metadata"]["name"] for p in running], waiting[0]["metadata"]["name"]

    first, third = eventually(two_run_one_waits, timeout=60)
    print(f"two pods Running {time.monotonic() - began:.1f}s after the Job was applied")
    status = reservations(cluster)[third]["status"]
    assert (status["phase"], status["queuePosition"]) == ("Queued", 1)

    def succeeded() -> None:
        done = cluster.get("job", name, "-n", TEAM)["status"]
        assert done.get("succeeded") == 3, done

    eventually(succeeded, timeout=90)
    print(f"Job Succeeded {time.monotonic() - began:.1f}s after it was applied")

    def all_finished() -> None:
        held = reservations(cluster)
        assert sorted(held) == sorted([*first, third])  # one reservation per pod, no more
        outcomes = {pod: (i["status"]["phase"], i["status"]["reason"]) for pod, i in held.items()}
        assert set(outcomes.values()) == {("Reclaimed", "OwnerPodFinished")}, outcomes

    eventually(all_finished, timeout=15)

    def all_returned() -> None:
        items = cluster.get("nodeheadrooms")["items"]
        [status] = [i["status"] for i in items if i["metadata"]["name"] == node] or [{}]
        assert status.get("reservedRAMMB") == 0, status

    eventually(all_returned, timeout=15)


def test_a_gated_pod_reads_its_gpu_devices_through_the_downward_api(
    cluster: NodeCluster, claim_mb: int
) -> None:
    """The node labelled as GPU Feature Discovery labels two 8 GiB GPUs (issue 20): the
    pod's VRAM is admitted on one device, the patch that ungates it names the device,
    and its container reads it from its own annotation, as docs/tasks/gpus.md says."""
    node = cluster.node.name
    gfd = ["nvidia.com/gpu.count", "nvidia.com/gpu.memory"]
    cluster.kubectl("label", "node", node, f"{gfd[0]}=2", f"{gfd[1]}=8192", "--overwrite")
    try:
        body = job("gpu", min(claim_mb, 256), parallelism=1, seconds=0)
        template = body["spec"]["template"]
        template["metadata"]["annotations"] |= {"headroom.dev/vram": "6Gi"}
        [container] = template["spec"]["containers"]
        container["command"] = ["sh", "-c", 'echo "devices=$DEVICES"']
        annotation = "metadata.annotations['headroom.dev/devices']"
        container["env"] = [
            {"name": "DEVICES", "valueFrom": {"fieldRef": {"fieldPath": annotation}}}
        ]
        cluster.apply([body])

        def succeeded() -> None:
            done = cluster.get("job", "gpu", "-n", TEAM)["status"]
            assert done.get("succeeded") == 1, done

        eventually(succeeded, timeout=90)
        [pod] = job_pods(cluster, "gpu")
        assert pod["metadata"]["annotations"]["headroom.dev/devices"] == "gfd-0"
        logs = cluster.kubectl("logs", "-n", TEAM, pod["metadata"]["name"])
        assert "devices=gfd-0" in logs, logs

        def released() -> None:
            held = reservations(cluster)[pod["metadata"]["name"]].get("status") or {}
            assert (held.get("phase"), held.get("reason")) == ("Reclaimed", "OwnerPodFinished")

        eventually(released, timeout=15)
    finally:
        cluster.kubectl("label", "node", node, f"{gfd[0]}-", f"{gfd[1]}-")


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


def test_a_quota_lifetime_ends_the_pod_through_the_kubelet(
    cluster: NodeCluster, claim_mb: int
) -> None:
    """Issue 29, item 8: a quota's defaultLifetime reaches a gated pod as the
    activeDeadlineSeconds of its ungate patch, and the kubelet ends it (Failed,
    DeadlineExceeded); its one reservation is reclaimed then (OwnerPodFinished), or a
    moment before, in the slack between the expiry and the deadline (Expired), and
    is never made again."""
    namespace, quota = "lifetime", "lifetime-20s"
    cluster.kubectl("create", "namespace", namespace)
    cluster.apply(
        [
            {
                "apiVersion": "headroom.dev/v1alpha1",
                "kind": "HeadroomQuota",
                "metadata": {"name": quota},
                "spec": {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "defaultLifetime": "20s",
                },
            }
        ]
    )
    try:
        pod = job("bounded", min(claim_mb, 256), parallelism=1, seconds=600)["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", **pod}
        pod["metadata"] |= {"name": "bounded", "namespace": namespace}
        cluster.apply([pod])

        def running() -> dict[str, Any]:
            seen: dict[str, Any] = cluster.get("pod", "bounded", "-n", namespace)
            assert seen["status"].get("phase") == "Running", seen["status"]
            return seen

        seen = eventually(running, timeout=60)
        deadline = seen["spec"].get("activeDeadlineSeconds")
        assert deadline is not None, seen["spec"]
        assert 1 <= deadline <= 20

        def ended() -> dict[str, Any]:
            status: dict[str, Any] = cluster.get("pod", "bounded", "-n", namespace)["status"]
            assert (status.get("phase"), status.get("reason")) == (
                "Failed",
                "DeadlineExceeded",
            ), status
            return status

        eventually(ended, timeout=60)

        def reclaimed_once() -> tuple[str, str]:
            items = cluster.get(RSV, "-n", namespace)["items"]
            assert [i["metadata"]["name"] for i in items] == ["bounded"], items
            status = items[0]["status"]
            assert status["phase"] == "Reclaimed", status
            return status["phase"], status["reason"]

        outcome = eventually(reclaimed_once, timeout=15)
        assert outcome[1] in ("OwnerPodFinished", "Expired"), outcome
        print(f"lifetime 20s: pod Failed DeadlineExceeded; its reservation {outcome}")
        time.sleep(3)  # the operator had its chance to make another: it made none
        assert reclaimed_once() == outcome
    finally:
        cluster.kubectl("delete", "headroomquota", quota, "--wait=false")
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
