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

from headroom.api.claims import pod_claim
from headroom.api.config import OperatorConfig
from headroom.api.paths import resource_path
from headroom.control.controller import Controller
from headroom.kube.transport import JSON, ApiError
from headroom.objects.pods import pod_reservation
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.fakeapi.client import FakeClient
from headroom_dev.sim.loop import VirtualClock, run_virtual
from tests.unit.test_gates_races import NS, PODS, bound_pod, deliver_reservations
from tests.unit.test_scheduler_queue import waiting_pod


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
        controller.owners.on_event("ADDED", pod)
        await deliver_reservations(server, controller)
        [reservation] = server.reservations(NS)
        assert reservation["status"]["phase"] == "Admitted"
        transport.slow = True
        controller.owners.check_gone(("ml", "p"))  # a read is sent: the pod is there
        await asyncio.sleep(1)
        server.delete(f"{PODS}/p")
        controller.owners.on_event("DELETED", pod)  # while that read is in flight
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


class CountedPodReads(FakeClient):
    pod_reads = 0

    async def get(self, path: str) -> JSON:
        if path.startswith(PODS):
            self.pod_reads += 1
        return await super().get(path)


def decided_after_reads(config: OperatorConfig, scheduler_name: str) -> tuple[str, int]:
    """A pending claim pod for ``scheduler_name`` and the reservation the bind makes for
    it: the decision, and how many times the pod was read for it."""

    async def scenario() -> tuple[str, int]:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=8192)
        pod = waiting_pod(server, "512Mi", scheduler=scheduler_name)
        transport = CountedPodReads(server, "operator")
        controller = Controller(
            config, transport, clock=VirtualClock(), follow_watches=False, rng=random.Random(1)
        )
        await controller.start()
        controller.owners.on_event("ADDED", pod)
        reservation = pod_reservation(pod, pod_claim(pod), "n1")
        server.create(resource_path("headroom.dev", "v1alpha1", "reservations", NS), reservation)
        await deliver_reservations(server, controller)
        [decided] = server.reservations(NS)
        await controller.stop()
        return decided["status"]["phase"], transport.pod_reads

    return run_virtual(scenario(), max_virtual_seconds=600)


def test_the_reservation_a_bind_makes_is_decided_without_reading_its_pod() -> None:
    """A pod waiting, unbound, for the scheduler whose binds are the operator's can be
    placed by the operator only (as a gated pod): its reservation is decided as a claim
    at once. Any other pending pod is read first (it may run already: the watch lags)."""
    binds = OperatorConfig.model_validate({"extenderPort": 9444})
    assert decided_after_reads(binds, "headroom") == ("Admitted", 0)
    assert decided_after_reads(binds, "another") == ("Admitted", 1)
    assert decided_after_reads(OperatorConfig(), "headroom") == ("Admitted", 1)
