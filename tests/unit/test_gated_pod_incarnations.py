"""A claiming pod deleted and created again under its name, its deletion never seen.

Found by the simulation (seed 4576 of the schedules with gated pods): the operator
took the new pod's reservation for the old pod's (its owner was read from the
owner-pod cache by name, which still held the old incarnation: the DELETED event was
lost), then reclaimed it as "owner pod was replaced" as soon as the new pod was seen,
and the new pod ran holding nothing. A gated pod's reservation names its owner's
incarnation in its ownerReference; that is the owner.

Played on the fake API server with the controller's watches off: the test delivers
every event but the old pod's DELETED.
"""

from __future__ import annotations

import asyncio

from headroom.api.config import OperatorConfig
from headroom.api.constants import CLAIM_LABEL, OWNER_LABEL, RAM_ANNOTATION
from headroom.control.controller import Controller
from headroom.kube.transport import JSON, resource_path
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.loop import VirtualClock, run_virtual

NS = "ml"
PODS = resource_path("", "v1", "pods", NS)


def bound_pod(server: FakeApiServer, node: str) -> JSON:
    """A claiming pod the webhook missed (no gate), bound by the scheduler."""
    body = {
        "metadata": {
            "name": "p",
            "labels": {CLAIM_LABEL: "true", OWNER_LABEL: "true"},
            "annotations": {RAM_ANNOTATION: "512Mi"},
        },
        "spec": {"containers": [{"name": "main", "image": "sim"}]},
    }
    pod = server.create(PODS, body)
    binding = {"metadata": {"name": "p", "uid": pod["metadata"]["uid"]}, "target": {"name": node}}
    server.create(f"{PODS}/p/binding", binding)
    found = server.get(f"{PODS}/p")
    assert found is not None
    return found


def test_the_new_pods_reservation_is_its_own_though_the_old_pods_deletion_was_missed() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=8192)
        old = bound_pod(server, "n1")
        controller = Controller(
            OperatorConfig(), server.client("operator"), clock=VirtualClock(), follow_watches=False
        )
        await controller.start()  # lists the old pod: its reservation is made

        async def deliver_reservations() -> None:
            for _ in range(3):
                await asyncio.sleep(1)
                for reservation in server.reservations(NS):
                    controller.on_reservation("MODIFIED", reservation)

        await deliver_reservations()
        [first] = server.reservations(NS)
        assert first["status"]["phase"] == "Admitted"
        server.delete(f"{PODS}/p")  # its DELETED reaches no one
        new = bound_pod(server, "n1")
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        controller.gates.on_pod("ADDED", new)  # the old reservation goes, a new one comes
        await asyncio.sleep(1)
        controller.on_reservation("DELETED", first)
        await deliver_reservations()
        controller.owners.on_pod("MODIFIED", new)  # the owner watch sees the new pod
        await deliver_reservations()
        [second] = server.reservations(NS)
        owner = second["metadata"]["ownerReferences"][0]["uid"]
        assert owner == new["metadata"]["uid"]
        assert (second["status"]["phase"], second["status"]["reason"]) == ("Admitted", "Fits")
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)
