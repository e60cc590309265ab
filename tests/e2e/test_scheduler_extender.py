"""The node chosen by the real kube-scheduler among the nodes where the ledger has room
(issue 30 item 1, being built).

A second stock kube-scheduler (profile ``headroom``) asks the operator, as its extender,
which feasible nodes have room (filter), how the node policy ranks them (prioritize),
and binds through it (bind): the pod's reservation is admitted on the chosen node and
its decision written before the Binding. kube-scheduler's own predicates (CPU here)
still hold. What is checked is what the API holds, not what the operator says.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane
from headroom_dev.nodes import create_node
from headroom_dev.operator import OperatorProcess
from headroom_dev.process import free_port
from headroom_dev.scheduler import (
    SCHEDULER_NAME,
    HeadroomScheduler,
    client_files,
    extender_over_tls,
)
from headroom_dev.service import LoopbackService
from tests.integration.test_chart import render
from tests.integration.test_pod_gates import untaint
from tests.integration.test_webhook import Gate
from tests.polling import eventually


@pytest.fixture(scope="module")
def api(controllers_api: client.ApiClient) -> client.ApiClient:
    return controllers_api


def on_loopback(port: int) -> dict[str, Any]:
    """The operator config that serves the extender on this machine's ``port``, plain
    HTTP (a local run's)."""
    return {"extenderPort": port, "extenderHost": "127.0.0.1"}


@dataclass
class Extender:
    operator: OperatorProcess
    url: str


@pytest.fixture
def extender(
    api: client.ApiClient, controllers_plane: ControlPlane, tmp_path: Path
) -> Iterator[Extender]:
    """One operator and the scheduler, over HTTPS as the chart runs them."""
    core = client.CoreV1Api(api)
    namespace = f"ext-tls-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    port = free_port()
    config = extender_over_tls(port, namespace)
    operator = OperatorProcess(controllers_plane.kubeconfig, tmp_path, config).start()
    operator.wait_ready(body="ok")
    url = f"https://127.0.0.1:{port}"
    files = client_files(core, namespace, tmp_path / "client")
    scheduler = HeadroomScheduler(controllers_plane, url, client_tls=files).start()
    yield Extender(operator, url)
    scheduler.stop()
    operator.stop()
    core.delete_namespace(namespace)


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


def reservation_of(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "headroom.dev", "v1alpha1", namespace, "reservations", name
    )
    return found


def assert_bound_on_its_admission(api: client.ApiClient, namespace: str, name: str) -> str:
    """The pod is bound, and to the node where its own reservation is Admitted."""
    core = client.CoreV1Api(api)
    pod = core.read_namespaced_pod(name, namespace)
    node = pod.spec.node_name
    assert node, f"pod {name} not bound"
    reservation = reservation_of(api, namespace, name)
    owners = reservation["metadata"]["ownerReferences"]
    assert [o["uid"] for o in owners] == [pod.metadata.uid]
    assert reservation["spec"]["node"] == node
    assert (reservation.get("status") or {}).get("phase") == "Admitted", reservation.get("status")
    assert (pod.metadata.annotations or {}).get("headroom.dev/reservation") == name
    return str(node)


def unschedulable(core: client.CoreV1Api, namespace: str, name: str) -> str:
    """The message of the pod's PodScheduled condition, once the scheduler left it
    Unschedulable (an AssertionError before, for ``eventually``)."""
    pod = core.read_namespaced_pod(name, namespace)
    found = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
    assert found, "not tried yet"
    assert found[0].reason == "Unschedulable", found[0]
    return str(found[0].message)


def all_bound(core: client.CoreV1Api, namespace: str) -> list[str]:
    """Every pod of the namespace bound (their names), or the unbound ones and why."""
    pods = core.list_namespaced_pod(namespace).items
    unbound = [(p.metadata.name, p.status.conditions) for p in pods if not p.spec.node_name]
    assert not unbound, unbound
    return [p.metadata.name for p in pods]


def assert_each_bound_once(
    api: client.ApiClient, namespace: str, names: list[str], count: int, *, mib_each: int
) -> None:
    """``count`` pods, each bound on its own Admitted reservation, no other reservation
    in the namespace, and no node's admitted pods past its RAM limit (read from the API)."""
    custom = client.CustomObjectsApi(api)
    assert len(names) == count
    used: dict[str, int] = {}
    for name in names:
        node = assert_bound_on_its_admission(api, namespace, name)
        used[node] = used.get(node, 0) + mib_each
    reservations = custom.list_namespaced_custom_object(
        "headroom.dev", "v1alpha1", namespace, "reservations"
    )["items"]
    assert sorted(r["metadata"]["name"] for r in reservations) == sorted(names)
    for node, mib in used.items():
        # Published by the summary flush (every summaryInterval), not with the binds: a
        # node's first NodeHeadroom may still be on its way when the last pod is bound.
        status: dict[str, Any] = eventually(
            lambda node=node: published_status(custom, node),
            timeout=10,
            retry_on=(AssertionError, client.exceptions.ApiException),
        )
        assert mib <= status["limitRAMMB"], (node, mib, status)


def published_status(custom: client.CustomObjectsApi, node: str) -> dict[str, Any]:
    """The node's NodeHeadroom status, once written (created first, its status next)."""
    summary = custom.get_cluster_custom_object("headroom.dev", "v1alpha1", "nodeheadrooms", node)
    status: dict[str, Any] = summary.get("status") or {}
    assert "limitRAMMB" in status, summary
    return status


def test_the_scheduler_places_a_claim_pod_where_the_ledger_has_room_and_its_cpu_fits(
    api: client.ApiClient, extender: Extender, pool: tuple[str, str, dict[str, str]]
) -> None:
    core = client.CoreV1Api(api)
    namespace, label, nodes = pool
    # The most RAM is on roomy, but its one CPU does not hold 2: kube-scheduler's verdict.
    core.create_namespaced_pod(namespace, claim_pod("cpu-bound", label, "4Gi", cpu="2"))
    assert eventually(lambda: bound_to(core, namespace, "cpu-bound"), timeout=30) == nodes["cpu"]
    assert assert_bound_on_its_admission(api, namespace, "cpu-bound") == nodes["cpu"]
    # 16 GiB fits on roomy and cpu only; the node policy (spread) prefers the most RAM left.
    core.create_namespaced_pod(namespace, claim_pod("big", label, "16Gi"))
    assert eventually(lambda: bound_to(core, namespace, "big"), timeout=30) == nodes["roomy"]
    assert assert_bound_on_its_admission(api, namespace, "big") == nodes["roomy"]


def test_a_claim_pod_no_node_has_room_for_waits_saying_why(
    api: client.ApiClient, extender: Extender, pool: tuple[str, str, dict[str, str]]
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


def test_two_schedulers_binding_the_same_pods_make_one_reservation_each_and_never_overcommit(
    api: client.ApiClient,
    controllers_plane: ControlPlane,
    extender: Extender,
    pool: tuple[str, str, dict[str, str]],
) -> None:
    """A second scheduler without leader election: both filter and bind every pod (the
    design's spike, M10). Each pod gets one reservation, is bound once, on the node where
    that reservation is Admitted; the ledger's limit holds on every node."""
    core = client.CoreV1Api(api)
    namespace, label, _ = pool
    second = HeadroomScheduler(
        controllers_plane,
        extender.url,
        name="headroom-scheduler-2",
    ).start()
    try:
        # 24 x 3 GiB = 72 GiB: more than small (8 GiB) and cpu (32 GiB) hold, so binds
        # are refused there by the ledger in races, and the rest goes to roomy, whose one
        # CPU holds 24 x 10m.
        for index in range(24):
            core.create_namespaced_pod(namespace, claim_pod(f"p{index}", label, "3Gi", "10m"))

        names = eventually(lambda: all_bound(core, namespace), timeout=60)
    finally:
        second.stop()
    assert_each_bound_once(api, namespace, names, 24, mib_each=3 * 1024)


def test_with_placement_by_the_scheduler_the_webhook_hands_opted_in_pods_to_it(
    api: client.ApiClient,
    controllers_plane: ControlPlane,
    pool: tuple[str, str, dict[str, str]],
    tmp_path: Path,
) -> None:
    """``placement.mode: scheduler``: a pod that names no scheduler is given ``headroom``
    by the webhook, not the gate, and is bound where its claim is admitted."""
    core = client.CoreV1Api(api)
    namespace, label, nodes = pool
    excluded = f"ext-excluded-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": excluded}})
    gate = Gate(client.AdmissionregistrationV1Api(api), namespace, excluded)
    gate.register()
    port = free_port()
    config = {**gate.config(), "placement": {"mode": "scheduler"}, **on_loopback(port)}
    operator = OperatorProcess(controllers_plane.kubeconfig, tmp_path, config).start()
    scheduler = None
    try:
        operator.wait_ready(body="ok")
        scheduler = HeadroomScheduler(controllers_plane, f"http://127.0.0.1:{port}").start()
        body = claim_pod("via-webhook", label, "4Gi", cpu="2")
        del body["spec"]["schedulerName"]

        def created() -> None:  # once the API server trusts the published caBundle
            core.create_namespaced_pod(namespace, body)

        eventually(created, timeout=30)
        pod = core.read_namespaced_pod("via-webhook", namespace)
        assert pod.spec.scheduler_name == SCHEDULER_NAME
        assert not pod.spec.scheduling_gates
        assert (
            eventually(lambda: bound_to(core, namespace, "via-webhook"), timeout=30)
            == (
                nodes["cpu"]  # roomy has the most RAM, but not the 2 CPUs
            )
        )
        assert assert_bound_on_its_admission(api, namespace, "via-webhook") == nodes["cpu"]
    finally:
        # Removed first: a Fail-policy webhook left behind would refuse later tests' pods.
        client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(gate.name)
        if scheduler is not None:
            scheduler.stop()
        operator.stop()
        core.delete_namespace(excluded)


