"""Gated pods on the real control plane: reserved, pinned, ungated, released.

These pods are created with the gate already in their spec, as a client may do (the
webhook, tested in test_webhook.py, adds it the same way). No scheduler runs on this
plane, so what is checked is the operator's part: the reservation it makes, the one
patch that pins and ungates, and the release. The binding by kube-scheduler is
checked on the plane with controllers (tests/e2e/test_pod_gates_scheduled.py) and on
the real node. Each test labels its own nodes and selects them, since the operator
sees every node of the shared control plane.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.polling import eventually

Start = Callable[..., OperatorProcess]
GATE = "headroom.dev/admission"


def claim_pod(
    name: str,
    pool: str,
    ram: str,
    *,
    gated: bool = True,
    node_name: str | None = None,
    spec: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "labels": {"headroom.dev/claim": "true"},
            "annotations": {"headroom.dev/ram": ram, **(annotations or {})},
        },
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "nodeSelector": {"pool": pool},
            **(spec or {}),
        },
    }
    if gated:
        body["spec"]["schedulingGates"] = [{"name": GATE}]
    if node_name:
        body["spec"]["nodeName"] = node_name
    return body


def pool_nodes(
    make_node: Callable[..., Any], core: client.CoreV1Api, **memories: str
) -> tuple[str, dict[str, str]]:
    """Ready nodes labelled with a pool of their own; returns the pool and their names."""
    pool = f"p{uuid.uuid4().hex[:8]}"
    names = {}
    for key, memory in memories.items():
        names[key] = f"{key}-{pool}"
        make_node(names[key], memory=memory, labels={"pool": pool, "size": key})
        untaint(core, names[key])
    return pool, names


def untaint(core: client.CoreV1Api, node: str) -> None:
    """Leave a Node as the node-lifecycle controller leaves a Ready one: without the
    not-ready taint the API server gives every new Node (no such controller runs here)."""
    core.patch_node(node, {"spec": {"taints": []}})


def gates_of(pod: client.V1Pod) -> list[str]:
    return [g.name for g in pod.spec.scheduling_gates or []]


def pinned_to(pod: client.V1Pod) -> list[str]:
    affinity = pod.spec.affinity
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution
    return [
        value
        for term in required.node_selector_terms
        for field in term.match_fields or []
        if field.key == "metadata.name" and field.operator == "In"
        for value in field.values
    ]


def wait_ungated(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod:
    def ungated() -> client.V1Pod:
        pod = core.read_namespaced_pod(name, namespace)
        assert GATE not in gates_of(pod), gates_of(pod)
        return pod

    pod: client.V1Pod = eventually(ungated, timeout=20)
    return pod


def finish(core: client.CoreV1Api, namespace: str, name: str, phase: str = "Succeeded") -> None:
    """What a kubelet writes when the pod's containers end."""
    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": phase}})


def events_of(core: client.CoreV1Api, namespace: str, name: str) -> list[client.CoreV1Event]:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return list(events.items)


def test_a_gated_pod_is_reserved_on_the_roomiest_node_then_pinned_and_ungated(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool, nodes = pool_nodes(make_node, core, small="8Gi", big="32Gi")
    run_operator()
    core.create_namespaced_pod(namespace, claim_pod("train", pool, "6Gi"))

    reservation = rsv.wait_for(custom, namespace, "train")
    assert reservation["spec"] == {
        "node": nodes["big"],
        "ramMB": 6144,
        "vramMB": 0,
        "owner": {"pod": "train", "surface": "pod"},
        "liveness": "Pod",
        "wait": "86400s",
        "description": "memory of pod train",
    }
    [owner] = reservation["metadata"]["ownerReferences"]
    pod = core.read_namespaced_pod("train", namespace)
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "train", pod.metadata.uid)
    assert reservation["status"]["phase"] == "Admitted"

    pod = wait_ungated(core, namespace, "train")
    assert pinned_to(pod) == [nodes["big"]]
    assert pod.spec.node_selector == {"pool": pool}  # the pod's own constraints stay
    assert pod.metadata.annotations["headroom.dev/reservation"] == "train"
    assert pod.metadata.labels["headroom.dev/owner"] == "true"  # its deletion is followed


