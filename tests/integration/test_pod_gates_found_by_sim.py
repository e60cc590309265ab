"""Gated pods on the real control plane: what the simulation found (issue 29, Tests).

Each test here is a schedule of ``headroom_dev.sim`` that broke a promise, reduced
to the step that broke it and played on the real API server:

- a gated pod's condition whose write failed (a 500, a refused connection) was
  never written again while nothing about the pod changed: a pod that can go
  nowhere, or whose reservation was refused, said nothing, or the wrong thing,
  for ever (seeds 4, 32 and 136 of the simulation);
- a gated pod whose size was changed while it waited kept the reservation made for
  its old size, which it could never use, and stayed gated for ever, saying
  ``ReservationNameTaken`` (seed 29);
- a gated pod's reservation waiting for its quota stayed Queued for its whole wait
  (24 hours by default) after the admin changed the quota so that it could never be
  admitted (a nodeSelector without its node, a maxWait under its wait), saying
  ``Waiting`` with the quota's old figures, while pods created after it were told
  why (seed 325);
- a gated pod narrowed (nodeSelector) between the operator's last look and its
  ungate patch (a retry of it, say) was ungated pinned to a node it may not run on,
  and its reservation then released: it never ran, and held nothing (seed 1442);
  one resized so was let out on the old size's reservation (seed 4674);
- after a restart, a reservation back in its node's queue forgot the lifetime its
  quota gives: a gated pod's waited its whole wait (24 hours) instead of being
  refused ``AlreadyExpired`` when that lifetime ran out (seed 2429);
- a claiming pod the webhook missed, bound while the operator was down: at the
  restart a tenant's reservation was admitted into the namespace's quota before the
  pod's own reservation was made, and the quota held both (seed 2843).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from headroom.api.config import parse_config
from headroom.control.controller import Controller
from headroom_dev import quotas as hq
from headroom_dev import reservations as rsv
from headroom_dev.faults import FaultyTransport, Rule
from headroom_dev.operator import OperatorProcess
from tests.integration.test_pod_gates import (
    GATE,
    _said,
    claim_pod,
    gates_of,
    pinned_to,
    pool_nodes,
    wait_ungated,
)
from tests.integration.test_pod_gates_edits import inprocess, ours
from tests.integration.test_pod_gates_quotas import FAST, quota
from tests.polling import eventually

__all__ = ["inprocess", "quota"]  # the fixtures, used here


async def test_a_gated_pods_condition_lost_to_a_failed_write_is_written_again(
    inprocess: tuple[FaultyTransport, list[Controller]],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    transport, started = inprocess
    await asyncio.to_thread(pool_nodes, make_node, core, only="8Gi")
    config = parse_config("{sweepPeriod: 100ms, summaryInterval: 100ms, resyncPeriod: 2s}")
    controller = Controller(config, transport)
    started.append(controller)
    status = f"/namespaces/{namespace}/pods/p/status"
    failing = transport.add(Rule("PATCH", status, "refuse-500"))  # a busy API server
    await controller.start()
    # A pod no node may take: once the operator labelled it, nothing about it changes.
    await asyncio.to_thread(
        core.create_namespaced_pod, namespace, claim_pod("p", "no-such-pool", "1Gi")
    )

    def refused_once_labelled() -> None:
        pod = core.read_namespaced_pod("p", namespace)
        assert (pod.metadata.labels or {}).get("headroom.dev/owner") == "true"
        assert transport.calls_to("PATCH", status) >= 1

    await asyncio.to_thread(eventually, refused_once_labelled)
    await asyncio.sleep(1.0)  # the passes its labelling caused are over: all refused
    failing.times = 0  # the API server answers again
    assert ours(core, namespace, "p") == []

    def said_why() -> None:
        assert ours(core, namespace, "p") == [("False", "NoNode")]

    # Within a few of its passes (resync 2 s, the per-pod backoff): not only if it changes.
    await asyncio.to_thread(eventually, said_why, timeout=20)


def test_a_gated_pod_resized_while_it_waits_is_placed_for_its_new_size(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool, nodes = pool_nodes(make_node, core, only="8Gi")
    run_operator()
    core.create_namespaced_pod(namespace, claim_pod("big", pool, "5Gi"))
    wait_ungated(core, namespace, "big")
    core.create_namespaced_pod(namespace, claim_pod("p", pool, "4Gi"))
    waiting = rsv.wait_for(custom, namespace, "p", phases=("Queued",))
    assert waiting["spec"]["ramMB"] == 4096

    # Its owner asks for less while it waits (annotations may change on a gated pod).
    core.patch_namespaced_pod(
        "p", namespace, {"metadata": {"annotations": {"headroom.dev/ram": "1Gi"}}}
    )

    pod = wait_ungated(core, namespace, "p")
    assert pinned_to(pod) == [nodes["only"]]
    held = rsv.wait_for(custom, namespace, "p", phases=("Admitted",))
    assert held["spec"]["ramMB"] == 1024
    assert held["metadata"]["uid"] != waiting["metadata"]["uid"]
    _said(core, namespace, "p", "ClaimChanged", "ramMB 4096, not 1024")


def test_a_pods_reservation_waiting_for_its_quota_is_refused_once_the_quota_forbids_it(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    quota: Callable[..., str],
) -> None:
    pool, nodes = pool_nodes(make_node, core, only="16Gi")
    name = quota(ramMB=4096)
    run_operator(FAST)
    core.create_namespaced_pod(namespace, claim_pod("first", pool, "3Gi"))
    wait_ungated(core, namespace, "first")
    core.create_namespaced_pod(namespace, claim_pod("p", pool, "2Gi"))
    waiting = rsv.wait_for(custom, namespace, "p", phases=("Queued",))
    assert waiting["status"]["reason"] == "QuotaExceeded"

    # The admin keeps the namespace off that node from now on: p can never go there.
    hq.patch_spec(custom, name, nodeSelector={"matchLabels": {"pool": "elsewhere"}})

    refused = rsv.wait_for(custom, namespace, "p", phases=("Rejected",), timeout=20)
    assert refused["metadata"]["uid"] == waiting["metadata"]["uid"]
    assert refused["status"]["reason"] == "NodeNotAllowed"
    assert f"node {nodes['only']} is outside spec.nodeSelector" in refused["status"]["message"]

    def told() -> None:
        assert ours(core, namespace, "p") == [("False", "NodeNotAllowed")]

    eventually(told, timeout=20)


async def _ungate_held_back(
    inprocess: tuple[FaultyTransport, list[Controller]],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    namespace: str,
) -> Rule:
    """A gated pod p (1 GiB) whose ungate patch the API server refuses (500) for now."""
    transport, started = inprocess
    pool, _ = await asyncio.to_thread(pool_nodes, make_node, core, only="8Gi")
    config = parse_config("{sweepPeriod: 100ms, summaryInterval: 100ms, resyncPeriod: 1h}")
    controller = Controller(config, transport)
    started.append(controller)
    pod_path = f"/namespaces/{namespace}/pods/p"
    failing = transport.add(Rule("PATCH", pod_path, "refuse-500"))  # a busy API server
    await controller.start()
    body = claim_pod("p", pool, "1Gi")
    body["metadata"]["labels"]["headroom.dev/owner"] = "true"  # as the webhook leaves it
    await asyncio.to_thread(core.create_namespaced_pod, namespace, body)

    def ungate_tried() -> None:
        assert ("PATCH", f"/api/v1{pod_path}") in transport.calls

    await asyncio.to_thread(eventually, ungate_tried, timeout=20)
    return failing


async def test_a_pod_narrowed_while_its_ungate_is_retried_is_not_ungated_where_it_cannot_run(
    inprocess: tuple[FaultyTransport, list[Controller]],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    failing = await _ungate_held_back(inprocess, make_node, core, namespace)
    # Narrowed while the operator retries its ungate: no node carries that label.
    narrow = {"spec": {"nodeSelector": {"zone": "nowhere"}}}
    await asyncio.to_thread(core.patch_namespaced_pod, "p", namespace, narrow)
    failing.times = 0  # the API server answers again

    def told_nowhere() -> None:
        assert ours(core, namespace, "p") == [("False", "NoNode")]

    await asyncio.to_thread(eventually, told_nowhere, timeout=30)
    pod = await asyncio.to_thread(core.read_namespaced_pod, "p", namespace)
    assert gates_of(pod) == [GATE]


async def test_a_pod_resized_while_its_ungate_is_retried_is_let_out_on_its_new_size(
    inprocess: tuple[FaultyTransport, list[Controller]],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """Seed 4674: it ran on the old size's reservation (then on none where it ran)."""
    failing = await _ungate_held_back(inprocess, make_node, core, namespace)
    resize = {"metadata": {"annotations": {"headroom.dev/ram": "2Gi"}}}
    await asyncio.to_thread(core.patch_namespaced_pod, "p", namespace, resize)
    failing.times = 0  # the API server answers again

    def let_out_on_its_size() -> None:
        pod = core.read_namespaced_pod("p", namespace)
        assert gates_of(pod) == []
        held = rsv.get(custom, namespace, "p")
        assert (held["status"]["phase"], held["spec"]["ramMB"]) == ("Admitted", 2048)

    await asyncio.to_thread(eventually, let_out_on_its_size, timeout=30)


