"""A gated pod's node, for a claim with VRAM: only where the ledger would find it devices
now, after what is held on them outside Headroom (issue 30, item 2), not wherever the
node's VRAM sum has room."""

from __future__ import annotations

from headroom.api.claims import PodClaim
from headroom.api.gpus import GpuDevice
from headroom.api.limits import Limits
from headroom.control.placement import Placement, choose_node
from headroom.control.state import State
from headroom.objects.nodeconstraints import NodeFacts
from tests.unit.test_core_admission import T0
from tests.unit.test_pod_placement_quotas import gated

GIB = 1024


def gpu_nodes() -> State:
    """``big`` (most RAM: placement's first choice) and ``small``, each with two 80 GiB GPUs."""
    built = State(Limits(system_reserve_mb=0))
    for name, ram in (("big", 512 * GIB), ("small", 64 * GIB)):
        built.ledger.set_node_capacity(name, ram, 160 * GIB)
        devices = tuple(
            GpuDevice(f"GPU-{name}-{i}", 80 * GIB, ref=f"d/{name}/{i}") for i in range(2)
        )
        built.ledger.set_node_devices(name, devices)
        built.set_node_facts(name, NodeFacts(name, {}))
    return built


def test_a_node_whose_gpus_are_held_by_device_plugin_pods_is_not_chosen() -> None:
    nodes = gpu_nodes()
    claim = PodClaim(4 * GIB, vram_mb=40 * GIB)
    assert choose_node(nodes, [], gated(), claim, T0) == Placement("big")
    nodes.ledger.set_device_plugin_pod(("ml", "cuda"), "big", 2)  # both of big's GPUs
    assert choose_node(nodes, [], gated(), claim, T0) == Placement("small")


def test_a_claim_spanning_no_single_free_device_goes_where_one_is_free() -> None:
    nodes = gpu_nodes()
    nodes.ledger.set_device_plugin_pod(("ml", "cuda"), "big", 1)  # 80 GiB left on big
    two_gpus = PodClaim(4 * GIB, vram_mb=120 * GIB, gpus=2)  # 60 GiB on each of two
    assert choose_node(nodes, [], gated(), two_gpus, T0) == Placement("small")
    one_gpu = PodClaim(4 * GIB, vram_mb=60 * GIB)
    assert choose_node(nodes, [], gated(), one_gpu, T0) == Placement("big")


def test_with_no_node_free_the_pod_waits_on_the_best_one_as_before() -> None:
    nodes = gpu_nodes()
    for node in ("big", "small"):
        nodes.ledger.set_device_plugin_pod(("ml", f"cuda-{node}"), node, 2)
    claim = PodClaim(4 * GIB, vram_mb=40 * GIB)
    assert choose_node(nodes, [], gated(), claim, T0) == Placement("big")