def test_a_pod_waiting_for_ledger_room_is_bound_soon_after_room_comes_back(
    api: client.ApiClient, extender: Extender, pool: tuple[str, str, dict[str, str]]
) -> None:
    """No cluster event tells kube-scheduler that the ledger has room again (it would try
    the pod again after five minutes); the operator nudges the pod, so it binds at once."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    namespace, label, nodes = pool
    # small (8 GiB, limit 7 GiB) is the only node the pod may use; a reservation fills it.
    rsv.create(custom, namespace, "filler", nodes["small"], 7 * 1024)
    body = claim_pod("patient", label, "4Gi")
    body["metadata"]["annotations"]["headroom.dev/node"] = nodes["small"]
    core.create_namespaced_pod(namespace, body)

    message = eventually(lambda: unschedulable(core, namespace, "patient"), timeout=30)
    # The ledger's reason: no room (its first try), or waiting in the node's queue since.
    assert "headroom: InsufficientRAM" in message or "headroom: Queued" in message, message
    time.sleep(2)  # past the scheduler's first, immediate retry
    rsv.delete(custom, namespace, "filler")
    released = time.monotonic()
    assert eventually(lambda: bound_to(core, namespace, "patient"), timeout=30) == nodes["small"]
    assert time.monotonic() - released < 10  # not the scheduler's five-minute flush
    assert assert_bound_on_its_admission(api, namespace, "patient") == nodes["small"]
    nudged = core.read_namespaced_pod("patient", namespace).metadata.annotations
    assert "headroom.dev/room" in nudged


def queued(api: client.ApiClient, namespace: str, name: str) -> int:
    """The position of the pod's reservation in its node's queue (AssertionError until
    it waits there)."""
    try:
        status = reservation_of(api, namespace, name).get("status") or {}
    except client.ApiException as error:
        raise AssertionError(f"no reservation for {name} yet: {error.status}") from error
    assert status.get("phase") == "Queued", status
    return int(status["queuePosition"])


def headroom_condition(core: client.CoreV1Api, namespace: str, name: str) -> tuple[str, str]:
    pod = core.read_namespaced_pod(name, namespace)
    found = [c for c in pod.status.conditions or [] if c.type == "headroom.dev/Admitted"]
    assert found, pod.status.conditions
    return found[0].status, found[0].reason


def test_pods_no_node_has_room_for_wait_in_the_ledgers_queue_in_turn_whatever_their_priority(
    api: client.ApiClient, extender: Extender, pool: tuple[str, str, dict[str, str]]
) -> None:
    """A pod the ledger finds no room for waits in the ledger's queue of a node, in turn
    with every other claim there, as a gated pod does. When room comes back the first in
    line is admitted and bound; kube-scheduler's own order (priority first) would have
    bound the later, more urgent one."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    scheduling = client.SchedulingV1Api(api)
    namespace, label, nodes = pool
    urgent = f"urgent-{label}"
    scheduling.create_priority_class({"metadata": {"name": urgent}, "value": 1000})
    try:
        rsv.create(custom, namespace, "filler", nodes["small"], 7 * 1024)
        for name, priority in (("first", None), ("second", urgent)):
            body = claim_pod(name, label, "4Gi")
            body["metadata"]["annotations"]["headroom.dev/node"] = nodes["small"]
            if priority is not None:
                body["spec"]["priorityClassName"] = priority
            core.create_namespaced_pod(namespace, body)
            eventually(lambda name=name: queued(api, namespace, name), timeout=30)
        assert queued(api, namespace, "second") == 2
        assert eventually(lambda: headroom_condition(core, namespace, "second")) == (
            "False",
            "Waiting",
        )
        rsv.delete(custom, namespace, "filler")
        released = time.monotonic()
        assert eventually(lambda: bound_to(core, namespace, "first"), timeout=30) == nodes["small"]
        assert time.monotonic() - released < 10  # nudged, not the scheduler's flush
        assert assert_bound_on_its_admission(api, namespace, "first") == nodes["small"]

        def next_in_line() -> None:
            assert queued(api, namespace, "second") == 1  # 3 GiB left: it waits on

        eventually(next_in_line)
        time.sleep(3)  # the scheduler tried it again meanwhile: still the ledger's turn
        assert not core.read_namespaced_pod("second", namespace).spec.node_name
        assert queued(api, namespace, "second") == 1
    finally:
        scheduling.delete_priority_class(urgent)


