"""A node's GPU inventory on the real API server: ResourceSlices, HAMi, GFD, and their
Warnings.

The operator runs as a subprocess against kube-apiserver; the tests write what a DRA
driver, HAMi's device plugin or GPU Feature Discovery would (ResourceSlices of
``resource.k8s.io/v1``, the ``hami.io/node-nvidia-register`` annotation, GFD labels)
and read the operator's answer where a user would: a Reservation's status, the
NodeHeadroom's ``vramCapacityMB``, Warning Events on the Node.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.polling import eventually

Start = Callable[..., OperatorProcess]
DRIVER = "gpu.nvidia.com"
GIB = 1024


def gpu(name: str, memory: str, *, kind: str = "gpu", parent: str | None = None) -> dict[str, Any]:
    """A device as NVIDIA's DRA driver publishes it."""
    attributes: dict[str, Any] = {
        "uuid": {"string": f"{kind.upper()}-{name}"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "type": {"string": kind},
    }
    if parent is not None:
        attributes["parentUUID"] = {"string": parent}
        attributes["profile"] = {"string": "3g.40gb"}
    return {"name": name, "attributes": attributes, "capacity": {"memory": {"value": memory}}}


def resource_slice(
    name: str,
    node: str,
    devices: list[dict[str, Any]],
    *,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {
                "name": pool or node,
                "generation": generation,
                "resourceSliceCount": count,
            },
            "devices": devices,
        },
    }


@pytest.fixture
def slices(custom: client.CustomObjectsApi) -> Iterator[Callable[..., None]]:
    """Create ResourceSlices (``slices(body, ...)``); all deleted after the test."""
    created: list[str] = []

    def create(*bodies: dict[str, Any]) -> None:
        for body in bodies:
            custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)
            created.append(body["metadata"]["name"])

    yield create
    for name in created:
        delete_slice(custom, name)


def delete_slice(custom: client.CustomObjectsApi, name: str) -> None:
    try:
        custom.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name)
    except client.ApiException as error:
        if error.status != 404:
            raise


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def vram_capacity(custom: client.CustomObjectsApi, node: str) -> Any:
    obj = custom.get_cluster_custom_object("headroom.dev", "v1alpha1", "nodeheadrooms", node)
    return (obj.get("status") or {}).get("vramCapacityMB")


def wait_vram(custom: client.CustomObjectsApi, node: str, expected: int | None) -> None:
    def check() -> None:
        try:
            assert vram_capacity(custom, node) == expected
        except client.ApiException as error:
            raise AssertionError(f"no NodeHeadroom for {node}: {error.status}") from None

    eventually(check, timeout=20)


def warnings(core: client.CoreV1Api, node: str, reason: str) -> list[str]:
    return [
        e.message
        for e in core.list_namespaced_event("default").items
        if e.involved_object.name == node and e.reason == reason and e.type == "Warning"
    ]


def wait_warning(core: client.CoreV1Api, node: str, reason: str, *parts: str) -> str:
    def check() -> str:
        found = [m for m in warnings(core, node, reason) if all(p in m for p in parts)]
        assert found, f"{node}: no {reason} with {parts}: {warnings(core, node, reason)}"
        return found[0]

    result: str = eventually(check, timeout=20)
    return result


def decided(custom: client.CustomObjectsApi, namespace: str, name: str) -> tuple[str, str, str]:
    status = rsv.wait_for(custom, namespace, name)["status"]
    return status["phase"], status["reason"], status.get("message", "")


# -- DRA ResourceSlices ----------------------------------------------------------------------


