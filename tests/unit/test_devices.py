"""Per-device VRAM arithmetic (issue 20): a claim fits on devices, not on a node's sum.

Named cases from the issue, then properties over any sequence of claims and
releases: no device is ever held above ``floor(memory × ratio)``; binpack takes
the fullest devices that fit and spread the emptiest; a refusal means no set of
devices fits; and holdings restored from the recorded assignments equal the
ones kept step by step.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.api.gpus import DeviceKind, GpuDevice, GpuPolicy
from headroom.ledger.devices import (
    DeviceRefusal,
    OverCommit,
    choose_devices,
    device_limit_mb,
    hold,
    release,
    restore_holdings,
    rooms,
    share_mb,
)

GIB = 1024
UUID_A = "GPU-aabbccdd-0000-1111-2222-333344445555"
UUID_B = "GPU-bbccddee-0000-1111-2222-333344445555"
TWO_H100 = [GpuDevice(UUID_A, 80 * GIB), GpuDevice(UUID_B, 80 * GIB)]
ONE = Fraction(1)


def test_three_50_gib_claims_on_two_80_gib_gpus_the_third_is_refused() -> None:
    held: dict[str, int] = {}
    for expected in (UUID_A, UUID_B):
        chosen = choose_devices(TWO_H100, held, 50 * GIB, 1, ONE, GpuPolicy.BINPACK)
        assert chosen == {expected: 50 * GIB}
        assert isinstance(chosen, dict)
        hold(held, chosen)
    third = choose_devices(TWO_H100, held, 50 * GIB, 1, ONE, GpuPolicy.BINPACK)
    assert isinstance(third, DeviceRefusal)
    assert third.message("gpu-1") == (
        "node gpu-1: needs 1 device with 51200 MiB free; largest free 30720 MiB "
        "(GPU-aabbccdd… 80 GiB, 51200 held)"
    )
    # The node-wide sum would have said yes: 150 GiB < 160 GiB.
    assert sum(held.values()) + 50 * GIB <= sum(d.memory_mb for d in TWO_H100)


def test_binpack_fills_one_device_spread_uses_both() -> None:
    held: dict[str, int] = {}
    for _ in range(2):
        chosen = choose_devices(TWO_H100, held, 30 * GIB, 1, ONE, GpuPolicy.BINPACK)
        assert isinstance(chosen, dict)
        hold(held, chosen)
    assert held == {UUID_A: 60 * GIB}
    held = {}
    for _ in range(2):
        chosen = choose_devices(TWO_H100, held, 30 * GIB, 1, ONE, GpuPolicy.SPREAD)
        assert isinstance(chosen, dict)
        hold(held, chosen)
    assert held == {UUID_A: 30 * GIB, UUID_B: 30 * GIB}


def test_binpack_is_best_fit_by_free_mib_on_unequal_devices() -> None:
    devices = [GpuDevice("big", 80 * GIB), GpuDevice("small", 24 * GIB)]
    chosen = choose_devices(devices, {"big": 40 * GIB}, 20 * GIB, 1, ONE, GpuPolicy.BINPACK)
    assert chosen == {"small": 20 * GIB}  # 24 GiB free beats 40 GiB free
    chosen = choose_devices(devices, {"big": 40 * GIB}, 20 * GIB, 1, ONE, GpuPolicy.SPREAD)
    assert chosen == {"big": 20 * GIB}


def test_ties_go_to_the_smaller_id_whatever_the_order() -> None:
    devices = [GpuDevice(f"gfd-{i}", 16 * GIB) for i in (3, 1, 2, 0)]
    for policy in GpuPolicy:
        assert choose_devices(devices, {}, 2 * GIB, 2, ONE, policy) == {"gfd-0": GIB, "gfd-1": GIB}


def test_the_share_is_rounded_up_and_held_on_each_device() -> None:
    assert share_mb(10, 3) == 4
    assert share_mb(51200, 2) == 25600
    devices = [GpuDevice(f"d{i}", 100) for i in range(3)]
    assert choose_devices(devices, {}, 10, 3, ONE, GpuPolicy.SPREAD) == {"d0": 4, "d1": 4, "d2": 4}
    # Each device must have the rounded-up share free: 4 MiB, not 3.
    refused = choose_devices(devices, {"d2": 97}, 10, 3, ONE, GpuPolicy.SPREAD)
    assert isinstance(refused, DeviceRefusal)
    assert refused.message("n") == (
        "node n: needs 3 devices with 4 MiB free each; 2 of 3 have it; "
        "next largest free 3 MiB (d2 100 MiB, 97 held)"
    )


def test_the_overcommit_ratio_applies_per_device() -> None:
    device = [GpuDevice(UUID_A, 80 * GIB)]
    assert device_limit_mb(80 * GIB, Fraction(3, 2)) == 120 * GIB
    assert device_limit_mb(3, Fraction(1, 2)) == 1  # floor
    chosen = choose_devices(
        device, {UUID_A: 70 * GIB}, 50 * GIB, 1, Fraction(3, 2), GpuPolicy.BINPACK
    )
    assert chosen == {UUID_A: 50 * GIB}
    refused = choose_devices(
        device, {UUID_A: 71 * GIB}, 50 * GIB, 1, Fraction(3, 2), GpuPolicy.BINPACK
    )
    assert isinstance(refused, DeviceRefusal)
    assert "(GPU-aabbccdd… 80 GiB × 1.5, 72704 held)" in refused.message("n")


def test_ratio_zero_is_unlimited_but_still_needs_enough_devices() -> None:
    held = {UUID_A: 10**6}
    assert choose_devices(TWO_H100, held, 10**6, 1, Fraction(0), GpuPolicy.BINPACK) == {
        UUID_A: 10**6
    }
    assert choose_devices(TWO_H100, held, 10**6, 1, Fraction(0), GpuPolicy.SPREAD) == {
        UUID_B: 10**6
    }
    refused = choose_devices(TWO_H100, {}, 3, 3, Fraction(0), GpuPolicy.SPREAD)
    assert isinstance(refused, DeviceRefusal)
    assert refused.message("n") == (
        "node n: needs 3 devices with 1 MiB free each; 2 of 2 have it; it has 2 devices"
    )


def test_refusal_on_a_node_without_devices() -> None:
    refused = choose_devices([], {}, 4864, 1, ONE, GpuPolicy.BINPACK)
    assert isinstance(refused, DeviceRefusal)
    assert refused.message("cpu-1") == (
        "node cpu-1: needs 1 device with 4864 MiB free; it has no GPU devices"
    )


def test_mig_devices_are_devices_like_any_other() -> None:
    migs = [GpuDevice(f"MIG-{i}", 4864, DeviceKind.MIG, parent=UUID_A) for i in range(7)]
    chosen = choose_devices(migs, {}, 4864, 1, ONE, GpuPolicy.BINPACK)
    assert chosen == {"MIG-0": 4864}
    refused = choose_devices(migs, {}, 4865, 1, ONE, GpuPolicy.BINPACK)
    assert isinstance(refused, DeviceRefusal)
    assert "largest free 4864 MiB (MIG-0 4864 MiB, 0 held)" in refused.message("n")


def test_preconditions_are_checked() -> None:
    with pytest.raises(ValueError, match="gpus >= 1"):
        choose_devices(TWO_H100, {}, 10, 0, ONE, GpuPolicy.BINPACK)  # gpus 0: node-wide sum
    with pytest.raises(ValueError, match="vram_mb >= 1"):
        choose_devices(TWO_H100, {}, 0, 1, ONE, GpuPolicy.BINPACK)
    with pytest.raises(ValueError, match="negative"):
        device_limit_mb(10, Fraction(-1))


def test_release_takes_an_assignment_off_again() -> None:
    held: dict[str, int] = {}
    hold(held, {UUID_A: 5, UUID_B: 5})
    hold(held, {UUID_A: 7})
    release(held, {UUID_A: 5, UUID_B: 5})
    assert held == {UUID_A: 7}
    release(held, {UUID_A: 7})
    assert held == {}


def test_restore_reports_gone_and_shrunk_devices_without_raising() -> None:
    smaller = [GpuDevice(UUID_A, 40 * GIB)]  # UUID_B was removed, UUID_A shrank
    recorded = [{UUID_A: 30 * GIB}, {UUID_A: 20 * GIB, UUID_B: 20 * GIB}]
    restored = restore_holdings(smaller, recorded, ONE)
    assert restored.held == {UUID_A: 50 * GIB, UUID_B: 20 * GIB}
    assert restored.over == (
        OverCommit(UUID_A, 50 * GIB, 40 * GIB, 40 * GIB),
        OverCommit(UUID_B, 20 * GIB, None, None),
    )
    assert [over.message("gpu-1") for over in restored.over] == [
        "node gpu-1: device GPU-aabbccdd… holds 51200 MiB, above its limit of 40960 MiB (40 GiB)",
        "node gpu-1: device GPU-bbccddee… holds 20480 MiB of admitted claims but is no longer "
        "in the inventory",
    ]
    # Held MiB on a gone device never make room elsewhere, nor does choosing trip on them.
    chosen = choose_devices(smaller, restored.held, GIB, 1, ONE, GpuPolicy.BINPACK)
    assert isinstance(chosen, DeviceRefusal)


# -- properties -----------------------------------------------------------------------------

RATIOS = st.sampled_from([Fraction(1), Fraction(3, 2), Fraction(11, 10), Fraction(1, 2)])
DEVICES = st.lists(st.integers(0, 4_000), min_size=0, max_size=6).map(
    lambda sizes: [GpuDevice(f"d{i}", size) for i, size in enumerate(sizes)]
)
STEP = st.one_of(
    st.tuples(
        st.just("claim"),
        st.integers(1, 5_000),
        st.integers(1, 4),
        st.sampled_from(list(GpuPolicy)),
    ),
    st.tuples(st.just("release"), st.integers(0, 50)),
)


@settings(max_examples=300)
@given(devices=DEVICES, ratio=RATIOS, steps=st.lists(STEP, max_size=40))
def test_no_device_is_ever_held_above_its_limit(
    devices: list[GpuDevice], ratio: Fraction, steps: list[tuple[object, ...]]
) -> None:
    held: dict[str, int] = {}
    active: list[dict[str, int]] = []
    for step in steps:
        if step[0] == "claim":
            _, vram, gpus, policy = step
            assert isinstance(vram, int)
            assert isinstance(gpus, int)
            assert isinstance(policy, GpuPolicy)
            chosen = choose_devices(devices, held, vram, gpus, ratio, policy)
            if isinstance(chosen, DeviceRefusal):
                _assert_no_set_fits(devices, held, vram, gpus, ratio)
                continue
            assert len(chosen) == gpus
            assert set(chosen.values()) == {share_mb(vram, gpus)}
            hold(held, chosen)
            active.append(chosen)
        elif active:
            index = step[1]
            assert isinstance(index, int)
            release(held, active.pop(index % len(active)))
        for room in rooms(devices, held, ratio):
            assert room.limit_mb is not None
            assert room.held_mb <= room.limit_mb
        assert restore_holdings(devices, active, ratio).held == held
        assert restore_holdings(devices, active, ratio).over == ()


def _assert_no_set_fits(
    devices: list[GpuDevice], held: dict[str, int], vram: int, gpus: int, ratio: Fraction
) -> None:
    share = share_mb(vram, gpus)
    for group in combinations(devices, gpus):
        assert any(
            held.get(d.id, 0) + share > (device_limit_mb(d.memory_mb, ratio) or 0) for d in group
        )


HOLDINGS = st.dictionaries(st.sampled_from([f"d{i}" for i in range(6)]), st.integers(0, 4_000))


@settings(max_examples=300)
@given(
    devices=DEVICES,
    held=HOLDINGS,
    ratio=RATIOS,
    vram=st.integers(1, 4_000),
    gpus=st.integers(1, 3),
)
def test_binpack_picks_the_fullest_fitting_devices_and_spread_the_emptiest(
    devices: list[GpuDevice], held: dict[str, int], ratio: Fraction, vram: int, gpus: int
) -> None:
    share = share_mb(vram, gpus)
    fitting = [room for room in rooms(devices, held, ratio) if room.fits(share)]
    free = {room.device.id: room.free_mb for room in fitting}
    for policy in GpuPolicy:
        chosen = choose_devices(list(reversed(devices)), held, vram, gpus, ratio, policy)
        if len(fitting) < gpus:
            assert isinstance(chosen, DeviceRefusal)
            continue
        assert isinstance(chosen, dict)
        assert set(chosen) <= set(free)
        others = set(free) - set(chosen)
        for inside in chosen:
            for outside in others:
                a, b = free[inside], free[outside]
                assert a is not None
                assert b is not None
                if policy is GpuPolicy.BINPACK:
                    assert (a, inside) < (b, outside)
                else:
                    assert (-a, inside) < (-b, outside)


@given(
    devices=DEVICES,
    assignments=st.lists(HOLDINGS, max_size=10),
    ratio=RATIOS,
)
def test_restore_gives_the_same_totals_as_holding_one_by_one(
    devices: list[GpuDevice], assignments: list[dict[str, int]], ratio: Fraction
) -> None:
    restored = restore_holdings(devices, assignments, ratio)
    ids = {device_id for assignment in assignments for device_id in assignment}
    assert restored.held == {i: sum(a.get(i, 0) for a in assignments) for i in ids}
    by_id = {d.id: d for d in devices}
    over = {o.device_id for o in restored.over}
    for device_id, mib in restored.held.items():
        device = by_id.get(device_id)
        if device is None:
            assert (device_id in over) == (mib > 0)
        else:
            limit = device_limit_mb(device.memory_mb, ratio)
            assert (device_id in over) == (limit is not None and mib > limit)