def test_pods_wait_gated_in_creation_order_and_go_when_one_finishes(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    cli: Callable[..., Any],
) -> None:
    pool, nodes = pool_nodes(make_node, core, only="14Gi")  # limit 14336 − 1024 = 13312 MiB
    run_operator()
    for name in ("job-0", "job-1", "job-2"):
        core.create_namespaced_pod(namespace, claim_pod(name, pool, "6Gi"))
    for name in ("job-0", "job-1"):
        assert pinned_to(wait_ungated(core, namespace, name)) == [nodes["only"]]

    waiting = rsv.wait_for(custom, namespace, "job-2", phases=("Queued",))
    assert waiting["status"]["queuePosition"] == 1
    assert gates_of(core.read_namespaced_pod("job-2", namespace)) == [GATE]
    eventually(lambda: _said(core, namespace, "job-2", "Waiting", "position 1"))
    why = cli("why", "pod/job-2", via="kubectl")
    assert why.returncode == 0, why.stderr
    assert "held by the scheduling gate headroom.dev/admission" in why.stdout
    assert f"Queue:   position 1 on node {nodes['only']}" in why.stdout
    assert "Waiting" in why.stdout.split("Events:")[1]

    def conditioned(name: str, status: str, reason: str) -> None:
        conditions = core.read_namespaced_pod(name, namespace).status.conditions or []
        ours = [c for c in conditions if c.type == "headroom.dev/Admitted"]
        assert [(c.status, c.reason) for c in ours] == [(status, reason)], ours

    eventually(lambda: conditioned("job-2", "False", "Waiting"))
    eventually(lambda: conditioned("job-0", "True", "Admitted"))

    finish(core, namespace, "job-0")
    done = rsv.wait_for(custom, namespace, "job-0", phases=("Reclaimed",))
    assert done["status"]["reason"] == "OwnerPodFinished"
    assert pinned_to(wait_ungated(core, namespace, "job-2")) == [nodes["only"]]
    assert rsv.get(custom, namespace, "job-2")["status"]["phase"] == "Admitted"
    eventually(lambda: conditioned("job-2", "True", "Admitted"))  # the same one, replaced


