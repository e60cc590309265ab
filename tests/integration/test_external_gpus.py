"""GPUs held outside Headroom, on the real control plane (issue 30, item 2).

A DRA ResourceClaim allocated on a device and a device-plugin GPU pod both reduce that
device's free VRAM in the NodeHeadroom. No kube-scheduler runs here: the tests write
what it would, a claim's ``status.allocation`` through the status subresource and a
pod's ``spec.nodeName``; the kubelet's part, a pod ending, is its status phase. The
API server stores ``consumedCapacity`` because ``DRAConsumableCapacity`` is beta and on
by default in 1.36; it does not check a pod's ``nvidia.com/gpu`` against the Node's
allocatable (the kubelet does), so the Node need not advertise it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.integration.test_gpu_inventory_live import (
    DRIVER,
    GIB,
    decided,
    gpu,
    resource_slice,
    slices,  # noqa: F401 (a fixture)
    unique,
    wait_vram,
)
from tests.integration.test_pod_gates import claim_pod, finish, untaint
from tests.polling import eventually

Start = Callable[..., OperatorProcess]
GROUP, VERSION = "resource.k8s.io", "v1"


def headroom_status(custom: client.CustomObjectsApi, node: str) -> dict[str, Any]:
    """The node's NodeHeadroom status; AssertionError (for ``eventually``) before it exists."""
    try:
        obj = custom.get_cluster_custom_object("headroom.dev", "v1alpha1", "nodeheadrooms", node)
    except client.ApiException as error:
        raise AssertionError(f"no NodeHeadroom for {node}: {error.status}") from None
    status: dict[str, Any] = obj.get("status") or {}
    return status


def devices_of(custom: client.CustomObjectsApi, node: str) -> dict[str, dict[str, Any]]:
    return {d["id"]: d for d in headroom_status(custom, node).get("devices") or []}


def device_plugin_pod(name: str, node: str, gpus: int = 1) -> dict[str, Any]:
    """A pod bound to ``node`` (as kube-scheduler binds it) asking NVIDIA's device plugin
    for ``gpus`` whole GPUs."""
    limits = {"nvidia.com/gpu": str(gpus)}
    container = {"name": "main", "image": "busybox", "resources": {"limits": limits}}
    return {"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [container]}}


def wait_device(custom: client.CustomObjectsApi, node: str, device: str, **expected: Any) -> None:
    def check() -> None:
        found = devices_of(custom, node).get(device, {})
        assert {key: found.get(key) for key in expected} == expected, found

    eventually(check, timeout=20)


@pytest.fixture
def resource_claims(custom: client.CustomObjectsApi) -> Iterator[Callable[..., None]]:
    """``claim(namespace, name, *results, consumed=None)``: a ResourceClaim, then its
    allocation written as kube-scheduler would; deleted after the test."""
    made: list[tuple[str, str]] = []

    def create(namespace: str, name: str, pool: str, device: str, consumed: str | None) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
            },
        }
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", body)
        made.append((namespace, name))
        result: dict[str, Any] = {
            "request": "gpu",
            "driver": DRIVER,
            "pool": pool,
            "device": device,
        }
        if consumed is not None:  # a share of a device that allows several allocations
            result["shareID"] = str(uuid.uuid4())
            result["consumedCapacity"] = {"memory": consumed}
        status = {"status": {"allocation": {"devices": {"results": [result]}}}}
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "resourceclaims", name, status
        )

    yield create
    for namespace, name in made:
        try:
            custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", name
            )
        except client.ApiException as error:
            if error.status != 404:
                raise


