"""The claim library and GPU devices, pure: ``gpus`` checked as the schema does, the
devices an admission lists read totally, ``CUDA_VISIBLE_DEVICES`` only from UUIDs, and
placement reasoning per device as the ledger admits (a property holds them together)."""

from __future__ import annotations

from datetime import timedelta
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.api.constants import MAX_GPUS, MAX_MB
from headroom.api.gpus import GpuDevice, GpuPolicy
from headroom.api.models import DeviceHeadroom
from headroom.client import (
    InvalidClaimError,
    claim,
    claim_async,
    placement,
    plans,
    procedure,
    spec,
)
from headroom.client.devices import (
    Device,
    cuda_visible_devices,
    device_fit,
    device_list,
    devices_of,
    share_mb,
)
from headroom.client.held import ClaimView, Held
from headroom.ledger import devices as ledger_devices
from tests.unit.test_client_pure import CONN, fake_calls, headroom

A = "GPU-aabbccdd-1111-2222-3333-444455556666"
B = "GPU-eeff0011-1111-2222-3333-444455556666"
M = "MIG-0a1b2c3d-1111-2222-3333-444455556666"
GIB80 = 81920


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        (-1, "spec.gpus: Invalid value: -1: should be greater than or equal to 0"),
        (MAX_GPUS + 1, f"spec.gpus: Invalid value: {MAX_GPUS + 1}: should be less than or equal"),
        ("2000", "spec.gpus: Invalid value: 2000: should be less than or equal to 1024"),
        ("two", 'spec.gpus: Invalid value: "two": must be a whole number of devices'),
        (1.5, "spec.gpus: Invalid value: 1.5: must be a whole number of devices"),
    ],
)
def test_gpus_is_checked_by_the_schema_naming_spec_gpus(gpus: Any, message: str) -> None:
    with pytest.raises(InvalidClaimError) as refused:
        spec.request(node="n1", ram_mb=0, vram_mb=1024, gpus=gpus)
    assert str(refused.value).startswith(message)
    assert refused.value.field == "spec.gpus"


def test_claim_and_claim_async_refuse_a_bad_gpus_before_any_call() -> None:
    for make in (claim, claim_async):
        with pytest.raises(InvalidClaimError, match=r"^spec\.gpus: Invalid value: 1025: "):
            make("n1", vram_mb=1024, gpus=MAX_GPUS + 1, connection=CONN)
        assert make("n1", vram_mb=1024, gpus=2, connection=CONN) is not None  # not entered


def test_gpus_goes_in_the_spec_only_when_given() -> None:
    assert "gpus" not in spec.request(node="n1", ram_mb=0, vram_mb=1024).body("n1")["spec"]
    for gpus in (0, 2, "4", MAX_GPUS):
        body = spec.request(node="n1", ram_mb=0, vram_mb=1024, gpus=gpus).body("n1")
        assert body["spec"]["gpus"] == int(gpus)


def test_the_share_is_the_ledgers() -> None:
    for vram in (1, 2, 3, 1023, 51200, 102401, MAX_MB):
        for gpus in (1, 2, 3, 7, 8, MAX_GPUS):
            assert share_mb(vram, gpus) == ledger_devices.share_mb(vram, gpus)


def test_the_devices_of_an_admission_are_read_totally_in_status_order() -> None:
    status = {
        "phase": "Admitted",
        "devices": [
            {"id": B, "memoryMB": 51200},
            {"id": A, "memoryMB": 51200},
            {"id": "", "memoryMB": 1},  # no id
            {"id": "gfd 0", "memoryMB": 1},  # could not be listed
            {"id": "a,b", "memoryMB": 1},
            {"id": "x" * 254, "memoryMB": 1},  # too long
            {"id": 7, "memoryMB": 1},
            {"id": "c", "memoryMB": "1"},
            {"id": "d", "memoryMB": True},
            {"id": "e", "memoryMB": -1},
            {"id": "f", "memoryMB": MAX_MB + 1},
            {"id": "g"},
            "GPU-0",
            None,
            {"id": B, "memoryMB": 9},  # repeated: the first counts
            {"id": "gfd-1", "memoryMB": 0, "later": True},  # more keys: fine
        ],
    }
    assert devices_of(status) == (Device(B, 51200), Device(A, 51200), Device("gfd-1", 0))
    for odd in (None, {}, {"devices": None}, {"devices": "GPU-0"}, {"devices": {}}, [], "x"):
        assert devices_of(odd) == ()
    many = {"devices": [{"id": f"d{i}", "memoryMB": 1} for i in range(MAX_GPUS + 5)]}
    assert len(devices_of(many)) == MAX_GPUS


