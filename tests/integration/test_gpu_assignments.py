"""GPU device assignments on the real control plane: kept across a restart, and
handed to a gated pod (issue 20).

The node's GPUs come from GPU Feature Discovery labels (two 80 GiB devices,
``gfd-0`` and ``gfd-1``); the inventory's sources are tested in
test_gpu_inventory_live.py. What is checked here is what the decision does with
them: the assignment written in status is what a new operator holds again (a
claim that fits only beside the recorded holdings is admitted there, one that
does not is refused with the per-device numbers, and nothing is decided twice),
and a gated pod learns its devices in the patch that ungates it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.integration.test_pod_gates import claim_pod, untaint, wait_ungated

GIB = 1024
TWO_80 = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "81920"}


def test_a_restart_holds_exactly_the_recorded_devices(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"gpu-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="64Gi", labels=TWO_80)
    first = run_operator()
    rsv.create(custom, namespace, "a", node, 1024, 50 * GIB)
    rsv.create(custom, namespace, "b", node, 1024, 20 * GIB, gpus=2)  # 10 GiB on each
    before = {n: rsv.wait_for(custom, namespace, n)["status"] for n in ("a", "b")}
    assert before["a"]["devices"] == [{"id": "gfd-0", "memoryMB": 50 * GIB}]
    assert before["b"]["devices"] == [
        {"id": "gfd-0", "memoryMB": 10 * GIB},
        {"id": "gfd-1", "memoryMB": 10 * GIB},
    ]
    first.stop()

    run_operator()  # rebuilds from the statuses: gfd-0 holds 60 GiB, gfd-1 10 GiB
    rsv.create(custom, namespace, "c", node, 1024, 30 * GIB)  # binpack: gfd-0 is too full
    c = rsv.wait_for(custom, namespace, "c")["status"]
    assert (c["phase"], c["devices"]) == ("Admitted", [{"id": "gfd-1", "memoryMB": 30 * GIB}])
    rsv.create(custom, namespace, "d", node, 1024, 45 * GIB)  # 60 GiB free in sum, 40 at most
    d = rsv.wait_for(custom, namespace, "d")["status"]
    assert (d["phase"], d["reason"]) == ("Rejected", "InsufficientVRAM")
    assert d["message"] == (
        f"node {node}: needs 1 device with 46080 MiB free; largest free 40960 MiB "
        "(gfd-1 80 GiB, 40960 held)"
    )
    for name, status in before.items():  # not decided again
        after = rsv.get(custom, namespace, name)["status"]
        assert (after["decisionID"], after["devices"]) == (
            status["decisionID"],
            status["devices"],
        )


def test_a_gated_pod_learns_its_devices_as_it_is_ungated(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    pool = f"p{uuid.uuid4().hex[:8]}"
    node = f"gpu-{pool}"
    make_node(node, memory="64Gi", labels={"pool": pool, **TWO_80})
    untaint(core, node)
    run_operator()
    annotations = {"headroom.dev/vram": "100Gi", "headroom.dev/gpus": "2"}
    core.create_namespaced_pod(namespace, claim_pod("train", pool, "1Gi", annotations=annotations))
    reservation = rsv.wait_for(custom, namespace, "train")
    assert reservation["spec"]["gpus"] == 2
    assert reservation["status"]["devices"] == [
        {"id": "gfd-0", "memoryMB": 50 * GIB},
        {"id": "gfd-1", "memoryMB": 50 * GIB},
    ]
    pod = wait_ungated(core, namespace, "train")
    assert pod.metadata.annotations["headroom.dev/devices"] == "gfd-0,gfd-1"
    assert pod.metadata.annotations["headroom.dev/reservation"] == "train"
