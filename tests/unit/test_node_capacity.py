"""A Node read into ledger terms: RAM, per-node overrides, and each bad value named."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from headroom.api.constants import GPU_POLICY_ANNOTATION, VRAM_RATIO_ANNOTATION
from headroom.api.gpus import GpuPolicy
from headroom.api.limits import Limits
from headroom.objects.gpus import gpu_inventory
from headroom.objects.nodes import node_capacity

DEFAULTS = Limits(max_vram_overcommit_ratio=Fraction(1), gpu_policy=GpuPolicy.BINPACK)


def node(
    annotations: dict[str, Any] | None = None, labels: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "annotations": annotations or {}, "labels": labels or {}},
        "status": {"allocatable": {"memory": "8Gi"}, "capacity": {"memory": "9Gi"}},
    }


def test_gpu_overrides_from_annotations() -> None:
    capacity = node_capacity(
        node({VRAM_RATIO_ANNOTATION: "1.5", GPU_POLICY_ANNOTATION: "spread"}),
        DEFAULTS,
        "allocatable",
    )
    assert capacity.problems == []
    assert capacity.total_ram_mb == 8192
    assert capacity.limits.max_vram_overcommit_ratio == Fraction(3, 2)
    assert capacity.limits.gpu_policy == GpuPolicy.SPREAD
    unlimited = node_capacity(node({VRAM_RATIO_ANNOTATION: "0"}), DEFAULTS, "allocatable")
    assert unlimited.limits.max_vram_overcommit_ratio == 0


def test_no_annotations_keep_the_configured_defaults() -> None:
    defaults = Limits(max_vram_overcommit_ratio=Fraction(2), gpu_policy=GpuPolicy.SPREAD)
    capacity = node_capacity(node(), defaults, "capacity")
    assert capacity.total_ram_mb == 9216
    assert capacity.limits == defaults
    assert capacity.problems == []


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        (VRAM_RATIO_ANNOTATION, "lots"),
        (VRAM_RATIO_ANNOTATION, "-1"),
        (VRAM_RATIO_ANNOTATION, "101"),
        (VRAM_RATIO_ANNOTATION, "1/0"),
        (GPU_POLICY_ANNOTATION, "pack"),
        (GPU_POLICY_ANNOTATION, "Binpack"),
        (GPU_POLICY_ANNOTATION, ""),
    ],
)
def test_a_bad_override_is_named_and_the_default_used(annotation: str, value: str) -> None:
    capacity = node_capacity(
        node({annotation: value, "headroom.dev/max-overcommit-ratio": "2"}),
        DEFAULTS,
        "allocatable",
    )
    [problem] = capacity.problems
    assert annotation in problem
    assert repr(value) in problem
    assert problem.endswith("default used")
    assert capacity.limits.max_vram_overcommit_ratio == DEFAULTS.max_vram_overcommit_ratio
    assert capacity.limits.gpu_policy == DEFAULTS.gpu_policy
    assert capacity.limits.max_overcommit_ratio == 2  # the other overrides still apply
    assert capacity.total_ram_mb == 8192


def test_vram_is_the_inventorys_not_gfd_count_times_memory() -> None:
    """node_capacity used to read VRAM as ``gpu.memory × gpu.count`` (and asserted
    nothing about MIG); under MIG mixed that counted the MIG-enabled GPU on top of its
    MIG devices. VRAM now comes from the inventory alone, and a bad GFD label is the
    inventory's problem (BadGpuInventory), not a BadHeadroomSettings one."""
    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.replicas": "0",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/mig-1g.10gb.count": "7",
        "nvidia.com/mig-1g.10gb.memory": "9984",
    }
    capacity = node_capacity(node(labels=labels), DEFAULTS, "allocatable")
    assert not hasattr(capacity, "vram_mb")
    assert gpu_inventory(node(labels=labels)).total_mb == 7 * 9984

    bad = node(labels={"nvidia.com/gpu.memory": "abc"})
    assert node_capacity(bad, DEFAULTS, "allocatable").problems == []
    [problem] = gpu_inventory(bad).problems
    assert "nvidia.com/gpu.memory" in problem
    assert "'abc'" in problem
