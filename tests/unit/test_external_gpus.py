"""GPUs held outside Headroom reduce the per-device ledger (issue 30, item 2).

A DRA ResourceClaim allocated on a device holds its ``consumedCapacity`` memory, or
the whole device; a bound device-plugin pod holds whole GPUs, taken as the emptiest
devices. A pod's own claims offset what it holds outside. New claims are admitted
only where their share fits after those holdings; admitted ones are never revoked.
Properties: what is offered never exceeds memory − outside − admitted; adding then
removing a holder restores every figure; the order of events does not matter.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from fractions import Fraction
from itertools import permutations
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from headroom.api.gpus import GpuDevice
from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.ledger import Entry, Ledger, Owner
from headroom.ledger.external import DraClaim
from headroom.objects.external import claim_holdings, device_plugin_gpus

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
GIB = 1024
DRIVER = "gpu.nvidia.com"
A, B = "GPU-aaaaaaaa-0000-1111-2222-333344445555", "GPU-bbbbbbbb-0000-1111-2222-333344445555"
REF_A, REF_B = f"{DRIVER}/n1/gpu-a", f"{DRIVER}/n1/gpu-b"
TWO_80 = (GpuDevice(A, 80 * GIB, ref=REF_A), GpuDevice(B, 80 * GIB, ref=REF_B))


def gpu_node(devices: tuple[GpuDevice, ...] = TWO_80, ratio: str = "1") -> Ledger:
    limits = Limits(system_reserve_mb=0, max_vram_overcommit_ratio=Fraction(ratio))
    ledger = Ledger(limits)
    ledger.set_node_capacity("n1", 512 * GIB, sum(d.memory_mb for d in devices))
    ledger.set_node_devices("n1", devices)
    return ledger


def claim(name: str, vram_mb: int, gpus: int = 1, *, pod: str | None = None) -> Entry:
    return Entry(
        f"ml/{name}", "n1", 1024, NOW, NOW, vram_mb=vram_mb, gpus=gpus, owner=Owner(pod=pod)
    )


def free(ledger: Ledger) -> dict[str, int | None]:
    devices = ledger.node_summary("n1", NOW).devices
    assert devices is not None
    return {room.device.id: room.free_mb for room in devices}


def figures(ledger: Ledger) -> list[tuple[str, int, int, bool, int | None]]:
    devices = ledger.node_summary("n1", NOW).devices or ()
    return [(r.device.id, r.held_mb, r.external_mb, r.whole, r.free_mb) for r in devices]


# -- DRA ResourceClaims ------------------------------------------------------------------


def test_a_claim_allocated_whole_leaves_nothing_free_and_a_claim_goes_to_the_other_gpu() -> None:
    ledger = gpu_node()
    moved = ledger.set_resource_claim(("ml", "trainer"), DraClaim({REF_A: None}))
    assert moved == {"n1"}
    assert free(ledger) == {A: 0, B: 80 * GIB}
    decision = ledger.reserve(claim("c", 10 * GIB), NOW)
    assert decision.admitted
    assert decision.entry.devices == {B: 10 * GIB}


def test_consumed_capacity_takes_its_memory_only() -> None:
    ledger = gpu_node((TWO_80[0],))
    ledger.set_resource_claim(("ml", "share"), DraClaim({REF_A: 30 * GIB}))
    assert free(ledger) == {A: 50 * GIB}
    refused = ledger.reserve(claim("big", 51 * GIB), NOW)
    assert refused.reason is Reason.INSUFFICIENT_VRAM
    assert "30720 held outside Headroom" in refused.message
    assert ledger.reserve(claim("fits", 50 * GIB), NOW).admitted


def test_deallocating_wakes_a_waiting_reservation() -> None:
    ledger = gpu_node((TWO_80[0],))
    ledger.set_resource_claim(("ml", "trainer"), DraClaim({REF_A: None}))
    waiting = ledger.reserve_or_wait(claim("patient", 40 * GIB), NOW, NOW + timedelta(hours=1))
    assert not waiting.admitted
    assert waiting.position == 1
    assert ledger.admit_waiting(NOW, ["n1"]) == []
    assert ledger.set_resource_claim(("ml", "trainer"), None) == {"n1"}
    [admitted] = ledger.admit_waiting(NOW, ["n1"])
    assert admitted.entry.id == "ml/patient"
    assert admitted.entry.devices == {A: 40 * GIB}


def test_an_admitted_claim_is_never_revoked_the_device_just_shows_nothing_free() -> None:
    ledger = gpu_node((TWO_80[0],))
    assert ledger.reserve(claim("first", 60 * GIB), NOW).admitted
    ledger.set_resource_claim(("ml", "late"), DraClaim({REF_A: 40 * GIB}))
    assert ledger.get("ml/first") is not None
    assert free(ledger) == {A: 0}  # 80 − 60 − 40 < 0: shown as 0
    assert ledger.node_summary("n1", NOW).over_committed
    assert not ledger.reserve(claim("more", 1), NOW).admitted


def test_a_claim_reserved_for_a_pod_counts_only_beyond_that_pods_share() -> None:
    ledger = gpu_node((TWO_80[0],))
    assert ledger.reserve(claim("mine", 30 * GIB, pod="worker"), NOW).admitted
    ledger.set_resource_claim(
        ("ml", "worker-gpu"), DraClaim({REF_A: 50 * GIB}, frozenset({("ml", "worker")}))
    )
    room = figures(ledger)[0]
    assert room[1:3] == (30 * GIB, 20 * GIB)  # 50 consumed, 30 of it the pod's own claim
    assert free(ledger) == {A: 30 * GIB}
    # Another namespace's pod of the same name offsets nothing.
    ledger.set_resource_claim(
        ("ml", "worker-gpu"), DraClaim({REF_A: 50 * GIB}, frozenset({("other", "worker")}))
    )
    assert free(ledger) == {A: 0}


def test_a_claim_on_a_device_seen_later_counts_once_its_slices_are_read() -> None:
    ledger = Ledger(Limits(system_reserve_mb=0))
    assert ledger.set_resource_claim(("ml", "early"), DraClaim({REF_B: None})) == set()
    ledger.set_node_capacity("n1", 512 * GIB, 160 * GIB)
    ledger.set_node_devices("n1", TWO_80)
    assert free(ledger) == {A: 80 * GIB, B: 0}


def test_a_whole_device_has_nothing_free_even_under_an_overcommit_ratio() -> None:
    ledger = gpu_node(ratio="1.5")
    ledger.set_resource_claim(("ml", "trainer"), DraClaim({REF_A: None}))
    ledger.set_resource_claim(("ml", "share"), DraClaim({REF_B: 20 * GIB}))
    assert free(ledger) == {A: 0, B: 120 * GIB - 20 * GIB}


# -- device-plugin pods ------------------------------------------------------------------


def test_a_device_plugin_pod_takes_the_emptiest_device_and_gives_it_back_when_it_ends() -> None:
    ledger = gpu_node()
    assert ledger.reserve(claim("small", 10 * GIB), NOW).entry.devices == {A: 10 * GIB}
    assert ledger.set_device_plugin_pod(("ml", "cuda"), "n1", 1) == {"n1"}
    assert free(ledger) == {A: 70 * GIB, B: 0}
    summary = ledger.node_summary("n1", NOW)
    assert not summary.over_committed
    assert summary.device_plugin_gpus == 1
    assert [room.plugin for room in summary.devices or ()] == [False, True]
    assert ledger.set_device_plugin_pod(("ml", "cuda"), "n1", 1) == set()  # no change
    assert ledger.set_device_plugin_pod(("ml", "cuda"), None, 0) == {"n1"}
    assert free(ledger) == {A: 70 * GIB, B: 80 * GIB}


def test_more_device_plugin_gpus_than_devices_take_them_all() -> None:
    ledger = gpu_node()
    ledger.set_device_plugin_pod(("ml", "greedy"), "n1", 3)
    assert free(ledger) == {A: 0, B: 0}
    assert not ledger.reserve(claim("none", 1), NOW).admitted


def test_a_device_plugin_pod_counts_only_beyond_the_devices_its_own_claims_hold() -> None:
    ledger = gpu_node()
    assert ledger.reserve(claim("own", 20 * GIB, pod="cuda"), NOW).entry.devices == {A: 20 * GIB}
    ledger.set_device_plugin_pod(("ml", "cuda"), "n1", 2)
    assert ledger.node_summary("n1", NOW).device_plugin_gpus == 1
    assert free(ledger) == {A: 60 * GIB, B: 0}
    ledger.release("ml/own")  # its claim gone, both GPUs count
    assert free(ledger) == {A: 0, B: 0}


# -- properties ------------------------------------------------------------------------------

DEVICES = st.lists(st.integers(1, 96), min_size=1, max_size=4).map(
    lambda sizes: tuple(
        GpuDevice(f"GPU-{i}", size * GIB, ref=f"{DRIVER}/n1/d{i}") for i, size in enumerate(sizes)
    )
)
# An event: a claim on device i (None: the whole device, else MiB), or a pod with k GPUs.
EVENT = st.one_of(
    st.tuples(
        st.just("claim"), st.integers(0, 3), st.integers(0, 3), st.none() | st.integers(1, 96 * GIB)
    ),
    st.tuples(st.just("pod"), st.integers(0, 3), st.integers(1, 3), st.none()),
)


def apply(ledger: Ledger, devices: tuple[GpuDevice, ...], event: tuple[Any, ...]) -> None:
    kind, number, which, amount = event
    if kind == "claim":
        ref = devices[which % len(devices)].ref
        ledger.set_resource_claim(("ml", f"claim-{number}"), DraClaim({ref: amount}))
    else:
        ledger.set_device_plugin_pod(("ml", f"pod-{number}"), "n1", which)


def admitted(ledger: Ledger, sizes: list[int]) -> None:
    for number, size in enumerate(sizes):
        ledger.reserve(claim(f"c{number}", size * GIB), NOW)


@given(DEVICES, st.lists(EVENT, max_size=8), st.lists(st.integers(1, 64), max_size=6))
def test_what_is_offered_never_exceeds_memory_minus_outside_minus_admitted(
    devices: tuple[GpuDevice, ...], events: list[tuple[Any, ...]], sizes: list[int]
) -> None:
    ledger = gpu_node(devices)
    for event in events:
        apply(ledger, devices, event)
    admitted(ledger, sizes)  # decided after the holders appeared
    summary = ledger.node_summary("n1", NOW)
    memory = {d.id: d.memory_mb for d in devices}
    pods = {f"pod-{n}": k for kind, n, k, _ in events if kind == "pod"}
    plugin_held = [room for room in summary.devices or () if room.plugin]
    assert len(plugin_held) == min(len(devices), sum(pods.values()))
    assert not summary.over_committed  # every claim was decided after the holders
    for room in summary.devices or ():
        assert room.free_mb is not None
        assert room.free_mb <= max(0, memory[room.device.id] - room.external_mb - room.held_mb)
        if room.whole:
            assert room.free_mb == 0
            # Nothing decided after the holder appeared went onto a device held whole.
            assert room.held_mb == 0


@given(DEVICES, st.lists(EVENT, max_size=6), st.lists(st.integers(1, 64), max_size=4), EVENT)
def test_adding_then_removing_a_holder_restores_every_figure(
    devices: tuple[GpuDevice, ...],
    events: list[tuple[Any, ...]],
    sizes: list[int],
    extra: tuple[Any, ...],
) -> None:
    ledger = gpu_node(devices)
    for event in events:
        apply(ledger, devices, event)
    admitted(ledger, sizes)
    before = figures(ledger)
    kind = extra[0]
    if kind == "claim":
        ref = devices[extra[2] % len(devices)].ref
        ledger.set_resource_claim(("ml", "extra"), DraClaim({ref: extra[3]}))
        ledger.set_resource_claim(("ml", "extra"), None)
    else:
        ledger.set_device_plugin_pod(("ml", "extra"), "n1", extra[2])
        ledger.set_device_plugin_pod(("ml", "extra"), None, 0)
    assert figures(ledger) == before


@given(DEVICES, st.lists(EVENT, min_size=1, max_size=4, unique_by=lambda e: (e[0], e[1])))
def test_the_order_of_events_does_not_matter(
    devices: tuple[GpuDevice, ...], events: list[tuple[Any, ...]]
) -> None:
    seen = set()
    for order in permutations(events):
        ledger = gpu_node(devices)
        for event in order:
            apply(ledger, devices, event)
        seen.add(tuple(figures(ledger)))
    assert len(seen) == 1


# -- reading the objects ---------------------------------------------------------------------


def resource_claim(*results: dict[str, Any], reserved_for: list[Any] | None = None) -> Any:
    status: dict[str, Any] = {"allocation": {"devices": {"results": list(results)}}}
    if reserved_for is not None:
        status["reservedFor"] = reserved_for
    return {"metadata": {"namespace": "ml", "name": "c"}, "status": status}


def result(device: str, **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": device, **extra}


def test_a_claims_allocation_is_read_per_device() -> None:
    read = claim_holdings(
        resource_claim(
            result("gpu-a"),
            result("gpu-b", consumedCapacity={"memory": "20Gi"}, shareID="x"),
            result("gpu-b", consumedCapacity={f"{DRIVER}/memory": "1.5Gi"}, shareID="y"),
            result("gpu-c", consumedCapacity={"cores": "10"}),  # no memory: the whole device
            result("gpu-d", adminAccess=True),  # monitoring: holds nothing
            {**result("gpu-e"), "driver": "other.example.com"},  # not a configured driver
            reserved_for=[
                {"resource": "pods", "name": "worker", "uid": "1"},
                {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "2"},
            ],
        ),
        [DRIVER],
    )
    assert read == DraClaim(
        {REF_A: None, REF_B: 20 * GIB + 1536, f"{DRIVER}/n1/gpu-c": None},
        frozenset({("ml", "worker")}),
    )


def test_an_unallocated_or_unreadable_claim_holds_nothing() -> None:
    for claim_object in (
        {"metadata": {"namespace": "ml", "name": "c"}, "status": {}},
        {"metadata": {"namespace": "ml", "name": "c"}},
        resource_claim(),
        resource_claim("not a result", {"driver": DRIVER}),
        None,
        [],
    ):
        assert claim_holdings(claim_object, [DRIVER]) is None
    bad = resource_claim(result("gpu-a", consumedCapacity={"memory": "lots"}))
    assert claim_holdings(bad, [DRIVER]) == DraClaim({REF_A: None})  # the whole device


def container(gpus: str | None, kind: str = "limits", **extra: Any) -> dict[str, Any]:
    resources = {} if gpus is None else {kind: {"nvidia.com/gpu": gpus, "memory": "1Gi"}}
    return {"name": "c", "resources": resources, **extra}


def test_a_pods_device_plugin_gpus_are_booked_as_the_scheduler_books_them() -> None:
    names = ["nvidia.com/gpu"]
    pod = {"spec": {"containers": [container("2"), container("1"), container(None)]}}
    assert device_plugin_gpus(pod, names) == 3
    pod["spec"]["initContainers"] = [container("4")]  # the init runs alone: the larger
    assert device_plugin_gpus(pod, names) == 4
    pod["spec"]["initContainers"] = [container("1", restartPolicy="Always")]  # a sidecar adds
    assert device_plugin_gpus(pod, names) == 4
    assert device_plugin_gpus(pod, []) == 0
    assert device_plugin_gpus({"spec": {"containers": [container("x")]}}, names) == 0
    assert device_plugin_gpus({"spec": {"containers": [container("2", "requests")]}}, names) == 2
    assert device_plugin_gpus("pod", names) == 0


@given(
    DEVICES, st.lists(st.tuples(st.booleans(), st.integers(1, 32)), max_size=8), st.integers(1, 4)
)
def test_a_pods_own_claims_offset_its_gpus_through_any_admissions_and_releases(
    devices: tuple[GpuDevice, ...], steps: list[tuple[bool, int]], gpus: int
) -> None:
    ledger = gpu_node(devices)
    ledger.set_device_plugin_pod(("ml", "cuda"), "n1", gpus)
    for number, (release, size) in enumerate(steps):
        ledger.reserve(claim(f"own{number}", size * GIB, pod="cuda"), NOW)
        if release and ledger.get(f"ml/own{number - 1}") is not None:
            ledger.release(f"ml/own{number - 1}")
    mine = set()
    for entry in ledger.entries():
        mine.update(device for device, mib in entry.devices.items() if mib)
    assert ledger.node_summary("n1", NOW).device_plugin_gpus == max(0, gpus - len(mine))


def test_a_running_pod_recorded_past_the_room_is_put_on_the_device_least_held_outside() -> None:
    """A pod that already runs is recorded whatever the room; its device is a guess,
    and the guess counts what is held outside as what admitted claims hold."""
    ledger = gpu_node()
    ledger.set_resource_claim(("ml", "trainer"), DraClaim({REF_A: 75 * GIB}))
    ledger.set_resource_claim(("ml", "other"), DraClaim({REF_B: 70 * GIB}))
    decision = ledger.record(claim("running", 60 * GIB, pod="runner"), NOW)
    assert decision.admitted
    assert decision.reason is Reason.OVER_COMMITTED
    assert decision.entry.devices == {B: 60 * GIB}  # 75 GiB held outside on A, 70 on B


def test_a_claim_on_a_dynamic_mig_partition_holds_its_parent_gpu_whole() -> None:
    """A GPU in MIG mode runs nothing outside its MIG instances: once one of its
    partitions is allocated, nothing of the GPU is free for a claim on it."""
    partition = f"{DRIVER}/n1/gpu-a-mig-1g.10gb-0"
    ledger = gpu_node((GpuDevice(A, 80 * GIB, ref=REF_A, held_whole_by=(partition,)), TWO_80[1]))
    moved = ledger.set_resource_claim(("ml", "mig"), DraClaim({partition: 10 * GIB}))
    assert moved == {"n1"}
    assert free(ledger) == {A: 0, B: 80 * GIB}
    assert ledger.reserve(claim("c", 10 * GIB), NOW).entry.devices == {B: 10 * GIB}
    ledger.set_resource_claim(("ml", "mig"), None)
    assert free(ledger) == {A: 80 * GIB, B: 70 * GIB}


def test_a_claim_on_no_device_counts_what_is_held_outside_in_the_node_sum() -> None:
    """``gpus: 0`` asks for no device, only the node's sum: what is held outside comes
    off that sum too (a device held whole: all of it)."""
    ledger = gpu_node()
    ledger.set_device_plugin_pod(("ml", "cuda"), "n1", 1)  # one 80 GiB GPU, whole
    ledger.set_resource_claim(("ml", "share"), DraClaim({REF_B: 30 * GIB}))
    assert ledger.node_summary("n1", NOW).limit_vram_mb == 50 * GIB
    refused = ledger.reserve(claim("sum", 51 * GIB, gpus=0), NOW)
    assert refused.reason is Reason.INSUFFICIENT_VRAM
    assert "− 112640 held outside Headroom" in refused.message  # 80 + 30 GiB
    assert ledger.reserve(claim("fits", 50 * GIB, gpus=0), NOW).admitted


def test_a_pods_own_claim_offsets_its_holdings_outside_once_not_once_per_holder() -> None:
    ledger = gpu_node()
    assert ledger.reserve(claim("mine", 30 * GIB, pod="w"), NOW).entry.devices == {A: 30 * GIB}
    for name in ("one", "two"):
        ledger.set_resource_claim(
            ("ml", name), DraClaim({REF_A: 30 * GIB}, frozenset({("ml", "w")}))
        )
    assert figures(ledger)[0][1:3] == (30 * GIB, 30 * GIB)  # 60 consumed, 30 its own claim
    assert free(ledger)[A] == 20 * GIB
    # Spent on the DRA claims, the same claim does not also offset a device-plugin GPU.
    ledger.set_resource_claim(("ml", "two"), None)
    ledger.set_resource_claim(("ml", "one"), DraClaim({REF_A: 30 * GIB}, frozenset({("ml", "w")})))
    ledger.set_device_plugin_pod(("ml", "w"), "n1", 1)
    assert ledger.node_summary("n1", NOW).device_plugin_gpus == 1
    assert free(ledger) == {A: 50 * GIB, B: 0}


def test_what_is_held_outside_a_device_is_never_more_than_the_device() -> None:
    ledger = gpu_node((TWO_80[0],))
    ledger.set_resource_claim(("ml", "huge"), DraClaim({REF_A: 1 << 40}))  # 1 PiB "consumed"
    ledger.set_resource_claim(("ml", "more"), DraClaim({REF_A: 50 * GIB}))
    assert figures(ledger)[0][2] == 80 * GIB
    assert free(ledger) == {A: 0}


def test_a_claim_on_a_static_mig_devices_parent_holds_each_of_its_mig_devices() -> None:
    parent = f"{DRIVER}/n1/gpu-a"
    migs = tuple(
        GpuDevice(f"MIG-{i}", 10 * GIB, ref=f"{DRIVER}/n1/mig-{i}", held_whole_by=(parent,))
        for i in range(2)
    )
    ledger = gpu_node(migs)
    ledger.set_resource_claim(("ml", "whole-gpu"), DraClaim({parent: None}))
    assert free(ledger) == {"MIG-0": 0, "MIG-1": 0}
    ledger.set_resource_claim(("ml", "whole-gpu"), None)
    assert free(ledger) == {"MIG-0": 10 * GIB, "MIG-1": 10 * GIB}
