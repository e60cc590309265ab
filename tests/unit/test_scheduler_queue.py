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


def waiting_pod(server: FakeApiServer, ram: str) -> JSON:
    """A claim pod kube-scheduler tried and left unschedulable."""
    body = {
        "metadata": {
            "name": "p",
            "labels": {CLAIM_LABEL: "true", OWNER_LABEL: "true"},
            "annotations": {RAM_ANNOTATION: ram},
        },
        "spec": {"schedulerName": "headroom", "containers": [{"name": "c"}]},
    }
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
        controller.gates.on_pod("ADDED", pod)
        controller.owners.on_pod("ADDED", pod)
        await controller.gates.queue(("ml", "p"), pod, "n1", ["n1"])
        await deliver_reservations(server, controller)
        mine = next(r for r in server.reservations(NS) if r["metadata"]["name"] == "p")
        assert mine["spec"]["wait"], mine["spec"]
        assert (mine["status"]["phase"], mine["status"]["queuePosition"]) == ("Queued", 1)
        await controller.gates.queue(("ml", "p"), pod, "n1", ["n1"])  # again: nothing new
        assert len(server.reservations(NS)) == 2
        assert ROOM_ANNOTATION not in server.get(f"{PODS}/p")["metadata"]["annotations"]
        server.delete(f"{RESERVATIONS}/filler")
        controller.on_reservation("DELETED", filler)
        await deliver_reservations(server, controller)
        await asyncio.sleep(2)
        mine = server.get(f"{RESERVATIONS}/p")
        assert mine is not None
        assert mine["status"]["phase"] == "Admitted"
        nudged = server.get(f"{PODS}/p")["metadata"]["annotations"]
        assert nudged[ROOM_ANNOTATION].startswith(mine["metadata"]["uid"])
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


def test_a_pod_waiting_on_a_node_the_scheduler_no_longer_finds_feasible_waits_elsewhere() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        for node in ("n1", "n2"):
            server.put_node(node, memory=8192)
            server.create(RESERVATIONS, reservation(f"fill-{node}", node, 7000))
        controller = await started(server)
        await deliver_reservations(server, controller)
        pod = waiting_pod(server, "4Gi")
        controller.gates.on_pod("ADDED", pod)
        controller.owners.on_pod("ADDED", pod)
        await controller.gates.queue(("ml", "p"), pod, "n1", ["n1", "n2"])
        await deliver_reservations(server, controller)
        first = server.get(f"{RESERVATIONS}/p")
        assert first is not None
        assert first["spec"]["node"] == "n1"
        # n1 cordoned, say: the scheduler passes only n2 to filter now.
        queued = asyncio.create_task(controller.gates.queue(("ml", "p"), pod, "n2", ["n2"]))
        await asyncio.sleep(1)
        assert server.get(f"{RESERVATIONS}/p") is None  # deleted; made again once seen gone
        controller.on_reservation("DELETED", first)
        await queued
        await deliver_reservations(server, controller)
        mine = server.get(f"{RESERVATIONS}/p")
        assert mine is not None
        assert (mine["spec"]["node"], mine["status"]["phase"]) == ("n2", "Queued")
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)
