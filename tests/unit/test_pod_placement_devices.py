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
from tests.unit.test_core_admission import T0, entry
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


def small_gpus_and_one_big_gpu() -> State:
    """``roomy`` (most RAM, 80 GiB of VRAM as two 40 GiB GPUs) and ``tight`` (less RAM,
    one 80 GiB GPU): a 60 GiB claim on one GPU has room in either node's VRAM sum, but
    only ``tight``'s GPU can ever hold it."""
    built = State(Limits(system_reserve_mb=0))
    for name, ram, gpus in (("roomy", 512 * GIB, 2), ("tight", 64 * GIB, 1)):
        built.ledger.set_node_capacity(name, ram, 80 * GIB)
        devices = tuple(
            GpuDevice(f"GPU-{name}-{i}", 80 * GIB // gpus, ref=f"d/{name}/{i}") for i in range(gpus)
        )
        built.ledger.set_node_devices(name, devices)
        built.node_facts[name] = NodeFacts(name, {})
    return built


def test_a_node_whose_vram_sum_fits_but_no_single_gpu_does_is_ordered_after() -> None:
    """Issue 31: the operator's placement ranks by the ledger's node order, per-device fit
    included, as ``kubectl headroom fit`` does: the node with the most RAM comes first by
    the order, but no GPU of it fits the claim, so the claim goes to the other one."""
    nodes = small_gpus_and_one_big_gpu()
    claim = PodClaim(4 * GIB, vram_mb=60 * GIB)
    assert choose_node(nodes, [], gated(), claim, T0) == Placement("tight")
    small = PodClaim(4 * GIB, vram_mb=30 * GIB)  # fits one of roomy's GPUs: roomy first
    assert choose_node(nodes, [], gated(), small, T0) == Placement("roomy")


def test_with_no_node_free_the_pod_waits_where_a_gpu_could_hold_it() -> None:
    """Issue 31, the one behaviour change: when no node fits now, the pod waits on the best
    node whose devices could hold its claim once other claims leave, not on the node with
    the most RAM, where no single GPU ever could (it waited there before)."""
    nodes = small_gpus_and_one_big_gpu()
    held = entry("other/held", 1 * GIB, node="tight", vram=80 * GIB)
    assert nodes.ledger.reserve(held, T0).admitted
    claim = PodClaim(4 * GIB, vram_mb=60 * GIB)
    assert choose_node(nodes, [], gated(), claim, T0) == Placement("tight")
