"""Gated pods that tenants edit, imitate or crowd, on the real control plane (issue 29).

Each test here failed on the gating of issue 19 (main 2e1f900):

- a reservation a tenant made for the pod, owned by it and named as it, ungated it
  whatever it held (item 3);
- a pod whose claim label was removed, or whose claim became unreadable, while
  gated kept its reservation, and a pod carrying our gate without the label was
  never looked at (item 6);
- a pod whose node selector was narrowed while it waited was ungated where it
  could no longer run (item 7);
- a pod refused ``ReservationNameTaken`` left its planned room behind, and later
  pods avoided that node (item 9);
- a pod created while the claims were relisted was dropped (item 10);
- a pod's ``headroom.dev/Admitted`` condition, once lost, was never written again
  (item 11);
- one namespace whose reservation creates fail stopped every other namespace's
  pods (item 12).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from headroom.api.config import parse_config
from headroom.control.controller import Controller
from headroom.kube.client import KubeClient
from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane
from headroom_dev.faults import FaultyTransport, Rule
from headroom_dev.operator import OperatorProcess
from tests.integration.test_pod_gates import (
    GATE,
    _said,
    claim_pod,
    finish,
    gates_of,
    pinned_to,
    pool_nodes,
    untaint,
    wait_ungated,
)
from tests.polling import eventually

Start = Callable[..., OperatorProcess]
CONDITION = "headroom.dev/Admitted"


def ours(core: client.CoreV1Api, namespace: str, name: str) -> list[tuple[str, str]]:
    """The pod's headroom.dev/Admitted conditions, as (status, reason)."""
    conditions = core.read_namespaced_pod(name, namespace).status.conditions or []
    return [(c.status, c.reason) for c in conditions if c.type == CONDITION]


def reservation_names(custom: client.CustomObjectsApi, namespace: str) -> list[str]:
    return sorted(r["metadata"]["name"] for r in rsv.list_all(custom, namespace))


# -- item 3: only the operator's own reservation ungates a pod -----------------------------


def _forge(
    custom: client.CustomObjectsApi, namespace: str, pod: client.V1Pod, node: str, **spec: Any
) -> dict[str, Any]:
    """A Reservation owned by the pod and named as it, as the operator's would be, but
    for 1 MiB (and ``spec`` on top)."""
    forged = {
        "apiVersion": "headroom.dev/v1alpha1",
        "kind": "Reservation",
        "metadata": {
            "name": pod.metadata.name,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod.metadata.name,
                    "uid": pod.metadata.uid,
                }
            ],
        },
        "spec": {
            "node": node,
            "ramMB": 1,
            "owner": {"pod": pod.metadata.name, "surface": "pod"},
            "liveness": "Pod",
            **spec,
        },
    }
    made: dict[str, Any] = custom.create_namespaced_custom_object(
        "headroom.dev", "v1alpha1", namespace, "reservations", forged
    )
    return made


