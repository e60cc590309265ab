"""A node's GPU inventory read from DRA ResourceSlices, HAMi and GFD (issue 20).

Named cases from the issue (full GPUs and MIG devices in slices, two pools, a
generation bump, HAMi in both formats with absent fields, GFD MIG ``mixed``
without the double count, each bad value isolated to its node and source),
then properties: the parsers never raise on arbitrary JSON-like input, nor on
valid objects with any one part replaced by arbitrary JSON, and what they
return is always within bounds.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.api.constants import (
    HAMI_REGISTER_ANNOTATION,
    MAX_DEVICES_PER_SLICE,
    MAX_GPUS,
    MAX_MB,
)
from headroom.api.gpus import DeviceKind, GpuDevice, InventorySource
from headroom.objects.gpus import MAX_PROBLEMS, GpuInventory, gpu_inventory

NVIDIA = "gpu.nvidia.com"
UUID = "GPU-{:08x}-0000-1111-2222-333344445555"
MIG_UUID = "MIG-{:08x}-0000-1111-2222-333344445555"


def node(name: str = "gpu-1", labels: Any = None, annotations: Any = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}}


def gpu(index: int, memory: str = "80Gi", **extra: Any) -> dict[str, Any]:
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": UUID.format(index)},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
        },
        "capacity": {"memory": {"value": memory}},
        **extra,
    }


def mig(index: int, parent: int, memory: str = "4864Mi", **extra: Any) -> dict[str, Any]:
    return {
        "name": f"gpu-{parent}-mig-19-{index}-1",
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": MIG_UUID.format(index)},
            "parentUUID": {"string": UUID.format(parent)},
            "profile": {"string": "1g.5gb"},
        },
        "capacity": {"memory": {"value": memory}},
        **extra,
    }


def rslice(
    devices: list[dict[str, Any]],
    *,
    node_name: str = "gpu-1",
    driver: str = NVIDIA,
    pool: str = "gpu-1",
    generation: int = 1,
    count: int = 1,
    name: str = "gpu-1-gpu.nvidia.com-abcde",
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def memories(inventory: GpuInventory) -> dict[str, int]:
    assert inventory.devices is not None, inventory.problems
    return {device.id: device.memory_mb for device in inventory.devices}


# -- DRA ------------------------------------------------------------------------------------


def test_full_gpus_from_a_slice_by_uuid_with_memory_in_mib() -> None:
    inventory = gpu_inventory(node(), [rslice([gpu(0), gpu(1)])])
    assert inventory.source is InventorySource.DRA
    ref = "gpu.nvidia.com/gpu-1/gpu"
    assert inventory.devices == (
        GpuDevice(UUID.format(0), 81920, DeviceKind.GPU, None, "NVIDIA H100 80GB HBM3", f"{ref}-0"),
        GpuDevice(UUID.format(1), 81920, DeviceKind.GPU, None, "NVIDIA H100 80GB HBM3", f"{ref}-1"),
    )  # ref: the DRA name a ResourceClaim's allocation gives the device by
    assert inventory.total_mb == 163840


def test_quantities_are_rounded_down_to_whole_mib() -> None:
    bytes_80g = gpu(0, "80G")  # 80e9 bytes = 76293.945 MiB
    odd = gpu(1, str(4864 * 2**20 + 2**20 - 1))  # one byte short of 4865 MiB
    assert list(memories(gpu_inventory(node(), [rslice([bytes_80g, odd])])).values()) == [
        76293,
        4864,
    ]


def test_mig_devices_count_and_their_parent_does_not() -> None:
    devices = [gpu(0), gpu(1), *(mig(i, parent=1) for i in range(7))]
    inventory = gpu_inventory(node(), [rslice(devices)])
    assert memories(inventory) == {UUID.format(0): 81920} | {
        MIG_UUID.format(i): 4864 for i in range(7)
    }
    assert inventory.devices is not None
    assert {d.parent for d in inventory.devices if d.kind is DeviceKind.MIG} == {UUID.format(1)}
    # The parent is no device here, but a claim allocated on it holds each MIG device.
    parent_ref = "gpu.nvidia.com/gpu-1/gpu-1"
    assert {d.held_whole_by for d in inventory.devices if d.kind is DeviceKind.MIG} == {
        (parent_ref,)
    }


def test_partitionable_mig_devices_give_way_to_their_parent() -> None:
    counters: dict[str, Any] = {
        "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "5Gi"}}}]
    }
    devices = [gpu(0), *(mig(i, parent=0, **counters) for i in range(7))]
    inventory = gpu_inventory(node(), [rslice(devices)])
    assert memories(inventory) == {UUID.format(0): 81920}
    assert inventory.devices is not None  # the parent knows them: a claim on one holds it
    assert inventory.devices[0].held_whole_by == tuple(
        sorted(f"gpu.nvidia.com/gpu-1/gpu-0-mig-19-{i}-1" for i in range(7))
    )
    orphans = gpu_inventory(node(), [rslice([mig(0, parent=5, **counters)])])
    assert orphans.devices is None
    assert "overlapping partitions cannot be summed" in orphans.problems[0]


def test_two_pools_and_a_pool_over_two_slices_all_count() -> None:
    slices = [
        rslice([gpu(0)], pool="a", name="s-a"),
        rslice([gpu(1)], pool="b", count=2, name="s-b1"),
        rslice([gpu(2)], pool="b", count=2, name="s-b2"),
    ]
    assert set(memories(gpu_inventory(node(), slices))) == {UUID.format(i) for i in range(3)}


def test_only_the_newest_generation_counts() -> None:
    slices = [
        rslice([gpu(0), gpu(1)], generation=1, name="old"),
        rslice([gpu(0)], generation=2, name="new"),
    ]
    assert set(memories(gpu_inventory(node(), slices))) == {UUID.format(0)}


def test_a_newest_generation_not_all_published_is_pending_not_a_problem() -> None:
    slices = [
        rslice([gpu(0), gpu(1)], generation=1, name="old"),
        rslice([gpu(0)], generation=2, count=2, name="new-1"),
    ]
    inventory = gpu_inventory(node(), slices)
    assert inventory == GpuInventory(
        InventorySource.DRA,
        None,
        (),
        (f"pool {NVIDIA}/gpu-1 generation 2: 1 of 2 ResourceSlices seen",),
    )


def test_inconsistent_slice_counts_are_problems() -> None:
    too_many = [rslice([gpu(0)], name="x"), rslice([gpu(1)], name="y")]
    assert (
        "2 slices, but spec.pool.resourceSliceCount is 1"
        in (gpu_inventory(node(), too_many).problems[0])
    )
    disagree = [rslice([gpu(0)], count=2, name="x"), rslice([gpu(1)], count=3, name="y")]
    assert "disagree on resourceSliceCount: [2, 3]" in gpu_inventory(node(), disagree).problems[0]


def test_a_full_slice_of_128_devices_is_fine_and_129_is_not() -> None:
    full = gpu_inventory(node(), [rslice([gpu(i) for i in range(MAX_DEVICES_PER_SLICE)])])
    assert len(memories(full)) == 128
    over = gpu_inventory(node(), [rslice([gpu(i) for i in range(MAX_DEVICES_PER_SLICE + 1)])])
    assert over.devices is None
    assert "129 devices, at most 128" in over.problems[0]


def test_other_nodes_drivers_and_device_types_are_not_read() -> None:
    slices = [
        rslice([gpu(0)]),
        rslice([gpu(1)], node_name="gpu-2"),
        rslice([gpu(2)], driver="example.com/gpu", name="other-driver"),
        rslice([{"name": "nic-0", "attributes": {"type": {"string": "vfio"}}}], pool="p", name="z"),
    ]
    assert set(memories(gpu_inventory(node(), slices))) == {UUID.format(0)}
    configured = gpu_inventory(node(), slices, drivers=(NVIDIA, "example.com/gpu"))
    assert set(memories(configured)) == {UUID.format(0), UUID.format(2)}


def test_devices_without_uuid_are_named_by_driver_pool_and_name_qualified_attributes_work() -> None:
    device = {
        "name": "card-0",
        "attributes": {f"{NVIDIA}/type": {"string": "gpu"}},
        "capacity": {f"{NVIDIA}/memory": {"value": "24Gi"}},
    }
    assert memories(gpu_inventory(node(), [rslice([device])])) == {f"{NVIDIA}/gpu-1/card-0": 24576}


def test_tainted_devices_are_excluded() -> None:
    taint: dict[str, Any] = {"taints": [{"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}]}
    note: dict[str, Any] = {"taints": [{"key": "info", "effect": "None"}]}
    inventory = gpu_inventory(node(), [rslice([gpu(0, **taint), gpu(1, **note)])])
    assert set(memories(inventory)) == {UUID.format(1)}


def test_a_bad_value_names_the_slice_the_field_and_the_value_and_stays_on_its_node() -> None:
    slices = [
        rslice([gpu(0), gpu(1, memory="lots")]),
        rslice([gpu(2)], node_name="gpu-2", pool="gpu-2", name="fine"),
    ]
    bad = gpu_inventory(node(), slices)
    assert bad.source is InventorySource.DRA
    assert bad.devices is None
    assert bad.problems == (
        "ResourceSlice gpu-1-gpu.nvidia.com-abcde: spec.devices[1] (gpu-1).capacity.memory: "
        "not a memory quantity (e.g. 32Gi): 'lots'; VRAM not enforced",
    )
    assert set(memories(gpu_inventory(node("gpu-2"), slices))) == {UUID.format(2)}


def test_duplicate_devices_and_bad_pools_are_problems() -> None:
    twice = [rslice([gpu(0)], pool="a", name="a"), rslice([gpu(0)], pool="b", name="b")]
    assert "appears twice" in gpu_inventory(node(), twice).problems[0]
    broken = rslice([gpu(0)])
    broken["spec"]["pool"]["generation"] = "new"
    assert gpu_inventory(node(), [broken]).problems == (
        "ResourceSlice gpu-1-gpu.nvidia.com-abcde: spec.pool.generation: not a whole number: "
        "'new'; VRAM not enforced",
    )


# -- precedence -----------------------------------------------------------------------------

GFD_2X80 = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "81920"}
HAMI_ONE = json.dumps([{"id": UUID.format(9), "devmem": 40960, "health": True}])


def test_slices_win_over_hami_which_wins_over_gfd() -> None:
    full = node(labels=GFD_2X80, annotations={HAMI_REGISTER_ANNOTATION: HAMI_ONE})
    assert gpu_inventory(full, [rslice([gpu(0)])]).source is InventorySource.DRA
    assert gpu_inventory(full, []).source is InventorySource.HAMI
    assert gpu_inventory(node(labels=GFD_2X80)).source is InventorySource.GFD
    assert gpu_inventory(node()) == GpuInventory(None)


def test_a_bad_higher_source_does_not_fall_back_to_a_lower_one() -> None:
    full = node(labels=GFD_2X80, annotations={HAMI_REGISTER_ANNOTATION: "garbage"})
    inventory = gpu_inventory(full)
    assert inventory.source is InventorySource.HAMI
    assert inventory.devices is None


# -- HAMi -----------------------------------------------------------------------------------


def hami(value: str) -> GpuInventory:
    return gpu_inventory(node(annotations={HAMI_REGISTER_ANNOTATION: value}))


def test_hami_json_with_absent_omitempty_fields() -> None:
    value = json.dumps(
        [
            # index 0 and numa 0 are absent (omitempty); health true.
            {"id": UUID.format(0), "count": 10, "devmem": 81920, "devcore": 100,
             "type": "NVIDIA-NVIDIA H100 80GB HBM3", "mode": "hami-core", "health": True},
            # health false is absent: unhealthy, not counted.
            {"id": UUID.format(1), "index": 1, "count": 10, "devmem": 81920, "type": "NVIDIA"},
            # devmem absent is 0.
            {"id": UUID.format(2), "index": 2, "health": True},
        ]
    )  # fmt: skip
    inventory = hami(value)
    assert inventory.source is InventorySource.HAMI
    assert memories(inventory) == {UUID.format(0): 81920, UUID.format(2): 0}
    assert inventory.devices is not None
    assert inventory.devices[0].model == "NVIDIA-NVIDIA H100 80GB HBM3"


def test_hami_old_text_format_with_7_and_9_fields() -> None:
    value = (
        f"{UUID.format(0)},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
        f"{UUID.format(1)},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,false:"
        f"{UUID.format(2)},10,16384,100,NVIDIA-Tesla T4,1,True,2,hami-core:"
    )
    assert memories(hami(value)) == {UUID.format(0): 32768, UUID.format(2): 16384}


def test_hami_bad_values_are_named() -> None:
    bad_devmem = json.dumps([{"id": UUID.format(0), "devmem": "lots", "health": True}])
    assert hami(bad_devmem).problems == (
        f"annotation {HAMI_REGISTER_ANNOTATION}: device 0 ({UUID.format(0)}).devmem: "
        "not a whole number: 'lots'; VRAM not enforced",
    )
    bad_health = json.dumps([{"id": UUID.format(0), "devmem": 1, "health": "yes"}])
    assert "health: not true or false: 'yes'" in hami(bad_health).problems[0]
    assert "6 fields" in hami(f"{UUID.format(0)},10,1,100,T4,0:").problems[0]
    assert "not valid JSON" in hami("[{").problems[0]
    assert "appears twice" in hami(json.dumps([{"id": "a", "health": True}] * 2)).problems[0]
    assert "not an object" in hami("[null]").problems[0]


def test_problems_are_capped_for_one_warning() -> None:
    many = json.dumps([{"id": f"g{i}", "devmem": -1} for i in range(50)])
    problems = hami(many).problems
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[-1] == f"and {50 - MAX_PROBLEMS} more problems"


# -- GFD ------------------------------------------------------------------------------------


def gfd(**labels: str) -> GpuInventory:
    return gpu_inventory(node(labels={f"nvidia.com/{k}": v for k, v in labels.items()}))


def test_gfd_is_n_identical_devices() -> None:
    inventory = gfd(**{"gpu.count": "2", "gpu.memory": "81920", "gpu.product": "H100"})
    assert inventory.devices == (
        GpuDevice("gfd-0", 81920, model="H100"),
        GpuDevice("gfd-1", 81920, model="H100"),
    )


def test_gfd_time_slicing_replicas_do_not_multiply_memory() -> None:
    labels = {"gpu.count": "2", "gpu.memory": "16384", "gpu.replicas": "4"}
    inventory = gfd(**labels, **{"gpu.sharing-strategy": "time-slicing"})
    assert memories(inventory) == {"gfd-0": 16384, "gfd-1": 16384}


def test_gfd_mig_single_devices_are_the_mig_devices() -> None:
    inventory = gfd(
        **{
            "mig.strategy": "single",
            "gpu.count": "14",
            "gpu.memory": "9856",
            "gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        }
    )
    assert inventory.devices is not None
    assert len(inventory.devices) == 14
    assert {(d.kind, d.memory_mb) for d in inventory.devices} == {(DeviceKind.MIG, 9856)}
    invalid = gfd(
        **{
            "mig.strategy": "single",
            "gpu.count": "0",
            "gpu.memory": "0",
            "gpu.product": "NVIDIA-H100-MIG-INVALID",
        }
    )
    assert "invalid MIG single setup" in invalid.problems[0]


def test_gfd_mig_mixed_does_not_count_the_parent_gpus_twice() -> None:
    inventory = gfd(
        **{
            "mig.strategy": "mixed",
            "gpu.count": "2",
            "gpu.memory": "81920",
            "gpu.replicas": "0",
            "mig-1g.10gb.count": "7",
            "mig-1g.10gb.memory": "9856",
            "mig-3g.40gb.count": "2",
            "mig-3g.40gb.memory": "40192",
        }
    )
    assert inventory.devices is not None
    assert {d.kind for d in inventory.devices} == {DeviceKind.MIG}
    assert inventory.total_mb == 7 * 9856 + 2 * 40192  # not + 2 × 81920
    assert "gfd-1g.10gb-6" in memories(inventory)


def test_gfd_mig_mixed_that_cannot_be_told_apart_is_a_problem_not_a_guess() -> None:
    inventory = gfd(
        **{
            "mig.strategy": "mixed",
            "gpu.count": "8",
            "gpu.memory": "81920",
            "gpu.replicas": "1",
            "mig-1g.10gb.count": "7",
            "mig-1g.10gb.memory": "9856",
        }
    )
    assert inventory.devices is None
    assert "does not say how many" in inventory.problems[0]
    no_profiles = gfd(**{"mig.strategy": "mixed", "gpu.count": "8", "gpu.memory": "81920"})
    assert len(memories(no_profiles)) == 8


def test_gfd_bad_values_are_named() -> None:
    assert gfd(**{"gpu.count": "many", "gpu.memory": "81920"}).problems == (
        "label nvidia.com/gpu.count: not a whole number: 'many'; VRAM not enforced",
    )
    assert "is outside 0 .. 1024" in gfd(**{"gpu.count": "5000", "gpu.memory": "1"}).problems[0]
    missing = gfd(**{"mig.strategy": "mixed", "gpu.replicas": "0", "mig-1g.10gb.count": "7"})
    assert "mig-1g.10gb.memory: missing" in missing.problems[0]
    assert (
        "not none, single or mixed" in gfd(**{"mig.strategy": "all", "gpu.memory": "1"}).problems[0]
    )


# -- properties -----------------------------------------------------------------------------

JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=30)
    | st.sampled_from(["80Gi", "4864Mi", "1e400", "-1", "gpu", "mig", NVIDIA, "gpu-1"])
    | st.just("NoSchedule"),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(
        st.sampled_from(
            ["spec", "metadata", "name", "driver", "nodeName", "pool", "generation",
             "resourceSliceCount", "devices", "attributes", "capacity", "memory", "value",
             "string", "type", "uuid", "parentUUID", "taints", "effect", "consumesCounters"]
        )
        | st.text(max_size=10),
        children,
        max_size=6,
    ),
    max_leaves=40,
)  # fmt: skip


def assert_well_formed(inventory: GpuInventory) -> None:
    if inventory.source is None:
        assert inventory == GpuInventory(None)
        return
    assert (inventory.devices is None) == bool(inventory.problems or inventory.pending)
    assert len(inventory.problems) <= MAX_PROBLEMS + 1
    if inventory.devices is not None:
        ids = [device.id for device in inventory.devices]
        assert ids == sorted(set(ids))
        assert len(ids) <= MAX_GPUS
        assert all(0 <= device.memory_mb <= MAX_MB for device in inventory.devices)


@settings(max_examples=300)
@given(node_json=JSONISH, slices=JSONISH)
def test_the_parsers_never_raise_on_arbitrary_json(node_json: Any, slices: Any) -> None:
    assert_well_formed(gpu_inventory(node_json, slices))


def _replace(value: Any, path: list[int], new: Any) -> Any:
    """``value`` with the part that ``path`` picks (by index among keys or items) replaced."""
    if not path or not isinstance(value, dict | list) or not value:
        return new
    if isinstance(value, dict):
        key = list(value)[path[0] % len(value)]
        return {**value, key: _replace(value[key], path[1:], new)}
    index = path[0] % len(value)
    return [*value[:index], _replace(value[index], path[1:], new), *value[index + 1 :]]


VALID_SLICES = [
    rslice([gpu(0), gpu(1), *(mig(i, parent=1) for i in range(3))], pool="a", name="a"),
    rslice([gpu(2)], pool="b", count=2, name="b1"),
    rslice([gpu(3)], pool="b", count=2, name="b2"),
]
VALID_LABELS = {
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/gpu.count": "2",
    "nvidia.com/gpu.memory": "81920",
    "nvidia.com/gpu.replicas": "0",
    "nvidia.com/mig-1g.10gb.count": "7",
    "nvidia.com/mig-1g.10gb.memory": "9856",
}
VALID_HAMI = json.dumps([{"id": UUID.format(i), "devmem": 81920, "health": True} for i in range(2)])
PATHS = st.lists(st.integers(0, 20), max_size=8)


@settings(max_examples=300)
@given(path=PATHS, new=JSONISH)
def test_valid_slices_with_any_part_replaced_never_raise(path: list[int], new: Any) -> None:
    assert_well_formed(gpu_inventory(node(), _replace(VALID_SLICES, path, new)))


@settings(max_examples=200)
@given(path=PATHS, new=JSONISH | st.text(max_size=40))
def test_valid_labels_and_annotations_with_any_part_replaced_never_raise(
    path: list[int], new: Any
) -> None:
    assert_well_formed(gpu_inventory(node(labels=_replace(VALID_LABELS, path, new))))
    hami_json = _replace(json.loads(VALID_HAMI), path, new)
    assert_well_formed(hami(json.dumps(hami_json)))


@given(text=st.text(alphabet='GPU-0123456789abcdef,:truefals TNVID[]{}"', max_size=200))
def test_hami_text_of_any_shape_never_raises(text: str) -> None:
    assert_well_formed(hami(text))


def test_deeply_nested_hami_json_is_a_problem_not_a_crash() -> None:
    assert "not valid JSON" in hami("[" * 100_000).problems[0]


def test_an_oversized_hami_annotation_is_refused_before_it_is_read() -> None:
    assert "characters, at most" in hami(" " * (256 * 1024 + 1)).problems[0]
