"""The bind verb on the real API server: the controller in-process, its watches live, the
Binding made to fail where a crash or a lost answer would leave things.

kube-scheduler is not needed to call bind (its calls are ``BindCall``s; the whole loop
with the real scheduler is in ``tests/e2e/test_scheduler_extender.py``). What is checked
is what the API holds: one reservation per pod whatever the retries, no Binding before
the admission is written, and an admission whose Binding never comes released after
``placement.bindGrace``, the pod fenced first.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes import client

from headroom.api.config import parse_config
from headroom.control.binder import BindCall, Binder
from headroom.control.controller import Controller
from headroom.kube.client import KubeClient
from headroom.kube.transport import JSON, ApiError
from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane
from tests.integration.test_pod_gates import claim_pod, pool_nodes
from tests.polling import eventually_async


class Refusing:
    """Makes the next ``count`` Bindings fail as an API that says no would."""

    def __init__(self, kube: KubeClient) -> None:
        self.count = 0
        self.posted: list[str] = []
        create = kube.create

        async def refusing(path: str, body: JSON) -> JSON:
            if path.endswith("/binding"):
                self.posted.append(path)
                if self.count:
                    self.count -= 1
                    raise ApiError(403, "Forbidden", "refused by the test")
            return await create(path, body)

        kube.create = refusing  # type: ignore[method-assign]


@pytest.fixture
async def running(
    control_plane: ControlPlane, crds: list[str]
) -> AsyncIterator[tuple[Controller, Refusing]]:
    kube = KubeClient(control_plane.admin_credentials())
    refusing = Refusing(kube)
    config = parse_config("placement: {bindGrace: 2s}\n")
    controller = Controller(config, kube)
    yield controller, refusing
    await controller.stop()
    await kube.close()


def scheduled_pod(name: str, pool: str, ram: str) -> dict[str, Any]:
    body = claim_pod(name, pool, ram, gated=False, spec={"schedulerName": "headroom"})
    body["metadata"]["labels"]["headroom.dev/owner"] = "true"  # as the webhook adds it
    return body


async def started_with_pod(
    controller: Controller,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    namespace: str,
    name: str,
) -> tuple[str, client.V1Pod]:
    """A 16 GiB node, the controller leading with its ledger rebuilt, and a 4 GiB claim pod
    for the scheduler ``headroom``, unbound: the node's name and the pod."""
    pool, nodes = pool_nodes(make_node, core, a="16Gi")
    await controller.start()
    await asyncio.wait_for(controller.ready.wait(), 30)
    pod = await asyncio.to_thread(
        core.create_namespaced_pod, namespace, scheduled_pod(name, pool, "4Gi")
    )
    return nodes["a"], pod


async def test_a_bind_retried_after_a_failed_binding_reuses_its_one_reservation(
    running: tuple[Controller, Refusing],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    controller, refusing = running
    node, pod = await started_with_pod(controller, make_node, core, namespace, "p")
    binder = Binder(controller.gates, controller.clock)
    call = BindCall(namespace, "p", pod.metadata.uid, node)

    refusing.count = 1
    error = await binder.bind(call)
    assert "refused by the test" in error
    first = await asyncio.to_thread(rsv.get, custom, namespace, "p")
    assert first["status"]["phase"] == "Admitted"  # written before the Binding was tried
    assert first["spec"]["node"] == node
    assert not (await asyncio.to_thread(core.read_namespaced_pod, "p", namespace)).spec.node_name

    assert await binder.bind(call) == ""  # the scheduler's retry
    again = await asyncio.to_thread(rsv.get, custom, namespace, "p")
    assert again["metadata"]["uid"] == first["metadata"]["uid"]  # no second reservation
    bound = await asyncio.to_thread(core.read_namespaced_pod, "p", namespace)
    assert bound.spec.node_name == node
    assert bound.metadata.annotations["headroom.dev/reservation"] == "p"
    assert await binder.bind(call) == ""  # a third call, its answer lost before: still one
    assert len(refusing.posted) == 2
    listed = await asyncio.to_thread(
        custom.list_namespaced_custom_object, "headroom.dev", "v1alpha1", namespace, "reservations"
    )
    assert [r["metadata"]["name"] for r in listed["items"]] == ["p"]


async def test_an_admission_whose_binding_never_comes_is_fenced_then_released(
    running: tuple[Controller, Refusing],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    controller, refusing = running
    node, pod = await started_with_pod(controller, make_node, core, namespace, "lost")
    room = controller.state.ledger.allocatable_ram(node)  # an unbound pod holds nothing yet
    refusing.count = 1  # as a leader that died between its status write and its Binding
    binder = Binder(controller.gates, controller.clock)
    assert await binder.bind(BindCall(namespace, "lost", pod.metadata.uid, node)) != ""
    held = await asyncio.to_thread(rsv.get, custom, namespace, "lost")
    assert held["status"]["phase"] == "Admitted"
    assert controller.state.ledger.allocatable_ram(node) == room - 4096

    async def released() -> None:
        assert controller.state.ledger.allocatable_ram(node) == room
        with pytest.raises(client.ApiException) as gone:
            await asyncio.to_thread(rsv.get, custom, namespace, "lost")
        assert gone.value.status == 404

    await eventually_async(released, 20)  # bindGrace is 2 s
    fenced = await asyncio.to_thread(core.read_namespaced_pod, "lost", namespace)
    annotations = fenced.metadata.annotations
    assert annotations["headroom.dev/bind-fence"].startswith(held["metadata"]["uid"] + "@")
    assert not fenced.spec.node_name
    events = await asyncio.to_thread(
        core.list_namespaced_event, namespace, field_selector="involvedObject.name=lost"
    )
    assert "BindTimeout" in {e.reason for e in events.items}


async def test_a_binding_from_before_the_fence_is_refused_by_the_api(
    core: client.CoreV1Api, make_node: Callable[..., Any], namespace: str, crds: list[str]
) -> None:
    """The fence's premise, on the API itself: a Binding carrying the resourceVersion read
    before the fence write is refused, so a bind on its way cannot land after a release."""
    pool, nodes = pool_nodes(make_node, core, a="16Gi")
    name = f"f{uuid.uuid4().hex[:4]}"
    pod = core.create_namespaced_pod(namespace, scheduled_pod(name, pool, "1Gi"))
    read = pod.metadata.resource_version
    fence = {"metadata": {"annotations": {"headroom.dev/bind-fence": "x"}}}
    core.patch_namespaced_pod(name, namespace, fence)
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "uid": pod.metadata.uid, "resourceVersion": read},
        "target": {"apiVersion": "v1", "kind": "Node", "name": nodes["a"]},
    }
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_pod_binding(name, namespace, binding, _preload_content=False)
    assert refused.value.status == 409
    assert not core.read_namespaced_pod(name, namespace).spec.node_name
