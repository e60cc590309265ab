"""Tenants must not get past the ledger through a pod (issue 29, items 1 and 2).

Only the operator's own reservation for a running pod — named as the pod, owned by
its current incarnation, on the node it runs on, the size of its claim capped at what
the pod can use — is recorded past a limit. Whatever a tenant writes, even naming a
claim pod bound to the node, is decided like any other claim. Pods are bound here by
setting ``spec.nodeName`` (no scheduler runs on this plane).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from headroom_dev import quotas as hq
from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.integration.test_pod_gates import claim_pod
from tests.polling import eventually

Start = Callable[..., OperatorProcess]
PIB_IN_MIB = 1 << 30  # the largest claim a spec or an annotation may say


@pytest.fixture
def tenant(core: client.CoreV1Api, custom: client.CustomObjectsApi) -> Iterator[Any]:
    """``make(labels)``: a fresh namespace; ``quota(labels, **spec)``: a quota that selects
    it. Both are removed after the test, with the namespace's pods and reservations
    (quotas are cluster-scoped)."""
    namespaces: list[str] = []
    quotas: list[str] = []

    class Tenant:
        tag = uuid.uuid4().hex[:8]

        def make(self, labels: dict[str, str] | None = None) -> str:
            name = f"tt-{uuid.uuid4().hex[:10]}"
            core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
            namespaces.append(name)
            return name

        def quota(self, labels: dict[str, str], **spec: Any) -> None:
            name = f"q-{uuid.uuid4().hex[:8]}"
            hq.create(custom, name, labels, **spec)
            quotas.append(name)

    yield Tenant()
    for name in quotas:
        hq.delete(custom, name)
    for name in namespaces:
        custom.delete_collection_namespaced_custom_object(rsv.GROUP, rsv.VERSION, name, rsv.PLURAL)
        # Its pods too: no namespace controller runs here, and a claim pod left behind
        # would be gated or recorded by an operator a later test starts.
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        core.delete_namespace(name)


def status_of(custom: client.CustomObjectsApi, namespace: str, name: str) -> tuple[str, str]:
    status = rsv.wait_for(custom, namespace, name)["status"]
    return status["phase"], status["reason"]


def test_hand_made_pod_reservations_naming_a_running_claim_pod_are_decided_like_any_claim(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    tenant: Any,
) -> None:
    """The issue's repro: under a quota of 1 GiB and one entry, a claim pod asking 100Mi
    runs; three hand-made Pod-liveness reservations naming it, on its node, ask 1 PiB
    each (one of them even carries the pod's ownerReference). None is admitted, and the
    node keeps its room for another tenant."""
    node = f"ten-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="8Gi", labels={"pool": node})  # limit 7168 MiB
    team = {"team": f"hog-{tenant.tag}"}
    tenant.quota(team, ramMB=1024, maxEntries=1)
    hogs, other = tenant.make(team), tenant.make()
    run_operator()
    pod = core.create_namespaced_pod(
        hogs, claim_pod("p", node, "100Mi", gated=False, node_name=node)
    )
    assert status_of(custom, hogs, "p") == ("Admitted", "Fits")  # the operator's own

    hog = {"liveness": "Pod", "owner": {"pod": "p"}}
    rsv.create(custom, hogs, "hog-1", node, PIB_IN_MIB, **hog)
    rsv.create(custom, hogs, "hog-2", node, 100, **hog)  # the pod's own size, not its own
    forged = rsv.reservation("hog-3", node, PIB_IN_MIB, **hog)
    forged["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": pod.metadata.uid}
    ]
    custom.create_namespaced_custom_object(rsv.GROUP, rsv.VERSION, hogs, rsv.PLURAL, forged)
    for name in ("hog-1", "hog-2", "hog-3"):
        # The quota holds one entry, p's: each is refused by it, as any claim would be.
        assert status_of(custom, hogs, name) == ("Rejected", "QuotaExceeded"), name

    rsv.create(custom, other, "neighbour", node, 6144)
    assert status_of(custom, other, "neighbour") == ("Admitted", "Fits")


def test_hand_made_pod_reservations_without_a_quota_are_refused_for_room(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    tenant: Any,
) -> None:
    """No quota in the way: the node's room decides, as for any claim."""
    node = f"ten-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="8Gi", labels={"pool": node})  # limit 7168 MiB
    hogs = tenant.make()
    run_operator()
    core.create_namespaced_pod(hogs, claim_pod("p", node, "100Mi", gated=False, node_name=node))
    assert status_of(custom, hogs, "p") == ("Admitted", "Fits")
    rsv.create(custom, hogs, "hog", node, PIB_IN_MIB, liveness="Pod", owner={"pod": "p"})
    refused = rsv.wait_for(custom, hogs, "hog")["status"]
    assert (refused["phase"], refused["reason"]) == ("Rejected", "InsufficientRAM")
    assert f"requested {PIB_IN_MIB} MiB" in refused["message"]


def released(custom: client.CustomObjectsApi, namespace: str, name: str) -> None:
    """Reclaimed, or already deleted."""
    left = [r for r in rsv.list_all(custom, namespace) if r["metadata"]["name"] == name]
    assert all(r.get("status", {}).get("phase") == "Reclaimed" for r in left), left


def running_pod(name: str, node: str, limit: str | None) -> dict[str, Any]:
    """A pod already running on ``node`` (no claim yet); ``limit`` its one memory limit."""
    resources = {"limits": {"memory": limit}} if limit else {"requests": {"memory": "64Mi"}}
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "busybox", "resources": resources}],
        },
    }


