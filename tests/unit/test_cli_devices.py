"""The command line and GPU devices, with the cluster stood in for: ``--gpus`` checked
naming the flag before anything is sent, the command's environment under ``hold``, and
``fit`` / ``nodes`` / ``reserve`` reading NodeHeadrooms and statuses that list devices."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from headroom.api.constants import MAX_GPUS
from headroom.cli import arguments, kubectl_main, readers, reserve
from headroom.cli.exits import UsageError
from headroom.cli.hold import command_env
from headroom.client import Connection, calls
from headroom.client.devices import Device
from headroom.client.held import ClaimView, Held
from tests.unit.test_cli_pure import NOW, reserve_args
from tests.unit.test_client_devices import A, B, gpu_node
from tests.unit.test_client_pure import headroom

CONN = Connection(api=None, namespace="ml")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ("-1", "--gpus: Invalid value: -1: should be greater than or equal to 0"),
        ("2000", f"--gpus: Invalid value: 2000: should be less than or equal to {MAX_GPUS}"),
        ("2.5", '--gpus: Invalid value: "2.5": must be a whole number of devices'),
    ],
)
def test_a_bad_gpus_is_refused_naming_the_flag(gpus: str, message: str) -> None:
    with pytest.raises(UsageError) as refused:
        arguments.reservation(reserve_args(vram="1024", gpus=gpus), NOW)
    assert str(refused.value).startswith(message)
    assert refused.value.code == 2


@pytest.mark.parametrize("command", ["reserve", "hold", "fit"])
def test_gpus_minus_one_on_the_command_line_is_refused_before_anything_is_sent(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_cluster(*args: Any) -> None:
        pytest.fail("nothing is sent for a bad flag")

    monkeypatch.setattr(readers, "connect", no_cluster)
    words = [command, "--ram", "1024", "--vram", "2048", "--gpus", "-1"]
    words += [] if command == "fit" else ["--node", "n1"]
    words += ["--", "true"] if command == "hold" else []
    assert kubectl_main(words) == 2
    assert capsys.readouterr().err == (
        "Error: --gpus: Invalid value: -1: should be greater than or equal to 0\n"
    )


def test_gpus_goes_in_the_reservation() -> None:
    body = arguments.reservation(reserve_args(vram="102400", gpus="2"), NOW)
    assert body["spec"] == {"node": "gpu-1", "ramMB": 1024, "vramMB": 102400, "gpus": 2}
    assert "gpus" not in arguments.reservation(reserve_args(vram="1"), NOW)["spec"]


def view(*devices: Device) -> ClaimView:
    return ClaimView(Held(CONN, "job", "u-1", "n1", 0, 2048, "admitted", devices=devices))


def test_the_command_finds_its_devices_and_cuda_sees_only_those() -> None:
    said: list[str] = []
    env = command_env({"PATH": "/bin"}, view(Device(A, 1024), Device(B, 1024)), said.append)
    assert env == {
        "PATH": "/bin",
        "HEADROOM_RESERVATION": "ml/job",
        "HEADROOM_DEVICES": f"{A},{B}",
        "CUDA_VISIBLE_DEVICES": f"{A},{B}",
    }
    assert said == []
    inherited = {"CUDA_VISIBLE_DEVICES": "0,1"}
    env = command_env(inherited, view(Device(A, 1024)), said.append)
    assert env["CUDA_VISIBLE_DEVICES"] == A
    assert said == [f"CUDA_VISIBLE_DEVICES={A} replaces the inherited '0,1'"]
    said.clear()
    assert command_env({"CUDA_VISIBLE_DEVICES": A}, view(Device(A, 1)), said.append)
    assert said == []  # the same value: nothing to say


def test_synthetic_ids_leave_cuda_visible_devices_as_it_was() -> None:
    said: list[str] = []
    env = command_env({"CUDA_VISIBLE_DEVICES": "3"}, view(Device("gfd-0", 1)), said.append)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "3",
        "HEADROOM_RESERVATION": "ml/job",
        "HEADROOM_DEVICES": "gfd-0",
    }
    assert command_env({}, view(), said.append) == {"HEADROOM_RESERVATION": "ml/job"}
    assert said == []


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """NodeHeadrooms read by fit, nodes and --node auto: append to the list returned."""
    headrooms: list[dict[str, Any]] = []
    monkeypatch.setattr(readers, "connect", lambda *args: CONN)
    monkeypatch.setattr(calls, "node_headrooms", lambda conn, selector=None: headrooms)
    monkeypatch.setattr(readers, "node_headrooms", lambda conn: headrooms)
    monkeypatch.setattr(readers, "quotas", lambda conn: [])  # fit reads them too; none here
    return headrooms


def test_fit_says_the_third_50_gib_claim_does_not_fit_on_two_80_gib_gpus_and_why(
    cluster: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.append(gpu_node("gpu-1", [51200, 51200]))  # two 50 GiB claims admitted
    assert kubectl_main(["fit", "--ram", "0", "--vram", "51200"]) == 1
    assert capsys.readouterr().err == (
        "Error: no node has room for 0 MiB RAM and 51200 MiB VRAM now (gpu-1: needs 1 device "
        "with 51200 MiB free; 0 of 2 have it (free MiB: gfd-0 30720, gfd-1 30720))\n"
    )
    assert kubectl_main(["fit", "--ram", "0", "--vram", "51200", "--gpus", "2"]) == 0
    assert [line.split() for line in capsys.readouterr().out.splitlines()] == [
        ["NODE", "ALLOCATABLE", "FREE-VRAM", "FREE-DEVICE", "ENTRIES", "QUEUED"],
        ["gpu-1", "31744", "61440", "30720", "0/110", "0"],
    ]
    assert kubectl_main(["fit", "--ram", "0", "--vram", "51200", "--gpus", "0"]) == 0
    capsys.readouterr()
    cluster.append(headroom("plain", vramCapacityMB=81920))
    assert kubectl_main(["fit", "--ram", "0", "--vram", "51200", "-o", "json"]) == 0
    [plain] = json.loads(capsys.readouterr().out)
    assert (plain["node"], plain["largestFreeDeviceMB"]) == ("plain", None)
    assert kubectl_main(["fit", "--ram", "1024"]) == 0  # no VRAM: every node fits
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[3] == "FREE-DEVICE"
    assert sorted(line.split()[3] for line in lines[1:]) == ["-", "30720"]


def test_fit_without_gpu_nodes_keeps_its_columns(
    cluster: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.append(headroom("plain"))
    assert kubectl_main(["fit", "--ram", "1024"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header == ["NODE", "ALLOCATABLE", "FREE-VRAM", "ENTRIES", "QUEUED"]


def test_nodes_shows_the_largest_free_device_and_lists_devices(
    cluster: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = gpu_node("gpu-1", [51200, 0], largestFreeDeviceMB=81920)
    gpu["status"]["devices"][0] |= {"id": A, "model": "NVIDIA-A100-SXM4-80GB"}
    cluster.extend([gpu, headroom("plain")])
    assert kubectl_main(["nodes"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0] == [
        "NODE", "TOTAL", "RESERVED", "VRAM", "GPU-FREE", "ALLOCATABLE", "UTIL%", "ENTRIES", "STALE",
    ]  # fmt: skip
    assert rows[1][:5] == ["gpu-1", "32768", "0", "51200/163840", "81920"]
    assert rows[2][:5] == ["plain", "32768", "0", "0/-", "-"]
    assert kubectl_main(["nodes", "--devices"]) == 0
    assert [line.split() for line in capsys.readouterr().out.splitlines()] == [
        ["NODE", "DEVICE", "KIND", "MODEL", "MEMORY", "RESERVED", "OUTSIDE", "FREE"],
        ["gpu-1", A, "gpu", "NVIDIA-A100-SXM4-80GB", "81920", "51200", "0", "30720"],
        ["gpu-1", "gfd-1", "gpu", "-", "81920", "0", "0", "81920"],
    ]
    gpu["status"]["devices"][0] |= {"externalMB": 10240, "freeMB": 20480}
    gpu["status"]["devices"][1] |= {"externalMB": 81920, "heldOutside": "DevicePlugin"}
    assert kubectl_main(["nodes", "--devices"]) == 0
    assert [line.split()[6:] for line in capsys.readouterr().out.splitlines()[1:]] == [
        ["10240", "20480"],  # a share held through a DRA claim's consumed capacity
        ["DevicePlugin", "81920"],  # who holds the whole device
    ]
    del gpu["status"]["devices"][0]["externalMB"]
    gpu["status"]["devices"][0]["freeMB"] = 30720
    del gpu["status"]["devices"][1]["heldOutside"]
    gpu["status"]["devices"][1]["externalMB"] = 0
    assert kubectl_main(["nodes", "--devices", "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(d["node"], d["id"], d["freeMB"]) for d in listed] == [
        ("gpu-1", A, 30720),
        ("gpu-1", "gfd-1", 81920),
    ]
    del gpu["status"]["devices"][1]["freeMB"]
    assert kubectl_main(["nodes", "--devices"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[-1] == "unlimited"


def test_nodes_without_gpu_inventories_keep_their_columns(
    cluster: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.append(headroom("plain"))
    assert kubectl_main(["nodes"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header == [
        "NODE",
        "TOTAL",
        "RESERVED",
        "VRAM",
        "ALLOCATABLE",
        "UTIL%",
        "ENTRIES",
        "STALE",
    ]


def test_reserve_prints_the_devices_of_its_admission(capsys: pytest.CaptureFixture[str]) -> None:
    status = {
        "phase": "Admitted",
        "message": "node n1: reserved 0 MiB RAM and 2048 MiB VRAM on …",
        "devices": [{"id": A, "memoryMB": 1024}, {"id": B, "memoryMB": 1024}],
    }
    obj = {"metadata": {"name": "r", "uid": "u"}, "spec": {"node": "n1"}, "status": status}
    args = argparse.Namespace(output="table")
    assert reserve._decided(CONN, obj, args) == 0
    assert capsys.readouterr().out.splitlines() == [
        "reservation.headroom.dev/r admitted: node n1: reserved 0 MiB RAM and 2048 MiB VRAM on …",
        f"devices: {A},{B} (CUDA_VISIBLE_DEVICES={A},{B})",
    ]
    status["devices"] = [{"id": "gfd-0", "memoryMB": 2048}]
    assert reserve._decided(CONN, obj, args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "devices: gfd-0 (not UUIDs: no CUDA_VISIBLE_DEVICES)"
    assert reserve._decided(CONN, obj, argparse.Namespace(output="json")) == 0
    assert json.loads(capsys.readouterr().out)["devices"] == status["devices"]
    del status["devices"]
    assert reserve._decided(CONN, obj, args) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