def test_two_80gib_gpus_admit_two_51200_mib_claims_and_refuse_the_third(
    run_operator: Start,
    make_node: Callable[..., Any],
    slices: Callable[..., None],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """Listed at start-up, before any reservation is decided: 150 GiB < 160 GiB, but no
    device has 51200 MiB left for the third."""
    node = unique("dra")
    make_node(node, memory="64Gi")
    slices(resource_slice(node, node, [gpu(f"{node}-0", "80Gi"), gpu(f"{node}-1", "80Gi")]))
    run_operator()
    wait_vram(custom, node, 2 * 80 * GIB)
    for name in ("a", "b", "c"):
        rsv.create(custom, namespace, name, node, 16, 51200)
        decided(custom, namespace, name)  # one at a time: "c" is the one left over
    assert decided(custom, namespace, "a")[:2] == ("Admitted", "Fits")
    assert decided(custom, namespace, "b")[:2] == ("Admitted", "Fits")
    phase, reason, message = decided(custom, namespace, "c")
    assert (phase, reason) == ("Rejected", "InsufficientVRAM")
    assert "needs 1 device with 51200 MiB free" in message


def test_slices_followed_by_the_watch_mig_devices_and_a_pool_mid_update(
    run_operator: Start,
    make_node: Callable[..., Any],
    slices: Callable[..., None],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    mig, pooled = unique("mig"), unique("pool")
    make_node(mig, memory="64Gi")
    make_node(pooled, memory="64Gi")
    run_operator()
    wait_vram(custom, mig, None)  # no source yet: VRAM not enforced

    # Static MIG: the parent GPU is published too, and is not counted on top.
    parent = "GPU-parent"
    migs = [gpu(f"{mig}-m{i}", "40Gi", kind="mig", parent=parent) for i in range(2)]
    whole = gpu(f"{mig}-whole", "80Gi")
    whole["attributes"]["uuid"] = {"string": parent}
    slices(resource_slice(mig, mig, [whole, *migs]))
    wait_vram(custom, mig, 2 * 40 * GIB)
    rsv.create(custom, namespace, "on-mig", mig, 16, 40 * GIB)
    assert decided(custom, namespace, "on-mig")[:2] == ("Admitted", "Fits")
    rsv.create(custom, namespace, "too-big-for-mig", mig, 16, 41 * GIB)
    assert decided(custom, namespace, "too-big-for-mig")[:2] == ("Rejected", "InsufficientVRAM")

    # A pool over two slices: counted once both are there.
    pool = f"{pooled}-pool"
    first = resource_slice(f"{pooled}-g1a", pooled, [gpu(f"{pooled}-a", "40Gi")], pool=pool)
    second = resource_slice(f"{pooled}-g1b", pooled, [gpu(f"{pooled}-b", "40Gi")], pool=pool)
    first["spec"]["pool"]["resourceSliceCount"] = second["spec"]["pool"]["resourceSliceCount"] = 2
    slices(first)
    slices(second)
    wait_vram(custom, pooled, 2 * 40 * GIB)

    # Generation 2, one slice of two so far: pending, the last complete inventory stays.
    bumped = [
        resource_slice(
            f"{pooled}-g2{x}", pooled, [gpu(f"{pooled}-{x}", "80Gi")], pool=pool, generation=2
        )
        for x in "ab"
    ]
    for body in bumped:
        body["spec"]["pool"]["resourceSliceCount"] = 2
    slices(bumped[0])
    # Enforced on generation 1 still: not unknown (which would admit anything), and not
    # the one 80 GiB device of generation 2 seen so far (which would admit this).
    rsv.create(custom, namespace, "during-update", pooled, 16, 41 * GIB)
    phase, reason, message = decided(custom, namespace, "during-update")
    assert (phase, reason) == ("Rejected", "InsufficientVRAM")
    assert f"needs 1 device with {41 * GIB} MiB free" in message
    assert vram_capacity(custom, pooled) == 2 * 40 * GIB
    slices(bumped[1])
    wait_vram(custom, pooled, 2 * 80 * GIB)  # the old generation is ignored
    for name in (f"{pooled}-g1a", f"{pooled}-g1b"):
        delete_slice(custom, name)  # as the driver would, afterwards
    assert vram_capacity(custom, pooled) == 2 * 80 * GIB
    assert not warnings(core, pooled, "BadGpuInventory")
    assert not warnings(core, mig, "BadGpuInventory")


def test_a_slice_removed_under_admitted_claims_warns_and_reclaims_nothing(
    run_operator: Start,
    make_node: Callable[..., Any],
    slices: Callable[..., None],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    node = unique("gone")
    make_node(node, memory="64Gi")
    kept = resource_slice(f"{node}-kept", node, [gpu(f"{node}-0", "80Gi")], pool=f"{node}-p0")
    lost = resource_slice(f"{node}-lost", node, [gpu(f"{node}-1", "80Gi")], pool=f"{node}-p1")
    slices(kept, lost)
    run_operator()
    wait_vram(custom, node, 2 * 80 * GIB)
    rsv.create(custom, namespace, "first", node, 16, 60 * GIB)
    rsv.create(custom, namespace, "second", node, 16, 60 * GIB)
    assert decided(custom, namespace, "first")[0] == "Admitted"
    assert decided(custom, namespace, "second")[0] == "Admitted"

    delete_slice(custom, f"{node}-lost")
    wait_vram(custom, node, 80 * GIB)
    message = wait_warning(core, node, "OverCommitted", "no longer in the inventory")
    assert f"node {node}" in message
    for name in ("first", "second"):
        assert rsv.get(custom, namespace, name)["status"]["phase"] == "Admitted"


# -- HAMi and GFD ----------------------------------------------------------------------------


def test_hami_json_and_text_and_gfd_mig_mixed_without_double_counting(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    as_json, as_text, mixed = unique("hami-json"), unique("hami-text"), unique("gfd-mixed")
    register = [
        {"id": "GPU-j0", "index": 0, "count": 10, "devmem": 24576, "type": "A10", "health": True},
        {"id": "GPU-j1", "index": 1, "count": 10, "devmem": 24576, "type": "A10", "health": True},
        {"id": "GPU-j2", "index": 2, "count": 10, "devmem": 24576, "type": "A10"},  # unhealthy
    ]
    annotation = "hami.io/node-nvidia-register"
    make_node(as_json, memory="64Gi", annotations={annotation: json.dumps(register)})
    text = "GPU-t0,10,16384,100,T4,0,true:GPU-t1,10,16384,100,T4,0,false:"
    make_node(as_text, memory="64Gi", annotations={annotation: text})
    make_node(
        mixed,
        memory="64Gi",
        labels={
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/gpu.count": "1",
            "nvidia.com/gpu.replicas": "0",
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/mig-1g.10gb.count": "7",
            "nvidia.com/mig-1g.10gb.memory": "9984",
        },
    )
    run_operator()
    wait_vram(custom, as_json, 2 * 24576)
    wait_vram(custom, as_text, 16384)
    wait_vram(custom, mixed, 7 * 9984)  # not 81920 + 7 × 9984

    rsv.create(custom, namespace, "split", as_json, 16, 30000)  # 30000 < 49152, > 24576
    assert decided(custom, namespace, "split")[:2] == ("Rejected", "InsufficientVRAM")
    rsv.create(custom, namespace, "fits", as_json, 16, 24576)
    assert decided(custom, namespace, "fits")[:2] == ("Admitted", "Fits")
    rsv.create(custom, namespace, "slice", mixed, 16, 9984)
    assert decided(custom, namespace, "slice")[:2] == ("Admitted", "Fits")
    rsv.create(custom, namespace, "whole", mixed, 16, 20000)
    assert decided(custom, namespace, "whole")[:2] == ("Rejected", "InsufficientVRAM")
    for node in (as_json, as_text, mixed):
        assert not warnings(core, node, "BadGpuInventory")


# -- bad values, and per-node settings -------------------------------------------------------


def test_each_bad_inventory_is_a_warning_on_its_node_and_the_others_still_admit(
    run_operator: Start,
    make_node: Callable[..., Any],
    slices: Callable[..., None],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    bad_hami, bad_gfd, bad_pool, good = (unique(p) for p in ("bhami", "bgfd", "bpool", "good"))
    annotation = "hami.io/node-nvidia-register"
    hami = json.dumps([{"id": "GPU-x", "devmem": "lots", "health": True}])
    make_node(bad_hami, memory="64Gi", annotations={annotation: hami})
    make_node(bad_gfd, memory="64Gi", labels={"nvidia.com/gpu.memory": "abc"})
    make_node(bad_pool, memory="64Gi")
    make_node(good, memory="64Gi", labels={"nvidia.com/gpu.memory": "8192"})
    # Two slices in a pool that declares one.
    slices(
        resource_slice(f"{bad_pool}-a", bad_pool, [gpu(f"{bad_pool}-a", "80Gi")]),
        resource_slice(f"{bad_pool}-b", bad_pool, [gpu(f"{bad_pool}-b", "80Gi")]),
    )
    run_operator()
    wait_warning(core, bad_hami, "BadGpuInventory", annotation, ".devmem", "'lots'", "not enforced")
    wait_warning(core, bad_gfd, "BadGpuInventory", "nvidia.com/gpu.memory", "'abc'")
    wait_warning(core, bad_pool, "BadGpuInventory", "resourceSliceCount is 1", "not enforced")
    for node in (bad_hami, bad_gfd, bad_pool):
        wait_vram(custom, node, None)
        rsv.create(custom, namespace, f"on-{node}", node, 16, 100 * GIB)  # VRAM not enforced
        assert decided(custom, namespace, f"on-{node}")[:2] == ("Admitted", "Fits")
    wait_vram(custom, good, 8192)
    rsv.create(custom, namespace, "good-fits", good, 16, 8192)
    assert decided(custom, namespace, "good-fits")[:2] == ("Admitted", "Fits")
    rsv.create(custom, namespace, "good-full", good, 16, 1)
    assert decided(custom, namespace, "good-full")[:2] == ("Rejected", "InsufficientVRAM")
    assert not warnings(core, good, "BadGpuInventory")


def test_gpu_policy_and_vram_ratio_per_node_and_their_bad_values(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    """binpack (the config) puts 30 + 30 GiB on one of two 80 GiB GPUs and so 60 GiB
    still fits; spread (the annotation) puts them apart and 60 GiB does not."""
    packed, spread, loose, bad = (unique(p) for p in ("packed", "spread", "loose", "bad"))
    labels = {"nvidia.com/gpu.memory": str(80 * GIB), "nvidia.com/gpu.count": "2"}
    make_node(packed, memory="64Gi", labels=labels)
    make_node(
        spread, memory="64Gi", labels=labels, annotations={"headroom.dev/gpu-policy": "spread"}
    )
    make_node(
        loose,
        memory="64Gi",
        labels={"nvidia.com/gpu.memory": str(80 * GIB)},
        annotations={"headroom.dev/max-vram-overcommit-ratio": "1.5"},
    )
    make_node(
        bad,
        memory="64Gi",
        labels=labels,
        annotations={
            "headroom.dev/gpu-policy": "pack",
            "headroom.dev/max-vram-overcommit-ratio": "lots",
        },
    )
    run_operator({"limits": {"gpuPolicy": "binpack"}})
    for node in (packed, spread, bad):
        wait_vram(custom, node, 2 * 80 * GIB)
        for i in range(2):
            rsv.create(custom, namespace, f"{node}-{i}", node, 16, 30 * GIB)
            assert decided(custom, namespace, f"{node}-{i}")[0] == "Admitted"
        rsv.create(custom, namespace, f"{node}-big", node, 16, 60 * GIB)
    assert decided(custom, namespace, f"{packed}-big")[:2] == ("Admitted", "Fits")
    assert decided(custom, namespace, f"{spread}-big")[:2] == ("Rejected", "InsufficientVRAM")
    assert decided(custom, namespace, f"{bad}-big")[:2] == ("Admitted", "Fits")  # binpack
    message = wait_warning(core, bad, "BadHeadroomSettings", "headroom.dev/gpu-policy", "'pack'")
    assert "headroom.dev/max-vram-overcommit-ratio" in message
    assert "'lots'" in message
    assert "default used" in message

    rsv.create(custom, namespace, "loose-big", loose, 16, 120 * GIB)  # 80 GiB × 1.5
    assert decided(custom, namespace, "loose-big")[:2] == ("Admitted", "Fits")