@pytest.mark.parametrize(
    ("ids", "cuda"),
    [
        ([A], A),
        ([A, B], f"{A},{B}"),
        ([M, A], f"{M},{A}"),
        (
            ["MIG-GPU-aabbccdd-1111-2222-3333-444455556666/1/0"],
            "MIG-GPU-aabbccdd-1111-2222-3333-444455556666/1/0",
        ),  # the older MIG form
        ([], None),
        (["gfd-0"], None),
        ([A, "gfd-1"], None),  # one synthetic id: CUDA could not take the list
        (["gpu.nvidia.com/pool/gpu-0"], None),
        (["GPU-"], None),
        (["gpu-aabbccdd"], None),  # lowercase prefix: not a UUID
    ],
)
def test_cuda_visible_devices_only_when_every_id_is_a_uuid(
    ids: list[str], cuda: str | None
) -> None:
    devices = tuple(Device(i, 1024) for i in ids)
    assert cuda_visible_devices(devices) == cuda
    assert device_list(devices) == (",".join(ids) or None)


def test_an_admission_on_devices_shows_them_on_the_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    admitted = {
        "phase": "Admitted",
        "reason": "Fits",
        "message": "node n1: reserved 0 MiB RAM and 102400 MiB VRAM on GPU-aabbccdd… (51200 MiB)",
        "devices": [{"id": B, "memoryMB": 51200}, {"id": A, "memoryMB": 51200}, {"id": 1}],
    }
    fake = fake_calls(monkeypatch, [admitted])
    request = spec.request(node="n1", ram_mb=0, vram_mb=102400, gpus=2, name="job")
    plan = procedure.obtain(CONN, request, timeout=timedelta(seconds=5), report=print)
    held = plans.run(plan, sleep=lambda _: None)
    assert fake.created[0]["spec"]["gpus"] == 2
    view = ClaimView(held)
    assert view.devices == (Device(B, 51200), Device(A, 51200))
    assert view.cuda_visible_devices == f"{B},{A}"
    synthetic = Held(CONN, "x", "u", "n1", 0, 1, "m", devices=(Device("gfd-0", 1),))
    assert ClaimView(synthetic).cuda_visible_devices is None
    assert ClaimView(Held(CONN, "x", "u", "n1", 1, 0, "m")).devices == ()


def gpu_node(name: str, held: list[int], memory: int = GIB80, **status: Any) -> dict[str, Any]:
    """A NodeHeadroom with one device per ``held`` figure, ``gfd-<i>``, ratio 1."""
    devices = [
        {"id": f"gfd-{i}", "kind": "gpu", "memoryMB": memory, "reservedMB": mib}
        | {"freeMB": max(memory - mib, 0)}
        for i, mib in enumerate(held)
    ]
    return headroom(
        name,
        vramCapacityMB=memory * len(held),
        reservedVRAMMB=sum(held),
        devices=devices,
        gpuSource="GFD",
        gpuPolicy="binpack",
        **status,
    )


def test_three_50_gib_claims_do_not_fit_on_two_80_gib_gpus() -> None:
    two_held = gpu_node("gpu-1", [51200, 51200])
    [room] = placement.rank([two_held], ram_mb=0, vram_mb=51200)
    assert not room.fits
    assert room.free_vram_mb == 61440  # the node-wide sum would have said yes
    assert room.why_not == (
        "needs 1 device with 51200 MiB free; 0 of 2 have it (free MiB: gfd-0 30720, gfd-1 30720)"
    )
    assert room.largest_free_device_mb == 30720
    message = placement.no_room([room], 0, 51200, None)
    assert message == (
        "no node has room for 0 MiB RAM and 51200 MiB VRAM now (gpu-1: needs 1 device with "
        "51200 MiB free; 0 of 2 have it (free MiB: gfd-0 30720, gfd-1 30720))"
    )
    # The same VRAM over two devices, or over the node's sum, fits.
    assert placement.rank([two_held], 0, 51200, gpus=2)[0].fits
    assert placement.rank([two_held], 0, 51200, gpus=0)[0].fits
    assert not placement.rank([two_held], 0, 61441, gpus=0)[0].fits  # the sum still holds
    # Three devices asked of two: never, not even once others leave.
    three = placement.rank([gpu_node("gpu-2", [0, 0])], 0, 3000, gpus=3)[0]
    assert (three.fits, three.could_fit_later) == (False, False)
    assert three.why_not is not None
    assert three.why_not.startswith("needs 3 devices with 1000 MiB free each; 2 of 2 have it")
    # One that may wait can queue where the devices' limits would hold it.
    assert room.could_fit_later
    assert not placement.rank([two_held], 0, GIB80 + 1, gpus=1)[0].could_fit_later


def test_devices_without_a_bound_and_nodes_without_devices() -> None:
    unlimited = gpu_node("u", [GIB80, GIB80])
    for device in unlimited["status"]["devices"]:
        del device["freeMB"]
    unlimited["status"]["vramCapacityMB"] = None  # not enforced node-wide either
    room = placement.rank([unlimited], 0, GIB80, gpus=2)[0]
    assert (room.fits, room.largest_free_device_mb, room.has_devices) == (True, None, True)
    plain = placement.rank([headroom("p", vramCapacityMB=GIB80)], 0, 51200)[0]
    assert (plain.fits, plain.has_devices, plain.largest_free_device_mb) == (True, False, None)
    assert plain.as_json()["largestFreeDeviceMB"] is None
    none = placement.rank([gpu_node("none", [])], 0, 1)[0]
    assert none.why_not == "free VRAM 0 MiB < 1 MiB"  # the sum speaks first
    ram_only = placement.rank([gpu_node("r", [GIB80, GIB80])], 1024, 0)[0]
    assert ram_only.fits  # no VRAM: no device needed