def test_a_dra_claim_takes_its_device_until_it_is_deallocated(
    run_operator: Start,
    make_node: Callable[..., Any],
    slices: Callable[..., None],  # noqa: F811
    resource_claims: Callable[..., None],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = unique("dra-held")
    first, second = f"{node}-0", f"{node}-1"
    uuid_first, uuid_second = f"GPU-{first}", f"GPU-{second}"  # gpu() names them so
    make_node(node, memory="64Gi")
    slices(resource_slice(node, node, [gpu(first, "80Gi"), gpu(second, "80Gi")]))
    run_operator()
    wait_vram(custom, node, 2 * 80 * GIB)

    resource_claims(namespace, "trainer", node, first, None)  # the whole device
    wait_device(
        custom, node, uuid_first, freeMB=0, externalMB=80 * GIB, heldOutside="ResourceClaim"
    )
    wait_device(custom, node, uuid_second, freeMB=80 * GIB, externalMB=0)
    # Binpack would put the first claim on the first device by id; it is taken, so not there.
    rsv.create(custom, namespace, "elsewhere", node, 16, 50 * GIB)
    status = rsv.wait_for(custom, namespace, "elsewhere")["status"]
    assert status["phase"] == "Admitted"
    assert [d["id"] for d in status["devices"]] == [uuid_second]
    rsv.create(custom, namespace, "no-room", node, 16, 50 * GIB)
    phase, reason, message = decided(custom, namespace, "no-room")
    assert (phase, reason) == ("Rejected", "InsufficientVRAM")
    # 30 GiB left on the second device, and nothing offered on the first.
    assert "needs 1 device with 51200 MiB free; largest free 30720 MiB" in message

    # A share of the second device: its consumed memory only.
    resource_claims(namespace, "share", node, second, "20Gi")
    wait_device(custom, node, uuid_second, externalMB=20 * GIB, freeMB=10 * GIB, heldOutside=None)

    rsv.create(custom, namespace, "patient", node, 16, 60 * GIB, wait="5m")
    rsv.wait_for(custom, namespace, "patient", phases=("Queued",))
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "resourceclaims", "trainer", {"status": {"allocation": None}}
    )  # deallocated, as the resource claim controller does once no pod uses it
    status = rsv.wait_for(custom, namespace, "patient")["status"]
    assert status["phase"] == "Admitted"
    assert [d["id"] for d in status["devices"]] == [uuid_first]
    wait_device(custom, node, uuid_first, externalMB=0, freeMB=20 * GIB, heldOutside=None)


