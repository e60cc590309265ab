"""The retry delays of a gated pod, on the fake API server in virtual time (exact times).

A pod's next look was once one timer per pod: a second delay asked while one was
pending was dropped, even a shorter one. So a pod whose creates had failed for a
while (its failure backoff at 15-30 s) and whose reservation was then refused waited
for the failure timer, not for its 10 s refusal delay. On the work queue the earliest
pending time wins.

The controller's watches are off: the test delivers the reservation events itself,
for a few seconds, then leaves the pod to its timers.
"""

from __future__ import annotations

import asyncio
import random

from headroom.api.config import OperatorConfig
from headroom.api.constants import CLAIM_LABEL, OWNER_LABEL, RAM_ANNOTATION, SCHEDULING_GATE
from headroom.control.controller import Controller
from headroom.kube.transport import JSON, ApiError, resource_path
from headroom_dev import quotas as hq
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.fakeapi.client import FakeClient
from headroom_dev.sim.loop import VirtualClock, run_virtual

NS = "ml"
PODS = resource_path("", "v1", "pods", NS)
QUOTAS = resource_path("headroom.dev", "v1alpha1", "headroomquotas")


class DenyingReservationCreates(FakeClient):
    """The operator's connection, with reservation creates refused (a policy, say)."""

    deny = True
    denied = 0
    sixth: asyncio.Event | None = None  # set at the sixth refusal

    async def create(self, path: str, body: JSON) -> JSON:
        if self.deny and "/reservations" in path:
            self.denied += 1
            if self.denied == 6 and self.sixth is not None:
                self.sixth.set()
            raise ApiError(403, "Forbidden", "reservations are not allowed here")
        return await super().create(path, body)


def now() -> float:
    return asyncio.get_running_loop().time()


def test_a_refused_pods_retry_delay_is_not_hidden_by_a_longer_failure_backoff() -> None:
    async def scenario() -> tuple[float, float]:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory="8Gi")
        server.create_reservation(NS, "filler", "n1", 6144)  # no room for the pod now
        # A pod without a wait of its own waits as long as its quota allows: 2 s, then
        # its reservation is refused (WaitTimeout) and, after a delay, made again.
        server.create(QUOTAS, hq.quota("q", {"kubernetes.io/metadata.name": NS}, maxWait="2s"))
        server.create(
            PODS,
            {
                "metadata": {
                    "name": "p",
                    "labels": {CLAIM_LABEL: "true", OWNER_LABEL: "true"},
                    "annotations": {RAM_ANNOTATION: "4Gi"},
                },
                "spec": {
                    "containers": [{"name": "main", "image": "sim"}],
                    "schedulingGates": [{"name": SCHEDULING_GATE}],
                },
            },
        )
        transport = DenyingReservationCreates(server, "operator")
        controller = Controller(
            OperatorConfig(),
            transport,
            clock=VirtualClock(),
            follow_watches=False,
            rng=random.Random(1),  # its sixth failure backoff: 21.7 s
        )
        refused_at: list[float] = []
        deleted_at: list[float] = []

        def on_change(event_type: str, obj: JSON) -> None:
            if obj.get("kind") != "Reservation" or obj["metadata"]["name"] != "p":
                return
            if event_type == "DELETED":
                deleted_at.append(now())
            elif (obj.get("status") or {}).get("phase") == "Rejected" and not refused_at:
                refused_at.append(now())

        server.subscribe(on_change)
        await controller.start()
        for reservation in server.reservations(NS):  # the filler is admitted
            controller.reservations.on_event("ADDED", reservation)
        transport.sixth = asyncio.Event()
        await transport.sixth.wait()
        await asyncio.sleep(0.1)  # that pass ends: its failure backoff runs, 15-30 s
        transport.deny = False
        controller.gates.nodes_changed()  # looked at again now: created, and refused
        unblocked = now()
        while not refused_at and now() < unblocked + 60:  # made, queued, refused
            await asyncio.sleep(1)
            for reservation in server.reservations(NS):
                controller.reservations.on_event("MODIFIED", reservation)
        await asyncio.sleep(1)
        for reservation in server.reservations(NS):  # its refusal confirmed
            controller.reservations.on_event("MODIFIED", reservation)
        assert refused_at, "the pod's reservation was not refused"
        await asyncio.sleep(60)
        await controller.stop()
        assert deleted_at, "the refused reservation was never replaced"
        return refused_at[0], deleted_at[0]

    refused, deleted = run_virtual(scenario(), max_virtual_seconds=600)
    # Deleted (to make a new one) once the pod's first refusal delay, 10 s, ran out:
    # not when the failure backoff's timer, pending since before, fires.
    assert 10 <= deleted - refused < 11, (refused, deleted)
