"""The webhook through a leader takeover on the real node (issue 29, item 14).

The chart as installed (two replicas, webhook on, ``failurePolicy: Fail``, the
webhook Service routed by readiness: kube-apiserver's aggregator routing reads its
EndpointSlices, written by the real EndpointSlice controller from the kubelet's
readiness probes). An opted-in pod is created every 100 ms while the leader's pod
is deleted, until the old pod is gone, the standby holds the Lease and the
Deployment's replacement is ready. No create may be refused, and each one comes
back from the API server behind the scheduling gate.

Needs root (containerd, runc, the CNI bridge) and the machine's node lock; nothing
here skips.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client

from headroom.api.constants import CLAIM_LABEL, RAM_ANNOTATION, SCHEDULING_GATE
from headroom_dev.apply import api_client
from headroom_dev.cluster import RELEASE, RELEASE_NAMESPACE, NodeCluster

TEAM = "takeover"
PERIOD = 0.1  # seconds between two creates
SELECTOR = "app.kubernetes.io/name=headroom"
# The chart's defaults but for a quick sweep; the webhook's failurePolicy stays Fail.
VALUES: dict[str, Any] = {"config": {"sweepPeriod": "1s"}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[NodeCluster]:
    with NodeCluster() as cluster:
        took = cluster.install(VALUES)
        print(f"figures: {cluster.figures}; helm install -> operator Ready {took:.1f}s")
        cluster.kubectl("create", "namespace", TEAM)
        yield cluster


def opted_in(name: str) -> dict[str, Any]:
    """A pod that opts in with a claim no node fits: it stays gated, nothing runs."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {CLAIM_LABEL: "true"},
            "annotations": {RAM_ANNOTATION: "1Ti"},
        },
        "spec": {
            "containers": [{"name": "c", "image": "localhost/headroom/busybox:1"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


@dataclass
class Creates:
    """Creates an opted-in pod every PERIOD on its own thread and keeps every outcome."""

    core: client.CoreV1Api
    gated: list[str] = field(default_factory=list)
    ungated: list[str] = field(default_factory=list)
    refused: list[tuple[float, str]] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Creates:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    @property
    def made(self) -> int:
        return len(self.gated) + len(self.ungated) + len(self.refused)

    def _run(self) -> None:
        while not self._stop.wait(max(0.0, self.began + self.made * PERIOD - time.monotonic())):
            name = f"p-{self.made}"
            try:
                pod = self.core.create_namespaced_pod(TEAM, opted_in(name))
            except client.ApiException as error:
                self.refused.append((time.monotonic(), f"{error.status} {error.body}"[:300]))
                continue
            gates = [g.name for g in pod.spec.scheduling_gates or []]
            (self.gated if SCHEDULING_GATE in gates else self.ungated).append(name)


def gating_begins(core: client.CoreV1Api) -> None:
    """The first opted-in create that succeeds (once the caBundle is published) is gated."""
    deadline, last = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        try:
            made = core.create_namespaced_pod(TEAM, opted_in("first"))
            break
        except client.ApiException as error:
            last = str(error.body)
            time.sleep(0.5)
    else:
        pytest.fail(f"no opted-in create succeeded: {last}")
    assert SCHEDULING_GATE in [g.name for g in made.spec.scheduling_gates or []]


def holder(coordination: client.CoordinationV1Api) -> str:
    lease = coordination.read_namespaced_lease(RELEASE, RELEASE_NAMESPACE)
    return str(lease.spec.holder_identity or "")


def is_ready(pod: client.V1Pod) -> bool:
    conditions = pod.status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def test_no_opted_in_create_is_refused_while_the_leader_is_replaced(cluster: NodeCluster) -> None:
    api = api_client(cluster.plane.kubeconfig)
    core, coordination = client.CoreV1Api(api), client.CoordinationV1Api(api)
    pods = core.list_namespaced_pod(RELEASE_NAMESPACE, label_selector=SELECTOR).items
    assert len(pods) == 2, [p.metadata.name for p in pods]
    assert all(is_ready(p) for p in pods), [p.status for p in pods]
    before = {p.metadata.name for p in pods}
    (leader,) = [p for p in before if holder(coordination).startswith(f"{p}-")]
    gating_begins(core)
    creating = Creates(client.CoreV1Api(api_client(cluster.plane.kubeconfig)))
    creating.start()
    time.sleep(2)  # a steady stream through the old leader's pod and the standby's

    core.delete_namespaced_pod(leader, RELEASE_NAMESPACE)  # the pod's grace period
    deleted = time.monotonic()
    marks: dict[str, float] = {}
    deadline = deleted + 120
    while len(marks) < 3:
        assert time.monotonic() < deadline, (marks, creating.refused[-3:])
        now = time.monotonic() - deleted
        taken = holder(coordination)
        if "lease taken" not in marks and taken and not taken.startswith(f"{leader}-"):
            marks["lease taken"] = now
        live = core.list_namespaced_pod(RELEASE_NAMESPACE, label_selector=SELECTOR).items
        names = {p.metadata.name for p in live}
        if "old pod gone" not in marks and leader not in names:
            marks["old pod gone"] = now
        fresh = [p for p in live if p.metadata.name not in before]
        if "replacement ready" not in marks and fresh and all(is_ready(p) for p in fresh):
            marks["replacement ready"] = now
        time.sleep(0.25)
    time.sleep(2)  # and a little after, through the replicas that stay
    creating.stop()

    figures = ", ".join(f"{k} {v:.1f}s" for k, v in marks.items())
    print(
        f"takeover: {creating.made} opted-in creates every {PERIOD * 1000:.0f} ms, "
        f"{len(creating.refused)} refused, {len(creating.ungated)} created without the gate; "
        f"after the leader's pod was deleted: {figures}"
    )
    assert creating.refused == [], creating.refused
    assert creating.ungated == [], creating.ungated
    during = (marks["old pod gone"] + 2) / PERIOD  # creates the takeover window spanned
    assert len(creating.gated) > during, (len(creating.gated), marks)
    core.delete_collection_namespaced_pod(TEAM, grace_period_seconds=0)