async def test_a_waiter_requeued_at_a_restart_keeps_the_lifetime_its_quota_gives(
    inprocess: tuple[FaultyTransport, list[Controller]],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    quota: Callable[..., str],
) -> None:
    transport, started = inprocess
    pool, nodes = await asyncio.to_thread(pool_nodes, make_node, core, only="8Gi")
    await asyncio.to_thread(quota, defaultLifetime="15s")
    config = parse_config("{sweepPeriod: 100ms, summaryInterval: 100ms, resyncPeriod: 1h}")
    first = Controller(config, transport)
    started.append(first)
    await first.start()
    # The node is full for an hour (an expiry of its own: the quota's default is not given).
    hour = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    await asyncio.to_thread(
        rsv.create, custom, namespace, "hog", nodes["only"], 7168, expiresAt=hour
    )
    await asyncio.to_thread(rsv.wait_for, custom, namespace, "hog", ("Admitted",))
    await asyncio.to_thread(core.create_namespaced_pod, namespace, claim_pod("p", pool, "2Gi"))
    waiting = await asyncio.to_thread(rsv.wait_for, custom, namespace, "p", ("Queued",))
    assert waiting["status"]["reason"] == "InsufficientRAM"

    await first.stop()  # a restart while it waits
    second = Controller(config, transport)
    started.append(second)
    await second.start()

    def refused_at_its_lifetime() -> None:
        now = rsv.get(custom, namespace, "p")
        assert now["metadata"]["uid"] == waiting["metadata"]["uid"]
        assert (now["status"]["phase"], now["status"]["reason"]) == ("Rejected", "AlreadyExpired")

    # 15 s after its creation, as the first operator would have refused it.
    await asyncio.to_thread(eventually, refused_at_its_lifetime, timeout=30)


