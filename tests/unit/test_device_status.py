"""An admission's devices in status (issue 20): written, read back totally, stamped.

The assignment is what a program is told to use, so it is part of the decision:
``status.devices`` round-trips through ``decision_of``, any value a status can
hold is read without raising, and the decision stamp covers it (a changed
device or size no longer verifies), while a stamp without devices is the one
stamps had before devices existed, so an upgrade keeps trusting them.
"""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from headroom.api.models import ReservationStatus
from headroom.api.reasons import Phase, Reason
from headroom.objects.stamp import Stamper
from headroom.objects.status import StatusDecision, decision_of, recorded_devices, status_body

AT = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
A = "GPU-aabbccdd-0000-1111-2222-333344445555"
B = "MIG-bbccddee-0000-1111-2222-333344445555"


def admitted(devices: dict[str, int]) -> StatusDecision:
    return StatusDecision(Phase.ADMITTED, Reason.FITS, "fits", AT, "run-1", devices=devices)


def test_the_devices_round_trip_through_the_status() -> None:
    status = status_body(admitted({B: 4864, A: 51200}))
    assert status["devices"] == [{"id": A, "memoryMB": 51200}, {"id": B, "memoryMB": 4864}]
    ReservationStatus.model_validate(status)  # what the CRD accepts
    decision = decision_of(status, AT)
    assert decision is not None
    assert decision.devices == {A: 51200, B: 4864}


def test_no_devices_no_field() -> None:
    assert "devices" not in status_body(admitted({}))
    rejected = StatusDecision(Phase.REJECTED, Reason.INSUFFICIENT_VRAM, "no", AT, "run-2")
    assert "devices" not in status_body(rejected)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=30,
)


@given(st.dictionaries(st.sampled_from(["devices", "phase"]), json_values))
def test_any_status_is_read_without_raising(status: dict[str, object]) -> None:
    devices = recorded_devices(status)
    assert all(isinstance(k, str) and isinstance(v, int) and v > 0 for k, v in devices.items())


def test_bad_items_are_left_out() -> None:
    status = {
        "devices": [
            {"id": A, "memoryMB": 100},
            {"id": A, "memoryMB": 5},  # a duplicate
            {"id": "", "memoryMB": 1},
            {"id": B, "memoryMB": True},
            {"id": B, "memoryMB": 2**40},
            "GPU-x",
        ]
    }
    assert recorded_devices(status) == {A: 100}


def test_the_stamp_covers_the_devices_and_is_unchanged_without_them() -> None:
    stamper = Stamper(b"k" * 32)
    uid = "0b4c7d2e"
    plain = stamper.sign(uid, "run-1", "Admitted")
    assert plain == stamper.sign(uid, "run-1", "Admitted", {})
    decision = admitted({A: 51200})
    decision.stamp = stamper.sign(uid, "run-1", "Admitted", decision.devices)
    obj = {"metadata": {"uid": uid}, "status": status_body(decision)}
    assert stamper.trusted(obj)
    obj["status"]["devices"][0]["memoryMB"] = 1024  # a smaller share, written by someone else
    assert not stamper.trusted(obj)
    obj["status"]["devices"] = []  # or the assignment dropped
    assert not stamper.trusted(obj)
