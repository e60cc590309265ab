"""The ledger admits VRAM per device on a node with a GPU inventory (issue 20).

``test_devices.py`` proves the arithmetic of one choice; this proves the ledger
around it: a decision records its assignment on the entry, a release gives it
back, a waiter is admitted when some device set fits, ``gpus: 0`` keeps the
node's sum, a restore holds exactly what was recorded (and reports devices that
shrank under it), and over any sequence of reserves and releases no device is
held above its limit and the holdings equal what the admitted entries record.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.api.gpus import GpuDevice, GpuPolicy
from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.ledger import Entry, Ledger
from headroom.ledger.devices import device_limit_mb

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
GIB = 1024
A = "GPU-aabbccdd-0000-1111-2222-333344445555"
B = "GPU-bbccddee-0000-1111-2222-333344445555"
TWO_80 = (GpuDevice(A, 80 * GIB), GpuDevice(B, 80 * GIB))


def gpu_node(
    devices: tuple[GpuDevice, ...] = TWO_80, limits: Limits | None = None, name: str = "gpu-1"
) -> Ledger:
    ledger = Ledger(limits or Limits(system_reserve_mb=0))
    ledger.set_node_capacity(name, 512 * GIB, sum(d.memory_mb for d in devices), limits)
    ledger.set_node_devices(name, devices)
    return ledger


def claim(name: str, vram_mb: int, gpus: int = 1, *, at: int = 0, node: str = "gpu-1") -> Entry:
    created = NOW + timedelta(seconds=at)
    return Entry(f"ml/{name}", node, 1024, created, created, vram_mb=vram_mb, gpus=gpus)


def test_three_50_gib_claims_on_two_80_gib_gpus_the_third_is_refused_with_the_numbers() -> None:
    ledger = gpu_node()
    first = ledger.reserve(claim("a", 50 * GIB), NOW)
    second = ledger.reserve(claim("b", 50 * GIB), NOW)
    third = ledger.reserve(claim("c", 50 * GIB), NOW)
    assert (first.admitted, second.admitted, third.admitted) == (True, True, False)
    assert first.entry.devices == {A: 50 * GIB}
    assert second.entry.devices == {B: 50 * GIB}
    assert "on GPU-aabbccdd… (51200 MiB)" in first.message
    assert third.reason is Reason.INSUFFICIENT_VRAM
    assert third.message == (
        "node gpu-1: needs 1 device with 51200 MiB free; largest free 30720 MiB "
        "(GPU-aabbccdd… 80 GiB, 51200 held)"
    )
    assert third.entry.devices == {}  # a refusal changes nothing
    assert ledger.node_summary("gpu-1", NOW).reserved_vram_mb == 100 * GIB


def test_a_claim_over_two_devices_holds_its_share_on_each_and_gives_it_back() -> None:
    ledger = gpu_node()
    wide = ledger.reserve(claim("wide", 100 * GIB, gpus=2), NOW)
    assert wide.entry.devices == {A: 50 * GIB, B: 50 * GIB}
    assert not ledger.reserve(claim("big", 40 * GIB), NOW).admitted  # 30 GiB left on each
    ledger.release("ml/wide")
    summary = ledger.node_summary("gpu-1", NOW)
    assert summary.devices is not None
    assert [room.held_mb for room in summary.devices] == [0, 0]
    assert summary.largest_free_device_mb == 80 * GIB
    assert ledger.reserve(claim("big", 40 * GIB), NOW).admitted


def test_gpus_zero_keeps_the_node_sum_and_no_assignment() -> None:
    ledger = gpu_node()
    whole = ledger.reserve(claim("whole", 150 * GIB, gpus=0), NOW)
    assert whole.admitted
    assert whole.entry.devices == {}
    over = ledger.reserve(claim("more", 20 * GIB, gpus=0), NOW)
    assert over.reason is Reason.INSUFFICIENT_VRAM
    assert "allocatable 10240 MiB (VRAM 163840" in over.message


def test_a_node_without_an_inventory_sums_as_before() -> None:
    ledger = Ledger(Limits(system_reserve_mb=0))
    ledger.set_node_capacity("plain", 512 * GIB, 160 * GIB)
    for name in ("a", "b", "c"):
        decision = ledger.reserve(claim(name, 50 * GIB, node="plain"), NOW)
        assert decision.admitted  # 150 GiB under the 160 GiB sum: today's answer
        assert decision.entry.devices == {}


def test_a_waiter_is_admitted_when_some_device_set_fits() -> None:
    ledger = gpu_node()
    ledger.reserve(claim("a", 50 * GIB), NOW)
    ledger.reserve(claim("b", 50 * GIB), NOW)
    waiting = ledger.reserve_or_wait(claim("c", 50 * GIB, at=1), NOW, NOW + timedelta(hours=1))
    assert waiting.queued
    assert ledger.admit_waiting(NOW, ["gpu-1"]) == []
    ledger.release("ml/b")
    [admitted] = ledger.admit_waiting(NOW, ["gpu-1"])
    assert admitted.entry.devices == {B: 50 * GIB}


def test_spread_and_the_vram_ratio_apply_per_device() -> None:
    limits = Limits(
        system_reserve_mb=0, gpu_policy=GpuPolicy.SPREAD, max_vram_overcommit_ratio=Fraction(3, 2)
    )
    ledger = gpu_node(limits=limits)
    first = ledger.reserve(claim("a", 10 * GIB), NOW)
    second = ledger.reserve(claim("b", 10 * GIB), NOW)
    assert [first.entry.devices, second.entry.devices] == [{A: 10 * GIB}, {B: 10 * GIB}]
    assert ledger.reserve(claim("c", 110 * GIB), NOW).admitted  # 120 × 1.5 = 180 GiB − 10 held


def test_a_restore_holds_the_recorded_devices_and_reports_a_shrunk_one() -> None:
    ledger = gpu_node()
    kept = [ledger.reserve(claim(n, 50 * GIB), NOW).entry for n in ("a", "b")]
    shrunk = (GpuDevice(A, 40 * GIB), GpuDevice(B, 80 * GIB))
    rebuilt = Ledger(Limits(system_reserve_mb=0))
    rebuilt.set_node_capacity("gpu-1", 512 * GIB, 120 * GIB)
    rebuilt.set_node_devices("gpu-1", shrunk)
    restored = [claim(e.id.split("/")[1], e.vram_mb) for e in kept]
    for entry, original in zip(restored, kept, strict=True):
        entry.devices = dict(original.devices)
    result = rebuilt.restore(restored)
    assert [e.id for e in result.over_committed] == ["ml/a"]  # 50 GiB on a 40 GiB device
    [over] = rebuilt.over_committed_devices("gpu-1")
    assert (over.device_id, over.held_mb, over.limit_mb) == (A, 50 * GIB, 40 * GIB)
    assert rebuilt.node_summary("gpu-1", NOW).over_committed
    assert not rebuilt.reserve(claim("c", 40 * GIB), NOW).admitted  # A is full, B has 30 GiB
    rebuilt.release("ml/a")
    assert rebuilt.over_committed_devices("gpu-1") == []


def test_claims_admitted_before_the_node_had_devices_are_placed_when_they_appear() -> None:
    ledger = Ledger(Limits(system_reserve_mb=0))
    ledger.set_node_capacity("gpu-1", 512 * GIB, None)  # VRAM unknown: not enforced
    for name in ("a", "b", "c"):
        assert ledger.reserve(claim(name, 50 * GIB), NOW).admitted
    ledger.set_node_devices("gpu-1", TWO_80)
    held = sorted(sum(e.devices.values()) for e in ledger.entries())
    assert held == [50 * GIB] * 3  # each on one device, the third over a limit
    assert [o.device_id for o in ledger.over_committed_devices("gpu-1")] == [A]


def test_a_pod_already_running_is_recorded_on_devices_even_when_none_fits() -> None:
    ledger = gpu_node()
    ledger.reserve(claim("a", 70 * GIB), NOW)
    ledger.reserve(claim("b", 70 * GIB), NOW)
    running = ledger.record(claim("running", 30 * GIB), NOW)
    assert (running.admitted, running.reason) == (True, Reason.OVER_COMMITTED)
    assert sum(running.entry.devices.values()) == 30 * GIB
    assert len(ledger.over_committed_devices("gpu-1")) == 1


devices_strategy = st.lists(
    st.integers(min_value=1, max_value=100 * GIB), min_size=1, max_size=6
).map(lambda sizes: tuple(GpuDevice(f"GPU-{i}", mib) for i, mib in enumerate(sizes)))
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("reserve"),
            st.integers(min_value=1, max_value=120 * GIB),
            st.integers(min_value=0, max_value=4),
        ),
        st.tuples(st.just("release"), st.integers(min_value=0, max_value=30), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(
    devices=devices_strategy,
    ops=steps,
    ratio=st.sampled_from([Fraction(1), Fraction(3, 2), Fraction(1, 2)]),
    policy=st.sampled_from(list(GpuPolicy)),
)
def test_no_device_is_ever_over_its_limit_and_a_rebuild_holds_the_same(
    devices: tuple[GpuDevice, ...],
    ops: list[tuple[str, int, int]],
    ratio: Fraction,
    policy: GpuPolicy,
) -> None:
    limits = Limits(system_reserve_mb=0, max_vram_overcommit_ratio=ratio, gpu_policy=policy)
    ledger = gpu_node(devices, limits)
    made = 0
    for op, size, gpus in ops:
        if op == "reserve":
            entry = claim(f"c{made}", size, gpus, at=made)
            made += 1
            ledger.reserve(entry, NOW)
        else:
            held = sorted(e.id for e in ledger.entries())
            if held:
                ledger.release(held[size % len(held)])
        summary = ledger.node_summary("gpu-1", NOW)
        assert summary.devices is not None
        for room in summary.devices:
            limit = device_limit_mb(room.device.memory_mb, ratio)
            assert limit is None or room.held_mb <= limit
        recorded: dict[str, int] = {}
        for entry in ledger.entries():
            assert len(entry.devices) == (entry.gpus if entry.gpus else 0)
            for device, mib in entry.devices.items():
                recorded[device] = recorded.get(device, 0) + mib
        assert {r.device.id: r.held_mb for r in summary.devices if r.held_mb} == recorded
    rebuilt = gpu_node(devices, limits)
    again = []
    for entry in ledger.entries():
        copy = claim(entry.id.split("/")[1], entry.vram_mb, entry.gpus, at=0)
        copy.devices = dict(entry.devices)
        again.append(copy)
    assert rebuilt.restore(again).over_committed == []
    before = ledger.node_summary("gpu-1", NOW).devices
    assert rebuilt.node_summary("gpu-1", NOW).devices == before


def test_a_claim_is_refused_only_for_what_it_asks() -> None:
    ledger = gpu_node()
    ledger.reserve(claim("a", 70 * GIB), NOW)
    ledger.reserve(claim("b", 70 * GIB), NOW)
    ledger.set_node_capacity("gpu-1", 512 * GIB, 80 * GIB)  # a GPU went away
    ledger.set_node_devices("gpu-1", TWO_80[:1])
    ram_only = Entry("ml/ram", "gpu-1", 1024, NOW, NOW)
    assert ledger.reserve(ram_only, NOW).admitted  # the node is short of VRAM, not of RAM
    assert not ledger.reserve(claim("c", 1024), NOW).admitted
    small = Ledger(Limits(system_reserve_mb=0))
    small.set_node_capacity("gpu-2", 1024, 160 * GIB)
    small.set_node_devices("gpu-2", TWO_80)
    small.reserve(Entry("ml/big", "gpu-2", 1024, NOW, NOW), NOW)
    small.set_node_capacity("gpu-2", 512, 160 * GIB)  # RAM shrank under it
    vram_only = Entry("ml/v", "gpu-2", 0, NOW, NOW, vram_mb=GIB)
    assert small.reserve(vram_only, NOW).admitted