async def test_a_pod_bound_while_the_operator_was_down_fills_its_quota_before_any_decision(
    inprocess: tuple[FaultyTransport, list[Controller]],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    quota: Callable[..., str],
) -> None:
    """Seed 2843: the decider admitted a tenant's claim into the quota before the
    reservation of a pod running there was made, and the quota held both."""
    transport, started = inprocess
    pool, nodes = await asyncio.to_thread(pool_nodes, make_node, core, only="8Gi")
    await asyncio.to_thread(quota, ramMB=1024)
    # While no operator runs: a claiming pod the webhook missed runs on the node, and a
    # tenant asks for room in the same quota.
    body = claim_pod("p", pool, "1Gi", gated=False, node_name=nodes["only"])
    body["metadata"]["labels"]["headroom.dev/owner"] = "true"
    await asyncio.to_thread(core.create_namespaced_pod, namespace, body)
    await asyncio.to_thread(rsv.create, custom, namespace, "r", nodes["only"], 512, wait="10m")
    # The pod's reservation cannot be made for now (a busy API server).
    failing = transport.add(Rule("POST", f"/namespaces/{namespace}/reservations", "refuse-500"))
    config = parse_config("{sweepPeriod: 100ms, summaryInterval: 100ms, resyncPeriod: 1h}")
    controller = Controller(config, transport)
    started.append(controller)
    await controller.start()

    decided = await asyncio.to_thread(rsv.wait_for, custom, namespace, "r", ("Queued", "Admitted"))
    assert (decided["status"]["phase"], decided["status"]["reason"]) == ("Queued", "QuotaExceeded")
    failing.times = 0  # the API server answers again
    held = await asyncio.to_thread(rsv.wait_for, custom, namespace, "p", ("Admitted",), timeout=30)
    assert held["status"]["reason"] == "Fits"  # its own claim did not count against it
    still = await asyncio.to_thread(rsv.get, custom, namespace, "r")
    assert still["status"]["phase"] == "Queued"