def test_a_new_leader_nudges_the_pods_an_earlier_one_left_waiting_for_room(
    api: client.ApiClient,
    controllers_plane: ControlPlane,
    pool: tuple[str, str, dict[str, str]],
    tmp_path: Path,
) -> None:
    """Only the leader knows which pods wait for ledger room. Room that comes back while
    no operator runs (a reservation deleted meanwhile) is found by the next one at its
    start, which nudges the pods the scheduler left unschedulable: bound in seconds, not
    at the scheduler's five-minute flush."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    namespace, label, nodes = pool
    rsv.create(custom, namespace, "filler", nodes["small"], 7 * 1024)
    port = free_port()
    operators = [
        OperatorProcess(controllers_plane.kubeconfig, tmp_path / name, on_loopback(port))
        for name in ("first", "next")
    ]
    for operator in operators:
        operator.workdir.mkdir()
    first, following = operators
    first.start(wait_ready=False).wait_ready(body="ok")
    scheduler = HeadroomScheduler(controllers_plane, f"http://127.0.0.1:{port}").start()
    try:
        body = claim_pod("patient", label, "4Gi")
        body["metadata"]["annotations"]["headroom.dev/node"] = nodes["small"]
        core.create_namespaced_pod(namespace, body)

        eventually(lambda: unschedulable(core, namespace, "patient"), timeout=30)
        first.stop()
        rsv.delete(custom, namespace, "filler")  # seen by no operator
        time.sleep(2)
        following.start(wait_ready=False).wait_ready(body="ok")
        ready = time.monotonic()
        bound = eventually(lambda: bound_to(core, namespace, "patient"), timeout=30)
        assert time.monotonic() - ready < 10  # not the scheduler's five-minute flush
    finally:
        scheduler.stop()
        for operator in operators:
            operator.stop()
    assert bound == nodes["small"]
    assert assert_bound_on_its_admission(api, namespace, "patient") == nodes["small"]
    nudged = core.read_namespaced_pod("patient", namespace).metadata.annotations
    assert "headroom.dev/room" in nudged


def test_the_leader_killed_while_it_binds_leaves_no_pod_bound_without_its_admission(
    api: client.ApiClient,
    controllers_plane: ControlPlane,
    pool: tuple[str, str, dict[str, str]],
    tmp_path: Path,
) -> None:
    """Two replicas behind one Service (a loopback stand-in for kube-proxy); the leader is
    SIGKILLed while it binds a burst. The standby answers 503 until it leads (the
    scheduler retries), then binds the rest; checked against the API, not the operator."""
    core = client.CoreV1Api(api)
    namespace, label, _ = pool
    election = {
        "enabled": True,
        "namespace": namespace,
        "leaseName": f"lease-{label}",
        "leaseDuration": "4s",
        "renewDeadline": "3s",
        "retryPeriod": "1s",
    }
    ports = [free_port(), free_port()]
    replicas = []
    for index, port in enumerate(ports):
        workdir = tmp_path / f"replica-{index}"
        workdir.mkdir()
        config = {"leaderElection": election, **extender_over_tls(port, namespace)}
        replicas.append(OperatorProcess(controllers_plane.kubeconfig, workdir, config))
    leader, standby = replicas
    leader.start(wait_ready=False).wait_ready(body="ok")
    standby.start(wait_ready=False).wait_ready(body="standby")
    service = LoopbackService(ports).start()
    url = f"https://127.0.0.1:{service.port}"  # one CA: the replicas share its Secret
    files = client_files(core, namespace, tmp_path / "client")
    scheduler = HeadroomScheduler(controllers_plane, url, client_tls=files).start()
    try:
        for index in range(30):
            core.create_namespaced_pod(namespace, claim_pod(f"p{index}", label, "3Gi", "10m"))

        def some_bound() -> None:
            pods = core.list_namespaced_pod(namespace).items
            assert sum(1 for p in pods if p.spec.node_name) >= 5

        eventually(some_bound, timeout=60)
        leader.kill()

        names = eventually(lambda: all_bound(core, namespace), timeout=120)
    finally:
        scheduler.stop()
        service.stop()
        for replica in replicas:
            replica.stop()
    assert_each_bound_once(api, namespace, names, 30, mib_each=3 * 1024)


def test_pod_anti_affinity_and_topology_spread_hold_for_claim_pods(
    api: client.ApiClient, extender: Extender, pool: tuple[str, str, dict[str, str]]
) -> None:
    """The node policy (spread: most RAM left) would put every pod on roomy; the pods'
    own anti-affinity and spread constraints, kube-scheduler's to enforce, win."""
    core = client.CoreV1Api(api)
    namespace, label, nodes = pool
    for node in nodes.values():
        core.patch_node(node, {"metadata": {"labels": {"kubernetes.io/hostname": node}}})
    apart = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"group": "apart"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    for index in range(3):
        body = claim_pod(f"apart-{index}", label, "1Gi", "10m")
        body["metadata"]["labels"]["group"] = "apart"
        body["spec"]["affinity"] = apart
        core.create_namespaced_pod(namespace, body)
    spread = {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"group": "spread"}},
    }
    for index in range(6):
        body = claim_pod(f"spread-{index}", label, "1Gi", "10m")
        body["metadata"]["labels"]["group"] = "spread"
        body["spec"]["topologySpreadConstraints"] = [spread]
        core.create_namespaced_pod(namespace, body)

    def placed(group: str, count: int) -> list[str]:
        found = [f"{group}-{index}" for index in range(count)]
        return [bound_to(core, namespace, name) for name in found]

    apart_nodes = eventually(lambda: placed("apart", 3), timeout=60)
    assert sorted(apart_nodes) == sorted(nodes.values())
    spread_nodes = eventually(lambda: placed("spread", 6), timeout=60)
    assert {node: spread_nodes.count(node) for node in nodes.values()} == {
        node: 2 for node in nodes.values()
    }
    for name in [f"apart-{i}" for i in range(3)] + [f"spread-{i}" for i in range(6)]:
        assert_bound_on_its_admission(api, namespace, name)


