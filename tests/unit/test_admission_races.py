"""A race of reservation incarnations, replayed on the fake API server.

A reservation deleted and created again under its name; the resync's list brings
the new one, which is admitted; then the reservation watch, lagging behind that
list, delivers the ADDED of the old one (found by the simulation while wiring GPU
inventories, seed 236 of that branch). The admission's namesake rule took the
held, newer one for the stale incarnation and forgot it; the new one's own ADDED
then came, without its status, and was decided a second time. An event of an
incarnation not newer than the one held is not decided.
"""

from __future__ import annotations

import asyncio

from headroom.api.claims import pod_claim
from headroom.api.config import OperatorConfig
from headroom.api.constants import CLAIM_LABEL, OWNER_LABEL, RAM_ANNOTATION
from headroom.api.paths import resource_path
from headroom.control.controller import Controller
from headroom.objects.pods import pod_reservation
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.loop import VirtualClock, run_virtual

NS = "ml"


def test_a_late_added_of_an_earlier_incarnation_does_not_undo_the_held_one() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=8192)
        old = server.create_reservation(NS, "r", "n1", 1024)
        server.delete_reservation(NS, "r")
        await asyncio.sleep(2)  # created again a few seconds later
        new = server.create_reservation(NS, "r", "n1", 1024)
        controller = Controller(
            OperatorConfig(), server.client("operator"), clock=VirtualClock(), follow_watches=False
        )
        await controller.start()  # the rebuild's list brings the new one
        await asyncio.sleep(2)
        [admitted] = server.reservations(NS)
        assert admitted["metadata"]["uid"] == new["metadata"]["uid"]
        assert admitted["status"]["phase"] == "Admitted"
        decision = admitted["status"]["decisionID"]
        controller.reservations.on_event("ADDED", old)  # the lagging watch: the old incarnation
        await asyncio.sleep(2)
        controller.reservations.on_event("ADDED", new)  # then the new one's ADDED, without status
        await asyncio.sleep(2)
        controller.reservations.on_event("MODIFIED", server.reservations(NS)[0])
        await asyncio.sleep(2)
        [after] = server.reservations(NS)
        assert after["status"]["decisionID"] == decision  # decided once
        held = controller.state.held_record("ml/r")
        assert held is not None
        assert held.uid == new["metadata"]["uid"]
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


def test_the_operators_own_reservation_written_from_a_newer_view_of_its_pod_is_recorded() -> None:
    """A running owner pod is labelled a claim pod (issue 29, item 2); the reservation the
    operator writes for it arrives before the owner-pod watch shows the label. It is
    not taken for a tenant's look-alike: the pod is read again, and it is recorded
    where it runs, over the node's limit, at the pod's memory limit."""

    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=4096)  # limit 4096 − 1024 = 3072 MiB
        pods = resource_path("", "v1", "pods", NS)
        limits = {"limits": {"memory": "4Gi"}}
        server.create(
            pods,
            {
                "metadata": {"name": "p", "labels": {OWNER_LABEL: "true"}},
                "spec": {
                    "nodeName": "n1",
                    "containers": [{"name": "main", "image": "sim", "resources": limits}],
                },
            },
        )
        controller = Controller(
            OperatorConfig(), server.client("operator"), clock=VirtualClock(), follow_watches=False
        )
        await controller.start()  # sees p as an owner pod that claims nothing
        await asyncio.sleep(1)
        labelled = server.merge_patch(
            f"{pods}/p",
            {
                "metadata": {
                    "labels": {CLAIM_LABEL: "true"},
                    "annotations": {RAM_ANNOTATION: str(1 << 30)},
                }
            },
        )
        body = pod_reservation(labelled, pod_claim(labelled), "n1", node_ram_mb=4096)
        assert body["spec"]["ramMB"] == 4096  # its limit
        created = server.create(resource_path("headroom.dev", "v1alpha1", "reservations", NS), body)
        controller.reservations.on_event("ADDED", created)  # before the owner watch's MODIFIED
        await asyncio.sleep(2)
        [recorded] = server.reservations(NS)
        status = recorded["status"]
        assert (status["phase"], status["reason"]) == ("Admitted", "OverCommitted"), status
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)
