"""Reading an owner pod before its reservations go, on the fake API server in virtual time.

The read of an owner pod once ran as one task per pod, and a reason to read it
again that came while a read was in flight was dropped. A read sent just before
the pod was deleted answers "still there"; the DELETED that followed asked for
another read, which never came, and the pod's reservation stayed Admitted for a
pod that was gone (until a resync). On the work queue that DELETED makes the pod
read once more when the first read ends.
"""

from __future__ import annotations

import asyncio
import random

from headroom.api.config import OperatorConfig
from headroom.control.controller import Controller
from headroom.kube.transport import JSON, ApiError
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.fakeapi.client import FakeClient
from headroom_dev.sim.loop import VirtualClock, run_virtual
from tests.unit.test_gates_races import NS, PODS, bound_pod, deliver_reservations


class SlowPodReads(FakeClient):
    """Reads of a pod answer 5 s late, with the pod as it was when the read arrived."""

    slow = False

    async def get(self, path: str) -> JSON:
        if not (self.slow and path.startswith(PODS)):
            return await super().get(path)
        found = self.server.get(path)
        await asyncio.sleep(5)
        if found is None:
            raise ApiError(404, "NotFound", f"{path} not found")
        return found


def test_an_owner_pod_deleted_while_it_is_read_is_read_again_and_its_reservation_goes() -> None:
    async def scenario() -> JSON:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=8192)
        pod = bound_pod(server, "n1")  # a claiming pod the webhook missed: one reservation
        transport = SlowPodReads(server, "operator")
        controller = Controller(
            OperatorConfig(),
            transport,
            clock=VirtualClock(),
            follow_watches=False,
            rng=random.Random(1),
        )
        await controller.start()
        controller.owners.on_pod("ADDED", pod)
        await deliver_reservations(server, controller)
        [reservation] = server.reservations(NS)
        assert reservation["status"]["phase"] == "Admitted"
        transport.slow = True
        controller.owners.check_gone(("ml", "p"))  # a read is sent: the pod is there
        await asyncio.sleep(1)
        server.delete(f"{PODS}/p")
        controller.owners.on_pod("DELETED", pod)  # while that read is in flight
        await asyncio.sleep(10)
        await deliver_reservations(server, controller)
        [after] = server.reservations(NS)
        await controller.stop()
        return after

    after = run_virtual(scenario(), max_virtual_seconds=600)
    assert (after["status"]["phase"], after["status"]["reason"]) == (
        "Reclaimed",
        "OwnerPodDeleted",
    ), after["status"]