def test_a_reservation_a_tenant_made_for_the_pod_does_not_ungate_it(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """One for another owner never lets the pod out: it stays gated and says why."""
    pool, nodes = pool_nodes(make_node, core, only="16Gi")
    pod = core.create_namespaced_pod(namespace, claim_pod("p", pool, "8Gi"))
    _forge(custom, namespace, pod, nodes["only"], owner={"pod": "q", "surface": "pod"})
    run_operator()

    eventually(
        lambda: _said(core, namespace, "p", "ReservationNameTaken", "owner.pod q, not p"),
        timeout=20,
    )
    eventually(lambda: _check(ours(core, namespace, "p") == [("False", "ReservationNameTaken")]))
    assert gates_of(core.read_namespaced_pod("p", namespace)) == [GATE]
    assert ours(core, namespace, "p") == [("False", "ReservationNameTaken")]


def test_a_reservation_for_another_size_never_ungates_the_pod_but_is_replaced(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """One of the operator's shape for another claim (a forgery, or the operator's own
    made before the pod was resized) is replaced by the one for its claim, and only that
    one lets the pod out (it said ReservationNameTaken and stayed gated for ever until
    the simulation found a resized pod stranded so, seed 29)."""
    pool, nodes = pool_nodes(make_node, core, only="16Gi")
    pod = core.create_namespaced_pod(namespace, claim_pod("p", pool, "8Gi"))
    forged = _forge(custom, namespace, pod, nodes["only"])
    run_operator()

    ungated = wait_ungated(core, namespace, "p")
    held = rsv.wait_for(custom, namespace, "p", phases=("Admitted",))
    assert held["metadata"]["uid"] != forged["metadata"]["uid"]
    assert held["spec"]["ramMB"] == 8192
    assert pinned_to(ungated) == [nodes["only"]]
    _said(core, namespace, "p", "ClaimChanged", "ramMB 1, not 8192")


# -- item 6: every gated pod is followed, whatever its labels ------------------------------


def test_a_gated_pod_whose_claim_label_is_removed_gives_its_reservation_back_and_goes(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool, _ = pool_nodes(make_node, core, only="8Gi")  # room for one 6Gi pod
    run_operator()
    core.create_namespaced_pod(namespace, claim_pod("first", pool, "6Gi"))
    wait_ungated(core, namespace, "first")
    core.create_namespaced_pod(namespace, claim_pod("second", pool, "6Gi"))
    rsv.wait_for(custom, namespace, "second", phases=("Queued",))

    core.patch_namespaced_pod(
        "second", namespace, {"metadata": {"labels": {"headroom.dev/claim": None}}}
    )

    eventually(lambda: _check("second" not in reservation_names(custom, namespace)), timeout=20)
    eventually(lambda: _check(gates_of(core.read_namespaced_pod("second", namespace)) == []))
    eventually(lambda: _said(core, namespace, "second", "NotClaimed", "headroom.dev/claim"))
    assert ours(core, namespace, "second") == [("False", "NotClaimed")]
    assert reservation_names(custom, namespace) == ["first"]


def test_a_gated_pod_whose_claim_becomes_unreadable_gives_its_reservation_back_and_waits(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool, _ = pool_nodes(make_node, core, only="8Gi")
    run_operator()
    core.create_namespaced_pod(namespace, claim_pod("first", pool, "6Gi"))
    wait_ungated(core, namespace, "first")
    core.create_namespaced_pod(namespace, claim_pod("second", pool, "6Gi"))
    rsv.wait_for(custom, namespace, "second", phases=("Queued",))

    bad = {"metadata": {"annotations": {"headroom.dev/ram": "banana"}}}
    core.patch_namespaced_pod("second", namespace, bad)

    eventually(lambda: _check("second" not in reservation_names(custom, namespace)), timeout=20)
    eventually(lambda: _said(core, namespace, "second", "BadClaim", "banana"))
    eventually(lambda: _check(ours(core, namespace, "second") == [("False", "BadClaim")]))
    assert gates_of(core.read_namespaced_pod("second", namespace)) == [GATE]

    # Mended, it is placed again.
    core.patch_namespaced_pod(
        "second", namespace, {"metadata": {"annotations": {"headroom.dev/ram": "1Gi"}}}
    )
    wait_ungated(core, namespace, "second")


def test_a_pod_carrying_our_gate_without_the_claim_label_is_let_go(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    pool, _ = pool_nodes(make_node, core, only="8Gi")
    run_operator()
    body = claim_pod("stray", pool, "1Gi")
    del body["metadata"]["labels"]
    core.create_namespaced_pod(namespace, body)

    eventually(
        lambda: _check(gates_of(core.read_namespaced_pod("stray", namespace)) == []), timeout=20
    )
    eventually(lambda: _said(core, namespace, "stray", "NotClaimed", "headroom.dev/claim"))


# -- item 7: the pod's constraints are checked again before it is pinned -------------------


def test_a_pod_narrowed_off_its_node_while_it_waits_is_placed_again(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool, nodes = pool_nodes(make_node, core, x="8Gi", y="8Gi")  # room for one 6Gi pod each
    run_operator()
    for name, size in (("fx", "x"), ("fy", "y")):
        body = claim_pod(name, pool, "6Gi", spec={"nodeSelector": {"pool": pool, "size": size}})
        core.create_namespaced_pod(namespace, body)
        wait_ungated(core, namespace, name)
    core.create_namespaced_pod(namespace, claim_pod("mover", pool, "6Gi"))
    waiting = rsv.wait_for(custom, namespace, "mover", phases=("Queued",))
    first_node = waiting["spec"]["node"]
    other = "y" if first_node == nodes["x"] else "x"

    # Kubernetes lets a gated pod's nodeSelector gain entries (Kueue does so).
    narrowed = {"spec": {"nodeSelector": {"pool": pool, "size": other}}}
    core.patch_namespaced_pod("mover", namespace, narrowed)

    def moved() -> None:
        # Between the old one's deletion and the new one's creation there is none.
        names = {r["metadata"]["name"]: r for r in rsv.list_all(custom, namespace)}
        assert "mover" in names, "not made again yet"
        assert names["mover"]["spec"]["node"] == nodes[other]

    eventually(moved, timeout=20)
    finish(core, namespace, f"f{other}")
    assert pinned_to(wait_ungated(core, namespace, "mover")) == [nodes[other]]


def test_a_pod_is_not_pinned_to_a_node_cordoned_before_its_ungate(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool, nodes = pool_nodes(make_node, core, x="8Gi", y="8Gi")
    run_operator()
    for name, size in (("fx", "x"), ("fy", "y")):
        body = claim_pod(name, pool, "6Gi", spec={"nodeSelector": {"pool": pool, "size": size}})
        core.create_namespaced_pod(namespace, body)
        wait_ungated(core, namespace, name)
    core.create_namespaced_pod(namespace, claim_pod("mover", pool, "6Gi"))
    waiting = rsv.wait_for(custom, namespace, "mover", phases=("Queued",))
    first, other = ("x", "y") if waiting["spec"]["node"] == nodes["x"] else ("y", "x")

    core.patch_node(nodes[first], {"spec": {"unschedulable": True}})
    finish(core, namespace, f"f{first}")  # room where it waits, but it is cordoned now
    finish(core, namespace, f"f{other}")
    assert pinned_to(wait_ungated(core, namespace, "mover")) == [nodes[other]]


# -- item 9: every exit clears what was planned ----------------------------------------------


def test_a_pod_refused_its_name_leaves_no_phantom_room_behind(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool, nodes = pool_nodes(make_node, core, small="8Gi", big="32Gi")
    elsewhere = f"elsewhere-{pool}"  # outside the pool: no pod of the test goes there
    make_node(elsewhere, memory="8Gi")
    untaint(core, elsewhere)
    rsv.create(custom, namespace, "p", elsewhere, 1)  # a tenant's, owned by no pod
    run_operator()
    rsv.wait_for(custom, namespace, "p")  # Admitted, and decided once for all
    core.create_namespaced_pod(namespace, claim_pod("p", pool, "30Gi"))  # planned on big
    eventually(
        lambda: _said(core, namespace, "p", "ReservationNameTaken", "no pod owns"), timeout=20
    )

    core.create_namespaced_pod(namespace, claim_pod("q", pool, "4Gi"))
    assert rsv.wait_for(custom, namespace, "q")["spec"]["node"] == nodes["big"]  # the roomiest


# -- item 11: the condition is made to match at every pass ---------------------------------


def test_an_admitted_pods_lost_condition_is_written_again(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    pool, _ = pool_nodes(make_node, core, only="8Gi")
    run_operator()
    core.create_namespaced_pod(namespace, claim_pod("p", pool, "1Gi"))
    wait_ungated(core, namespace, "p")
    eventually(lambda: _check(ours(core, namespace, "p") == [("True", "Admitted")]))

    # As a restart in the middle of the ungate leaves it: the condition not written.
    lost = {"status": {"conditions": [{"type": CONDITION, "status": "False", "reason": "Lost"}]}}
    patched = core.patch_namespaced_pod_status("p", namespace, lost)
    # What the patch left (a read after it may already see the operator's rewrite).
    assert [
        (c.status, c.reason) for c in patched.status.conditions or [] if c.type == CONDITION
    ] == [("False", "Lost")]

    eventually(lambda: _check(ours(core, namespace, "p") == [("True", "Admitted")]), timeout=20)


def test_a_pod_ungated_while_the_operator_was_down_gets_its_condition(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    pool, _ = pool_nodes(make_node, core, only="8Gi")
    operator = run_operator()
    core.create_namespaced_pod(namespace, claim_pod("p", pool, "1Gi"))
    wait_ungated(core, namespace, "p")
    eventually(lambda: _check(ours(core, namespace, "p") == [("True", "Admitted")]))
    operator.kill()
    core.patch_namespaced_pod_status(
        "p", namespace, [{"op": "remove", "path": "/status/conditions"}]
    )
    assert ours(core, namespace, "p") == []
    run_operator()

    eventually(lambda: _check(ours(core, namespace, "p") == [("True", "Admitted")]), timeout=20)


# -- item 12: one namespace's failing creates stall nobody else ----------------------------


@pytest.fixture
def failing_creates(
    api_client: client.ApiClient, make_namespace: Callable[[], str]
) -> Iterator[str]:
    """A namespace whose Reservation creates fail with a 500, for as long as it exists: a
    validating webhook that nobody serves, with failurePolicy Fail."""
    troubled = make_namespace()
    hooks = client.AdmissionregistrationV1Api(api_client)
    name = f"unserved-{troubled}"
    hooks.create_validating_webhook_configuration(
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "unserved.example.com",
                    "clientConfig": {"url": "https://127.0.0.1:9/nobody"},
                    "rules": [
                        {
                            "apiGroups": ["headroom.dev"],
                            "apiVersions": ["v1alpha1"],
                            "operations": ["CREATE"],
                            "resources": ["reservations"],
                        }
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": troubled}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 1,
                }
            ],
        }
    )
    try:
        yield troubled
    finally:
        hooks.delete_validating_webhook_configuration(name)


def test_one_namespaces_failing_creates_do_not_stall_another_namespaces_pods(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    failing_creates: str,
) -> None:
    pool, _ = pool_nodes(make_node, core, only="16Gi")

    def refused() -> None:  # the webhook is in force: a create there answers 500
        try:
            rsv.create(custom, failing_creates, f"probe-{uuid.uuid4().hex[:6]}", "n", 1)
            status = 201
        except client.ApiException as error:
            status = error.status
        assert status == 500, status

    eventually(refused)
    run_operator()
    core.create_namespaced_pod(failing_creates, claim_pod("stuck", pool, "1Gi"))
    core.create_namespaced_pod(namespace, claim_pod("free", pool, "1Gi"))

    wait_ungated(core, namespace, "free")
    assert gates_of(core.read_namespaced_pod("stuck", failing_creates)) == [GATE]
    assert reservation_names(custom, failing_creates) == []


# -- item 10: a pod created while the claims are relisted is kept ---------------------------


@pytest.fixture
async def inprocess(
    control_plane: ControlPlane, crds: list[str]
) -> AsyncIterator[tuple[FaultyTransport, list[Controller]]]:
    kube = KubeClient(control_plane.admin_credentials())
    started: list[Controller] = []
    yield FaultyTransport(kube), started
    for controller in started:
        await controller.stop()
    await kube.close()


async def test_a_pod_created_while_the_claims_are_relisted_is_not_dropped(
    inprocess: tuple[FaultyTransport, list[Controller]],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    transport, started = inprocess
    pool, nodes = await asyncio.to_thread(pool_nodes, make_node, core, only="8Gi")
    config = parse_config("{sweepPeriod: 100ms, summaryInterval: 100ms, resyncPeriod: 1h}")
    controller = Controller(config, transport)
    started.append(controller)
    await controller.start()
    await asyncio.to_thread(core.create_namespaced_pod, namespace, claim_pod("first", pool, "6Gi"))
    await asyncio.to_thread(wait_ungated, core, namespace, "first")

    slow = transport.add(Rule("LIST", "/pods", "hold", times=1))
    relist = asyncio.create_task(controller.gates.relist())
    await slow.reached.wait()  # the list's snapshot is taken: it lacks "late"
    await asyncio.to_thread(core.create_namespaced_pod, namespace, claim_pod("late", pool, "6Gi"))
    await asyncio.to_thread(rsv.wait_for, custom, namespace, "late", phases=("Queued",))

    def told_waiting() -> None:  # its last change before the relist ends
        assert ours(core, namespace, "late") == [("False", "Waiting")]

    await asyncio.to_thread(eventually, told_waiting)
    slow.release()
    await relist

    await asyncio.to_thread(finish, core, namespace, "first")  # room for it now
    pod = await asyncio.to_thread(wait_ungated, core, namespace, "late")
    assert pinned_to(pod) == [nodes["only"]]


def _check(condition: bool) -> None:
    assert condition