def test_a_node_selector_waits_for_its_node_while_others_go_elsewhere(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool, nodes = pool_nodes(make_node, core, full="8Gi", free="16Gi")
    tainted = f"tainted-{pool}"
    make_node(tainted, memory="64Gi", labels={"pool": pool, "size": "tainted"})
    core.patch_node(tainted, {"spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}})
    run_operator()
    core.create_namespaced_pod(
        namespace, claim_pod("filler", pool, "7Gi", spec={"nodeSelector": {"size": "full"}})
    )
    wait_ungated(core, namespace, "filler")
    picky = claim_pod("picky", pool, "4Gi", spec={"nodeSelector": {"pool": pool, "size": "full"}})
    core.create_namespaced_pod(namespace, picky)
    core.create_namespaced_pod(namespace, claim_pod("easy", pool, "4Gi"))

    assert pinned_to(wait_ungated(core, namespace, "easy")) == [nodes["free"]]
    waiting = rsv.wait_for(custom, namespace, "picky", phases=("Queued",))
    assert waiting["spec"]["node"] == nodes["full"]
    assert gates_of(core.read_namespaced_pod("picky", namespace)) == [GATE]

    # The tainted node has the most room, but only a pod that tolerates it goes there.
    tolerant = claim_pod(
        "tolerant", pool, "4Gi", spec={"tolerations": [{"key": "gpu", "operator": "Exists"}]}
    )
    core.create_namespaced_pod(namespace, tolerant)
    assert pinned_to(wait_ungated(core, namespace, "tolerant")) == [tainted]


def test_a_pod_the_webhook_missed_is_recorded_where_it_runs_even_over_the_limit(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool, nodes = pool_nodes(make_node, core, only="8Gi")  # limit 7168 MiB
    run_operator()
    node = nodes["only"]
    core.create_namespaced_pod(
        namespace, claim_pod("first", pool, "6Gi", gated=False, node_name=node)
    )
    first = rsv.wait_for(custom, namespace, "first")["status"]
    assert (first["phase"], first["reason"]) == ("Admitted", "Fits")

    core.create_namespaced_pod(
        namespace, claim_pod("second", pool, "6Gi", gated=False, node_name=node)
    )
    second = rsv.wait_for(custom, namespace, "second")["status"]
    assert (second["phase"], second["reason"]) == ("Admitted", "OverCommitted")
    assert "requested 6144 MiB, allocatable 1024 MiB" in second["message"]
    eventually(lambda: _said(core, namespace, "second", "OverCommitted", "over the limit"))

    def summary_says_so() -> None:
        summaries = custom.list_cluster_custom_object("headroom.dev", "v1alpha1", "nodeheadrooms")
        statuses = [s["status"] for s in summaries["items"] if s["metadata"]["name"] == node]
        assert len(statuses) == 1, statuses
        status = statuses[0]
        assert status["reservedRAMMB"] == 12288
        assert status["allocatableRAMMB"] == 0

    eventually(summary_says_so)


def test_a_pod_deleted_or_failed_gives_its_memory_back(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool, _ = pool_nodes(make_node, core, only="12Gi")  # room for two 4Gi pods
    run_operator()
    for name in ("running", "failing", "gated"):
        core.create_namespaced_pod(namespace, claim_pod(name, pool, "4Gi"))
    for name in ("running", "failing"):
        wait_ungated(core, namespace, name)
    rsv.wait_for(custom, namespace, "gated", phases=("Queued",))

    # Deleted while it waits: its reservation, which holds nothing, is deleted with it.
    core.delete_namespaced_pod("gated", namespace, grace_period_seconds=0)

    def gone() -> None:
        assert "gated" not in [r["metadata"]["name"] for r in rsv.list_all(custom, namespace)]

    eventually(gone)
    core.delete_namespaced_pod("running", namespace, grace_period_seconds=0)
    reclaimed = rsv.wait_for(custom, namespace, "running", phases=("Reclaimed",))
    assert reclaimed["status"]["reason"] == "OwnerPodDeleted"
    finish(core, namespace, "failing", "Failed")
    finished = rsv.wait_for(custom, namespace, "failing", phases=("Reclaimed",))
    assert finished["status"]["reason"] == "OwnerPodFinished"
    left = core.list_namespaced_pod(namespace).items
    assert [(p.metadata.name, p.metadata.finalizers) for p in left] == [("failing", None)]
    assert all(not r["metadata"].get("finalizers") for r in rsv.list_all(custom, namespace))


def test_after_a_restart_each_waiting_pod_has_exactly_one_reservation_in_creation_order(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool, nodes = pool_nodes(make_node, core, only="8Gi")  # room for one 6Gi pod
    operator = run_operator()
    for index in range(3):
        core.create_namespaced_pod(namespace, claim_pod(f"w-{index}", pool, "6Gi"))
        rsv.wait_for(custom, namespace, f"w-{index}", phases=("Admitted", "Queued"))
    core.create_namespaced_pod(namespace, claim_pod("w-3", pool, "6Gi"))
    rsv.wait_for(custom, namespace, "w-3", phases=("Queued",))
    wait_ungated(core, namespace, "w-0")
    operator.kill()
    finish(core, namespace, "w-0")  # ends while nobody watches
    core.delete_namespaced_pod("w-1", namespace, grace_period_seconds=0)  # goes, waiting
    core.create_namespaced_pod(namespace, claim_pod("w-4", pool, "6Gi"))  # and a newcomer
    run_operator()

    assert pinned_to(wait_ungated(core, namespace, "w-2")) == [nodes["only"]]
    for name in ("w-3", "w-4"):
        assert gates_of(core.read_namespaced_pod(name, namespace)) == [GATE]

    def one_each() -> None:  # no second one for anyone; w-1's went with it
        names = sorted(r["metadata"]["name"] for r in rsv.list_all(custom, namespace))
        assert names == ["w-0", "w-2", "w-3", "w-4"]

    eventually(one_each)
    assert rsv.get(custom, namespace, "w-0")["status"]["reason"] == "OwnerPodFinished"

    def in_order() -> None:  # positions are published at most every summaryInterval
        positions = {
            name: rsv.get(custom, namespace, name)["status"].get("queuePosition")
            for name in ("w-3", "w-4")
        }
        assert positions == {"w-3": 1, "w-4": 2}

    eventually(in_order)


def test_an_ungate_refused_by_another_admission_plugin_releases_the_reservation(
    run_operator: Start,
    make_node: Callable[..., Any],
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """kueue#9492: admitted while the pod stays gated, because something else refused the
    ungate patch. Here the something else is a ValidatingAdmissionPolicy of the test's."""
    pool, _ = pool_nodes(make_node, core, only="32Gi")
    policies = client.AdmissionregistrationV1Api(api_client)
    name = f"keep-gates-{namespace}"
    policies.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["pods"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                },
                "validations": [
                    {
                        "expression": "size(object.spec.?schedulingGates.orValue([])) == "
                        "size(oldObject.spec.?schedulingGates.orValue([]))",
                        "message": "gates stay until the security review",
                    }
                ],
            },
        }
    )
    policies.create_validating_admission_policy_binding(
        {
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        }
    )
    try:
        # A new policy is enforced once the API server's policy informer has it; an
        # ungate sent before that lands. Probe with pods of a foreign gate until a
        # gate's removal is denied.
        in_force(core, namespace)
        run_operator()
        core.create_namespaced_pod(namespace, claim_pod("held", pool, "4Gi"))
        refused = rsv.wait_for(custom, namespace, "held", phases=("Reclaimed",), timeout=30)
        assert refused["status"]["reason"] == "UngateRefused"
        assert "gates stay until the security review" in refused["status"]["message"]
        assert gates_of(core.read_namespaced_pod("held", namespace)) == [GATE]
        eventually(lambda: _said(core, namespace, "held", "UngateRefused", "security review"))
    finally:
        policies.delete_validating_admission_policy_binding(name)
        policies.delete_validating_admission_policy(name)


def in_force(core: client.CoreV1Api, namespace: str) -> None:
    """Until the test's policy denies removing a gate (each probe pod is used once: a
    removed gate cannot be put back)."""
    for attempt in range(100):
        probe = f"probe-{attempt}"
        body = {
            "metadata": {"name": probe},
            "spec": {
                "containers": [{"name": "main", "image": "busybox"}],
                "schedulingGates": [{"name": "example.com/probe"}],
            },
        }
        core.create_namespaced_pod(namespace, body)
        try:
            core.patch_namespaced_pod(probe, namespace, {"spec": {"schedulingGates": None}})
        except client.ApiException as error:
            if error.status in (400, 403, 422) and "security review" in (error.body or ""):
                return
            raise
        time.sleep(0.2)
    raise AssertionError("the ValidatingAdmissionPolicy was never enforced")


def _said(core: client.CoreV1Api, namespace: str, pod: str, reason: str, text: str) -> None:
    said = [(e.reason, e.message) for e in events_of(core, namespace, pod)]
    assert any(r == reason and text in (m or "") for r, m in said), said