def test_the_node_wide_vram_check_uses_the_published_limit() -> None:
    """``limitVRAMMB`` is capacity × the node's VRAM ratio; an older operator publishes
    only the capacity (the limit at ratio 1); ratio 0 leaves the sum unlimited."""
    over = gpu_node("over", [0, 0], limitVRAMMB=int(GIB80 * 2 * 1.5), maxVramOvercommitRatio="1.5")
    room = placement.rank([over], 0, GIB80 * 2 + 1, gpus=2)[0]
    assert room.free_vram_mb == GIB80 * 3
    older = gpu_node("older", [GIB80, 0])
    assert placement.rank([older], 0, 1, gpus=0)[0].free_vram_mb == GIB80
    unlimited = gpu_node("free", [GIB80, GIB80], maxVramOvercommitRatio="0")
    assert placement.rank([unlimited], 0, 1, gpus=0)[0].free_vram_mb is None


def test_an_odd_device_is_left_out_not_the_node() -> None:
    node = gpu_node("odd", [0, 0, 0])
    devices = node["status"]["devices"]
    devices[0]["addedLater"] = True  # a field a newer operator writes: ignored
    devices[1]["kind"] = "vgpu"  # a kind this client does not know: that device left out
    devices.append("GPU-0")
    room = placement.rank([node], 0, 1024, gpus=2)[0]
    assert room.fits
    assert room.why_not is None
    three = placement.rank([node], 0, 3072, gpus=3)[0]
    assert three.why_not is not None
    assert three.why_not.startswith("needs 3 devices with 1024 MiB free each; 2 of 2 have it")
    node["status"]["devices"] = "none"  # not a list: read as no device list at all
    unread = placement.rank([node], 0, 1024)[0]
    assert (unread.fits, unread.has_devices) == (True, False)


def test_many_devices_are_shown_most_free_first_and_counted() -> None:
    node = gpu_node("big", [81920, 80000, 0, 70000, 81000, 60000, 81920])
    room = placement.rank([node], 0, 50000, gpus=2)[0]
    assert room.why_not == (
        "needs 2 devices with 25000 MiB free each; 1 of 7 have it "
        "(free MiB: gfd-2 81920, gfd-5 21920, gfd-3 11920, gfd-1 1920, 3 more)"
    )


def test_the_order_stays_ram_then_free_vram_then_name() -> None:
    rooms = placement.rank(
        [
            gpu_node("b", [0, 0]),
            gpu_node("a", [0, 40960]),  # less free VRAM, the same largest free device
            gpu_node("c", [40960, 40960], allocatableRAMMB=40000),
            gpu_node("full", [81920, 40960]),
        ],
        ram_mb=0,
        vram_mb=51200,
    )
    assert [(r.node, r.fits) for r in rooms] == [
        ("b", True),
        ("a", True),
        ("c", False),  # the most RAM, but no device with 51200 MiB free
        ("full", False),
    ]


@st.composite
def device_states(draw: st.DrawFn) -> tuple[list[GpuDevice], dict[str, int], Fraction]:
    count = draw(st.integers(0, 6))
    devices = [GpuDevice(f"gfd-{i}", draw(st.integers(0, 4096))) for i in range(count)]
    held = {d.id: draw(st.integers(0, 5000)) for d in devices if draw(st.booleans())}
    ratio = draw(st.sampled_from([Fraction(0), Fraction(1), Fraction(3, 2), Fraction(1, 2)]))
    return devices, held, ratio


@settings(max_examples=300, deadline=None)
@given(device_states(), st.integers(1, 9000), st.integers(1, 7))
def test_placement_fits_on_devices_exactly_when_the_ledger_would_choose_some(
    state: tuple[list[GpuDevice], dict[str, int], Fraction], vram: int, gpus: int
) -> None:
    devices, held, ratio = state
    published = [
        DeviceHeadroom.model_validate(
            {"id": room.device.id, "kind": "gpu", "memoryMB": room.device.memory_mb}
            | {"reservedMB": room.held_mb}
            | ({} if room.free_mb is None else {"freeMB": room.free_mb})
        )
        for room in ledger_devices.rooms(devices, held, ratio)
    ]
    chosen = ledger_devices.choose_devices(devices, held, vram, gpus, ratio, GpuPolicy.BINPACK)
    assert device_fit(published, vram, gpus).fits == isinstance(chosen, dict)
    empty = ledger_devices.choose_devices(devices, {}, vram, gpus, ratio, GpuPolicy.SPREAD)
    if isinstance(empty, dict):  # fits on the empty devices: may wait for it
        assert device_fit(published, vram, gpus).fits_later