def test_a_device_plugin_pod_takes_a_whole_gpu_until_it_ends(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = unique("plugin-held")
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": str(80 * GIB)}
    make_node(node, memory="64Gi", labels=labels)  # GFD, next to NVIDIA's device plugin
    run_operator()
    wait_vram(custom, node, 2 * 80 * GIB)
    rsv.create(custom, namespace, "small", node, 16, 10 * GIB)
    small = rsv.wait_for(custom, namespace, "small")["status"]
    assert [d["id"] for d in small["devices"]] == ["gfd-0"]

    core.create_namespaced_pod(namespace, device_plugin_pod("cuda", node))
    # The API does not say which GPU: taken as the emptiest, the one no claim is on.
    wait_device(custom, node, "gfd-1", freeMB=0, externalMB=80 * GIB, heldOutside="DevicePlugin")
    wait_device(custom, node, "gfd-0", freeMB=70 * GIB, externalMB=0, heldOutside=None)
    assert headroom_status(custom, node)["devicePluginGPUs"] == 1

    rsv.create(custom, namespace, "big", node, 16, 75 * GIB, wait="5m")
    rsv.wait_for(custom, namespace, "big", phases=("Queued",))
    finish(core, namespace, "cuda")  # Succeeded: its GPU is free again
    big = rsv.wait_for(custom, namespace, "big")["status"]
    assert big["phase"] == "Admitted"
    assert [d["id"] for d in big["devices"]] == ["gfd-1"]
    wait_device(custom, node, "gfd-1", externalMB=0, heldOutside=None, freeMB=5 * GIB)
    assert headroom_status(custom, node)["devicePluginGPUs"] == 0


def test_holders_there_before_the_operator_starts_count_in_its_first_decision(
    run_operator: Start,
    make_node: Callable[..., Any],
    slices: Callable[..., None],  # noqa: F811
    resource_claims: Callable[..., None],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """The rebuild lists claims and pods before it decides: a reservation created before
    the start is decided against both holders, on one node's two GPUs."""
    node = unique("both-held")
    first, second = f"{node}-0", f"{node}-1"
    make_node(node, memory="64Gi")
    slices(resource_slice(node, node, [gpu(first, "80Gi"), gpu(second, "80Gi")]))
    resource_claims(namespace, "trainer", node, first, None)
    core.create_namespaced_pod(namespace, device_plugin_pod("cuda", node))
    rsv.create(custom, namespace, "early", node, 16, 1 * GIB)  # undecided until the start
    run_operator()
    phase, reason, _ = decided(custom, namespace, "early")
    assert (phase, reason) == ("Rejected", "InsufficientVRAM")
    wait_device(custom, node, f"GPU-{first}", freeMB=0, heldOutside="ResourceClaim")
    wait_device(custom, node, f"GPU-{second}", freeMB=0, heldOutside="DevicePlugin")
    assert headroom_status(custom, node)["vramCapacityMB"] == 2 * 80 * GIB


def test_a_claim_on_a_dynamic_mig_partition_holds_its_whole_gpu(
    run_operator: Start,
    make_node: Callable[..., Any],
    slices: Callable[..., None],  # noqa: F811
    resource_claims: Callable[..., None],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """Partitions that consume a GPU's shared counters are not devices of their own
    (they overlap); an allocation of one takes the whole GPU, which runs nothing outside
    its MIG instances once one exists."""
    node = unique("mig-held")
    whole, partition = f"{node}-0", f"{node}-0-mig-3g-40gb-0"
    counters = "gpu-0-counters"
    carved = gpu(partition, "40Gi", kind="mig", parent=f"GPU-{whole}")
    carved["consumesCounters"] = [
        {"counterSet": counters, "counters": {"memory": {"value": "40Gi"}}}
    ]
    # A pool's counters and its devices are in slices of their own (the API refuses both in one).
    devices = resource_slice(node, node, [gpu(whole, "80Gi"), carved], count=2)
    shared = resource_slice(f"{node}-counters", node, [], pool=node, count=2)
    del shared["spec"]["devices"]
    shared["spec"]["sharedCounters"] = [
        {"name": counters, "counters": {"memory": {"value": "80Gi"}}}
    ]
    make_node(node, memory="64Gi")
    slices(shared, devices)
    run_operator()
    wait_vram(custom, node, 80 * GIB)  # the partition is not a device of its own
    wait_device(custom, node, f"GPU-{whole}", freeMB=80 * GIB, externalMB=0)

    resource_claims(namespace, "mig", node, partition, None)
    wait_device(
        custom, node, f"GPU-{whole}", freeMB=0, externalMB=80 * GIB, heldOutside="ResourceClaim"
    )
    rsv.create(custom, namespace, "on-the-gpu", node, 16, 1 * GIB)
    phase, reason, _ = decided(custom, namespace, "on-the-gpu")
    assert (phase, reason) == ("Rejected", "InsufficientVRAM")


def test_a_gated_pod_is_not_placed_on_the_roomiest_node_when_its_gpu_is_held(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """Placement asks the ledger's per-device fit: the node with the most RAM, whose only
    GPU a device-plugin pod holds, is passed over for the one whose GPU is free."""
    pool = unique("gpu-pool")
    nodes = {"big": f"{pool}-big", "small": f"{pool}-small"}
    gfd = {"pool": pool, "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": str(80 * GIB)}
    for key, memory in (("big", "256Gi"), ("small", "32Gi")):
        make_node(nodes[key], memory=memory, labels=gfd)
        untaint(core, nodes[key])
    core.create_namespaced_pod(namespace, device_plugin_pod("cuda", nodes["big"]))
    run_operator()
    wait_device(custom, nodes["big"], "gfd-0", freeMB=0, heldOutside="DevicePlugin")

    pod = claim_pod("train", pool, "4Gi", annotations={"headroom.dev/vram": "40Gi"})
    core.create_namespaced_pod(namespace, pod)
    reservation = rsv.wait_for(custom, namespace, "train")
    assert reservation["spec"]["node"] == nodes["small"]
    assert reservation["status"]["phase"] == "Admitted"