def test_the_charts_scheduler_configuration_binds_through_the_charts_operator_config(
    api: client.ApiClient,
    controllers_plane: ControlPlane,
    pool: tuple[str, str, dict[str, str]],
    tmp_path: Path,
) -> None:
    """What ``scheduler.enabled`` renders, run: the operator with the chart's config (its
    placement and extender port; this machine's ports and no webhook), kube-scheduler with
    the chart's KubeSchedulerConfiguration (its URL a loopback one, no leader election)."""
    core = client.CoreV1Api(api)
    namespace, label, nodes = pool
    docs = render('scheduler={"enabled": true}')
    configs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    operator_config = yaml.safe_load(configs["headroom-config"]["data"]["config.yaml"])
    scheduler_config = yaml.safe_load(configs["headroom-scheduler"]["data"]["config.yaml"])
    port = free_port()
    local = {
        "placement": operator_config["placement"],
        **extender_over_tls(port, namespace),
        "extenderClientSecret": operator_config["extenderClientSecret"],
    }
    operator = OperatorProcess(controllers_plane.kubeconfig, tmp_path, local).start()
    scheduler = None
    try:
        operator.wait_ready(body="ok")
        scheduler = HeadroomScheduler(
            controllers_plane,
            f"https://127.0.0.1:{port}",
            name="chart-scheduler",
            config=scheduler_config,
            client_tls=client_files(core, namespace, tmp_path / "client"),
        ).start()
        core.create_namespaced_pod(namespace, claim_pod("charted", label, "4Gi", cpu="2"))
        assert eventually(lambda: bound_to(core, namespace, "charted"), timeout=30) == nodes["cpu"]
        assert assert_bound_on_its_admission(api, namespace, "charted") == nodes["cpu"]
    finally:
        if scheduler is not None:
            scheduler.stop()
        operator.stop()