def label_as_claim(core: client.CoreV1Api, namespace: str, name: str, ram: str) -> None:
    patch = {
        "metadata": {
            "labels": {"headroom.dev/claim": "true"},
            "annotations": {"headroom.dev/ram": ram},
        }
    }
    core.patch_namespaced_pod(name, namespace, patch)


def test_a_running_pod_labelled_later_is_recorded_at_no_more_than_its_memory_limit(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    tenant: Any,
) -> None:
    """Labelled afterwards with a claim of 1 PiB (issue 29, item 2): the memory it can use,
    its 2 GiB limit, is recorded where it runs (over its namespace's 1 GiB quota, so
    OverCommitted), the node keeps the rest, and the namespace admits nothing else
    until it is back under its quota; another namespace is not affected."""
    node = f"ten-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="8Gi")  # limit 7168 MiB
    team = {"team": f"late-{tenant.tag}"}
    tenant.quota(team, ramMB=1024)
    late, other = tenant.make(team), tenant.make()
    run_operator()
    core.create_namespaced_pod(late, running_pod("late", node, "2Gi"))
    label_as_claim(core, late, "late", str(PIB_IN_MIB))

    recorded = rsv.wait_for(custom, late, "late")
    assert recorded["spec"]["ramMB"] == 2048  # its limit, not what the annotation says
    assert (recorded["status"]["phase"], recorded["status"]["reason"]) == (
        "Admitted",
        "OverCommitted",
    )
    rsv.create(custom, late, "more", node, 100)
    assert status_of(custom, late, "more") == ("Rejected", "QuotaExceeded")
    rsv.create(custom, other, "neighbour", node, 5120)  # 7168 − 2048: the node's rest
    assert status_of(custom, other, "neighbour") == ("Admitted", "Fits")

    core.delete_namespaced_pod("late", late, grace_period_seconds=0)
    eventually(lambda: released(custom, late, "late"))
    rsv.create(custom, late, "after", node, 100)  # back under its quota
    assert status_of(custom, late, "after") == ("Admitted", "Fits")


def test_a_hand_made_pod_reservation_on_a_node_its_quota_forbids_is_refused(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    tenant: Any,
) -> None:
    """The quota keeps the namespace off this node: the running pod's own memory is still
    recorded there (it runs there), but a reservation its tenant writes naming it is
    refused NodeNotAllowed, as any claim would be."""
    node = f"ten-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="8Gi", labels={"pool": node})
    team = {"team": f"away-{tenant.tag}"}
    tenant.quota(team, nodeSelector={"matchLabels": {"pool": f"not-{node}"}})
    hogs = tenant.make(team)
    run_operator()
    core.create_namespaced_pod(hogs, claim_pod("p", node, "100Mi", gated=False, node_name=node))
    assert status_of(custom, hogs, "p") == ("Admitted", "OverCommitted")
    rsv.create(custom, hogs, "hog", node, 100, liveness="Pod", owner={"pod": "p"})
    assert status_of(custom, hogs, "hog") == ("Rejected", "NodeNotAllowed")
