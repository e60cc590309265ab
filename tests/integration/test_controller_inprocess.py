"""The controller in-process against the real API server, driven event by event.

Here the test plays the watch: it hands the controller Reservation events itself, so it can
also *withhold* one, the way a broken watch can lose a DELETED event, and check
that the periodic resync releases the capacity anyway.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes import client

from headroom.api.config import OperatorConfig
from headroom.control.controller import Controller
from headroom.kube.client import KubeClient
from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane


@pytest.fixture
async def controller(control_plane: ControlPlane, crds: list[str]) -> AsyncIterator[Controller]:
    kube = KubeClient(control_plane.admin_credentials())
    controller = Controller(OperatorConfig(), kube, follow_watches=False)
    yield controller
    await controller.stop()
    await kube.close()


async def decided(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    for _ in range(200):
        obj = await asyncio.to_thread(rsv.get, custom, namespace, name)
        if (obj.get("status") or {}).get("phase"):
            return obj
        await asyncio.sleep(0.05)
    raise TimeoutError(name)


async def test_resync_releases_what_a_lost_deleted_event_would_have(
    controller: Controller,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    await controller.start()  # the rebuild lists the Node created above

    created = await asyncio.to_thread(rsv.create, custom, namespace, "held", node, 4096)
    controller.reservations.on_event("ADDED", created)
    assert (await decided(custom, namespace, "held"))["status"]["phase"] == "Admitted"
    assert controller.state.ledger.allocatable_ram(node) == 0

    await asyncio.to_thread(rsv.delete, custom, namespace, "held")  # DELETED event withheld
    assert controller.state.ledger.allocatable_ram(node) == 0
    await controller.reservations.relist()
    assert controller.state.ledger.allocatable_ram(node) == 4096

    later = await asyncio.to_thread(rsv.create, custom, namespace, "later", node, 4096)
    await controller.reservations.relist()  # an undecided object found by the resync is decided
    assert (await decided(custom, namespace, "later"))["status"]["phase"] == "Admitted"
    assert later["metadata"]["uid"] in controller.state.holders.values()
