"""The command line's pure parts: argument checks and the summary's arithmetic."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

import pytest

from headroom.api.constants import MAX_MB
from headroom.cli import _parser, _values_after_flags, arguments
from headroom.cli.exits import UsageError
from headroom.cli.summary import rows, summarize

NOW = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)


def reserve_args(**flags: Any) -> argparse.Namespace:
    defaults = {
        "node": "gpu-1",
        "ram": "1024",
        "vram": "0",
        "ttl": None,
        "name": None,
        "description": None,
        "owner_pod": None,
    }
    return argparse.Namespace(**{**defaults, **flags})


def test_a_good_reservation_is_built_from_the_flags() -> None:
    body = arguments.reservation(
        reserve_args(vram="2048", ttl="1h30m", name="train-42", owner_pod="pod-1"), NOW
    )
    assert body["metadata"] == {"name": "train-42"}
    assert body["spec"] == {
        "node": "gpu-1",
        "ramMB": 1024,
        "vramMB": 2048,
        "expiresAt": "2026-12-03T11:30:00Z",
        "owner": {"pod": "pod-1"},
    }
    assert arguments.reservation(reserve_args(ram="0", vram="1"))["spec"]["ramMB"] == 0
    assert arguments.reservation(reserve_args(ram=str(MAX_MB)))["spec"]["ramMB"] == MAX_MB


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"ram": "-5"}, "--ram: Invalid value: -5: should be greater than or equal to 0"),
        ({"vram": str(MAX_MB + 1)}, f"--vram: Invalid value: {MAX_MB + 1}: should be less than"),
        ({"ram": "0"}, "--ram: Invalid value: at least one of --ram and --vram must be above 0"),
        ({"ram": "lots"}, '--ram: Invalid value: "lots": must be a whole number of MiB'),
        ({"node": "Gpu_1"}, '--node: Invalid value: "Gpu_1": a lowercase RFC 1123 subdomain'),
        ({"node": ""}, "--node: Required value"),
        ({"node": "a" * 254}, "--node: Too long: may not be more than 253 characters"),
        ({"name": "x."}, '--name: Invalid value: "x."'),
        ({"ttl": "-1h"}, "--ttl: not a duration (use e.g. 90s, 5m, 1h30m): '-1h'"),
        ({"ttl": "400d"}, "--ttl: not a duration"),
        ({"ttl": "9000h"}, "--ttl: duration '9000h' is outside"),
        ({"description": "x" * 1025}, "--description: Too long: may not be more than 1024"),
        ({"owner_pod": "Pod"}, '--owner-pod: Invalid value: "Pod"'),
    ],
)
def test_a_bad_flag_is_refused_naming_the_flag_and_the_value(
    flags: dict[str, str], message: str
) -> None:
    with pytest.raises(UsageError) as refused:
        arguments.reservation(reserve_args(**flags), NOW)
    assert str(refused.value).startswith(message)
    assert refused.value.code == 2


@pytest.mark.parametrize("value", ["0", "0s", "-1s", "soon", ""])
def test_a_timeout_must_be_a_duration_above_zero(value: str) -> None:
    with pytest.raises(UsageError, match=r"^--timeout: "):
        arguments.duration(value, "--timeout")
    assert arguments.duration("2s", "--timeout").total_seconds() == 2


def test_namespaces_are_dns_labels() -> None:
    assert arguments.namespace(None) is None
    assert arguments.namespace("ml") == "ml"
    with pytest.raises(UsageError, match=r'--namespace: Invalid value: "ml\.team"'):
        arguments.namespace("ml.team")


def headroom(node: str, **status: int) -> dict[str, Any]:
    return {"metadata": {"name": node}, "status": status}


def reservation(node: str, ram: int, phase: str | None, vram: int = 0) -> dict[str, Any]:
    obj: dict[str, Any] = {"spec": {"node": node, "ramMB": ram, "vramMB": vram}}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def test_summary_counts_admitted_reservations_and_those_on_nodes_without_a_headroom() -> None:
    headrooms = [headroom("a", reservedRAMMB=1024, activeEntries=1, staleEntries=1)]
    reservations = [
        reservation("a", 1024, "Admitted", vram=10),
        reservation("x", 100, "Admitted"),
        reservation("x", 200, "Admitted"),
        reservation("y", 300, "Admitted"),
        reservation("a", 5000, "Rejected"),
        reservation("a", 7, None),
    ]
    data = summarize(headrooms, reservations)
    assert data["nodes"] == 1
    assert data["staleEntries"] == 1
    assert (data["activeEntries"], data["totalReservedMB"], data["totalVRAMMB"]) == (4, 1624, 10)
    assert data["reservations"] == {"Pending": 1, "Admitted": 4, "Rejected": 1, "Reclaimed": 0}
    assert data["withoutNodeHeadroom"] == {
        "entries": 3,
        "reservedMB": 600,
        "reservedVRAMMB": 0,
        "nodes": {"x": 2, "y": 1},
    }
    table = dict(rows({"scope": "cluster", **data}))
    assert table["admitted on nodes without a NodeHeadroom"] == "3 (x, y)"
    assert table["reservations read"] == "all namespaces"


def test_summary_uses_what_could_be_read() -> None:
    headrooms = [headroom("a", reservedRAMMB=1024, reservedVRAMMB=5, activeEntries=1)]
    only_headrooms = summarize(headrooms, None)
    assert only_headrooms["figuresFrom"] == "NodeHeadrooms"
    assert (only_headrooms["totalReservedMB"], only_headrooms["activeEntries"]) == (1024, 1)
    assert only_headrooms["reservations"] is None
    assert "reserved RAM (MiB) (from NodeHeadrooms)" in dict(
        rows({"scope": "none", **only_headrooms})
    )

    only_reservations = summarize(None, [reservation("a", 64, "Admitted")])
    assert only_reservations["nodes"] is None
    assert only_reservations["withoutNodeHeadroom"] is None
    table = dict(rows({"scope": "namespace", "namespace": "ml", **only_reservations}))
    assert table["reservations read"] == "namespace ml"
    assert "nodes" not in table
    assert "admitted on nodes without a NodeHeadroom" not in table


def test_a_flag_takes_the_next_word_as_its_value_only_where_it_takes_a_value() -> None:
    """``hold --wait 5m`` takes a value, ``reserve --wait`` does not: each subcommand's own."""
    parser = _parser("headroom", with_run=True)
    assert _values_after_flags(parser, ["reserve", "--wait", "--ttl", "-1h", "--node", "n"]) == [
        "reserve", "--wait", "--ttl=-1h", "--node=n",
    ]  # fmt: skip
    assert _values_after_flags(parser, ["hold", "--wait", "-5m", "--", "cmd", "--wait", "x"]) == [
        "hold", "--wait=-5m", "--", "cmd", "--wait", "x",
    ]  # fmt: skip
    words = ["hold", "--node", "n", "--ram", "1", "--wait", "5m", "--", "sleep", "1"]
    args = parser.parse_args(_values_after_flags(parser, words))
    assert (args.wait_for, args.argv) == ("5m", ["--", "sleep", "1"])
