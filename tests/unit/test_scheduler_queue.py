"""The scheduler path's queue (``Gates.queue``), on the fake API server in virtual time.

A pod kube-scheduler found no node with room for waits as a reservation in the ledger's
queue of one node; the pod is nudged when that reservation is admitted. The real
kube-scheduler and API are in ``tests/e2e/test_scheduler_extender.py``
(``test_pods_no_node_has_room_for_wait_in_the_ledgers_queue_in_turn_whatever_their_priority``).
"""

from __future__ import annotations

import asyncio
import random

from headroom.api.config import OperatorConfig
from headroom.api.constants import CLAIM_LABEL, OWNER_LABEL, RAM_ANNOTATION, ROOM_ANNOTATION
from headroom.control.controller import Controller
from headroom.kube.transport import JSON
from headroom_dev.reservations import reservation
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.loop import VirtualClock, run_virtual
from tests.unit.test_gates_races import NS, PODS, deliver_reservations

RESERVATIONS = f"/apis/headroom.dev/v1alpha1/namespaces/{NS}/reservations"
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}


def waiting_pod(
    server: FakeApiServer,
    ram: str,
    selector: dict[str, str] | None = None,
    *,
    scheduler: str = "headroom",
) -> JSON:
    """A claim pod ``scheduler`` tried and left unschedulable."""
    body = {
        "metadata": {
            "name": "p",
            "labels": {CLAIM_LABEL: "true", OWNER_LABEL: "true"},
            "annotations": {RAM_ANNOTATION: ram},
        },
        "spec": {"schedulerName": scheduler, "containers": [{"name": "c"}]},
    }
    if selector is not None:
        body["spec"]["nodeSelector"] = selector
    pod = server.create(PODS, body)
    pod["status"] = {"phase": "Pending", "conditions": [UNSCHEDULABLE]}
    return pod


async def started(server: FakeApiServer) -> Controller:
    config = OperatorConfig.model_validate({"extenderPort": 9444})
    controller = Controller(
        config, server.client("operator"), clock=VirtualClock(), follow_watches=False,
        rng=random.Random(1),
    )  # fmt: skip
    await controller.start()
    return controller


def test_a_pod_with_no_room_waits_in_a_nodes_queue_and_is_nudged_when_admitted() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=8192)
        filler = server.create(RESERVATIONS, reservation("filler", "n1", 7000))
        controller = await started(server)
        await deliver_reservations(server, controller)
        pod = waiting_pod(server, "4Gi")
        controller.gates.on_event("ADDED", pod)
        controller.owners.on_event("ADDED", pod)
        await controller.gates.queue(("ml", "p"), pod, "n1")
        await deliver_reservations(server, controller)
        mine = next(r for r in server.reservations(NS) if r["metadata"]["name"] == "p")
        assert mine["spec"]["wait"], mine["spec"]
        assert (mine["status"]["phase"], mine["status"]["queuePosition"]) == ("Queued", 1)
        await controller.gates.queue(("ml", "p"), pod, "n1")  # again: nothing new
        assert len(server.reservations(NS)) == 2
        assert ROOM_ANNOTATION not in server.get(f"{PODS}/p")["metadata"]["annotations"]
        server.delete(f"{RESERVATIONS}/filler")
        controller.reservations.on_event("DELETED", filler)
        await deliver_reservations(server, controller)
        await asyncio.sleep(2)
        mine = server.get(f"{RESERVATIONS}/p")
        assert mine is not None
        assert mine["status"]["phase"] == "Admitted"
        nudged = server.get(f"{PODS}/p")["metadata"]["annotations"]
        assert nudged[ROOM_ANNOTATION].startswith(mine["metadata"]["uid"])
        # Its claim edited now: an admission is never taken back by a queue (its bind
        # replaces it, or the bind grace's fence releases it).
        edited = server.merge_patch(
            f"{PODS}/p", {"metadata": {"annotations": {RAM_ANNOTATION: "2Gi"}}}
        )
        controller.gates.on_event("MODIFIED", edited | {"status": pod["status"]})
        await controller.gates.queue(("ml", "p"), edited, "n1")
        kept = server.get(f"{RESERVATIONS}/p")
        assert kept is not None
        assert (kept["metadata"]["uid"], kept["status"]["phase"]) == (
            mine["metadata"]["uid"],
            "Admitted",
        )
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


def test_a_waiter_whose_node_no_longer_suits_it_or_whose_claim_changed_waits_anew() -> None:
    """Moved off a node it may no longer run on (relabelled, cordoned), as the gate path's
    NodeUnsuitable; made again for a claim edited while it waited. Not moved for a filter
    call that did not name its node (a nominated node's call names only that one)."""

    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        for node in ("n1", "n2"):
            server.put_node(node, memory=8192, labels={"pool": "a"})
            server.create(RESERVATIONS, reservation(f"fill-{node}", node, 7000))
        controller = await started(server)
        for node in ("n1", "n2"):
            controller.nodes.on_event("ADDED", server.get(f"/api/v1/nodes/{node}"))
        await deliver_reservations(server, controller)
        pod = waiting_pod(server, "4Gi", selector={"pool": "a"})
        controller.gates.on_event("ADDED", pod)
        controller.owners.on_event("ADDED", pod)
        key = ("ml", "p")

        async def queue_and_see(node: str) -> JSON:
            old = server.get(f"{RESERVATIONS}/p")
            task = asyncio.create_task(controller.gates.queue(key, pod, node))
            await asyncio.sleep(1)
            if old is not None and server.get(f"{RESERVATIONS}/p") is None:
                controller.reservations.on_event("DELETED", old)  # as the watch says it
            await task
            await deliver_reservations(server, controller)
            found = server.get(f"{RESERVATIONS}/p")
            assert found is not None
            return found

        first = await queue_and_see("n1")
        assert (first["spec"]["node"], first["status"]["phase"]) == ("n1", "Queued")
        same = await queue_and_see("n2")  # n1 still suits it: it keeps its place there
        assert same["metadata"]["uid"] == first["metadata"]["uid"]
        controller.nodes.on_event("MODIFIED", server.put_node("n1", 8192, labels={"pool": "b"}))
        moved = await queue_and_see("n2")
        assert (moved["spec"]["node"], moved["status"]["phase"]) == ("n2", "Queued")
        edited = server.merge_patch(
            f"{PODS}/p", {"metadata": {"annotations": {RAM_ANNOTATION: "5Gi"}}}
        )
        pod = edited | {"status": pod["status"]}
        controller.gates.on_event("MODIFIED", pod)
        again = await queue_and_see("n2")
        assert again["metadata"]["uid"] != moved["metadata"]["uid"]
        assert again["spec"]["ramMB"] == 5120
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)
