"""`kubectl headroom` against a scripted cluster state, through kubectl's plugin lookup too."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import yaml
from kubernetes import client

from headroom_dev import reservations as rsv
from tests.integration.stand_in import UUIDS, DeviceAdmitter
from tests.polling import eventually


def test_nodes_table_and_json(cli: Callable[..., Any], scene: str) -> None:
    def shows() -> None:
        result = cli("nodes")
        assert result.returncode == 0, result.stderr
        header, *rows = result.stdout.splitlines()
        assert header.split() == [
            "NODE",
            "TOTAL",
            "RESERVED",
            "VRAM",
            "GPU-FREE",  # the scene's node has one GPU (GFD labels): its free MiB
            "ALLOCATABLE",
            "UTIL%",
            "ENTRIES",
            "STALE",
        ]
        mine = [r.split() for r in rows if r.startswith(scene)]
        assert mine, result.stdout
        assert mine[0] == [scene, "9216", "6144", "1024/4096", "3072", "2048", "66", "1", "0"]

    eventually(shows)
    data = json.loads(cli("nodes", "-o", "json").stdout)
    assert next(d for d in data if d["node"] == scene)["allocatableRAMMB"] == 2048


def test_summary(cli: Callable[..., Any], scene: str) -> None:
    def totals() -> None:
        data = yaml.safe_load(cli("summary", "-o", "yaml").stdout)
        assert data["totalReservedMB"] >= 6144
        assert data["activeEntries"] >= 1
        assert data["reservations"]["Admitted"] >= 1

    eventually(totals)
    assert "reserved RAM (MiB)" in cli("summary").stdout


def test_reserve_wait_exit_codes_and_why(cli: Callable[..., Any], scene: str) -> None:
    fits = cli(
        "reserve", "--node", scene, "--ram", "1024", "--name", "small", "--ttl", "1h", "--wait"
    )
    assert fits.returncode == 0, fits.stderr
    assert "admitted" in fits.stdout
    too_big = cli("reserve", "--node", scene, "--ram", "4096", "--name", "big", "--wait")
    assert too_big.returncode == 1
    assert "InsufficientRAM" in too_big.stderr
    assert "requested 4096 MiB, allocatable 1024 MiB" in too_big.stderr

    def explained() -> None:
        why = cli("why", "big")
        assert why.returncode == 0, why.stderr
        assert "Phase:   Rejected" in why.stdout
        assert "total 9216 × 1 − reserve 1024 − reserved 7168" in why.stdout
        assert "InsufficientRAM" in why.stdout.split("Events:")[1]

    eventually(explained)
    data = json.loads(cli("why", "small", "-o", "json").stdout)
    assert data["status"]["phase"] == "Admitted"
    assert data["spec"]["expiresAt"]


def test_heartbeat_via_the_kubectl_plugin(
    cli: Callable[..., Any], scene: str, custom: client.CustomObjectsApi, namespace: str
) -> None:
    result = cli("heartbeat", "held", via="kubectl")
    assert result.returncode == 0, result.stderr
    beat = rsv.get(custom, namespace, "held")["metadata"]["annotations"]["headroom.dev/heartbeat"]
    assert beat.startswith(time.strftime("%Y-%m-%dT", time.gmtime()))
    assert cli("nodes", via="script").returncode == 0


def test_not_found_is_a_clear_error(
    cli: Callable[..., Any], namespace: str, crds: list[str]
) -> None:
    result = cli("why", "nope")
    assert result.returncode == 4  # the cluster refused the request (404)
    assert f'reservation "nope" not found in namespace "{namespace}"' in result.stderr
    assert "Traceback" not in result.stderr


def events_named(core: client.CoreV1Api, namespace: str, name: str) -> list[str]:
    selector = f"involvedObject.name={name},involvedObject.kind=Reservation"
    return sorted(
        e.reason for e in core.list_namespaced_event(namespace, field_selector=selector).items
    )


def test_why_shows_only_the_events_of_this_object_not_of_its_namesakes(
    cli: Callable[..., Any],
    scene: str,
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    rsv.create(custom, namespace, "again", scene, 1024)
    assert rsv.wait_for(custom, namespace, "again")["status"]["phase"] == "Admitted"

    def fits_posted() -> None:
        assert events_named(core, namespace, "again") == ["Fits"]

    eventually(fits_posted)
    rsv.delete(custom, namespace, "again")
    second = rsv.create(custom, namespace, "again", scene, 4096)  # 2048 left: rejected
    assert rsv.wait_for(custom, namespace, "again")["status"]["phase"] == "Rejected"

    def both_posted() -> None:  # by name, the two objects' Events are mixed
        assert events_named(core, namespace, "again") == ["Fits", "InsufficientRAM"]

    eventually(both_posted)
    data = json.loads(cli("why", "again", "-o", "json").stdout)
    assert data["uid"] == second["metadata"]["uid"]
    assert [e["reason"] for e in data["events"]] == ["InsufficientRAM"]
    text = cli("why", "again").stdout.split("Events:")[1]
    assert "InsufficientRAM" in text
    assert "Fits" not in text


def test_heartbeat_on_a_rejected_reservation_exits_1_and_writes_nothing(
    cli: Callable[..., Any], scene: str, custom: client.CustomObjectsApi, namespace: str
) -> None:
    rsv.create(custom, namespace, "refused", scene, 4096)
    assert rsv.wait_for(custom, namespace, "refused")["status"]["phase"] == "Rejected"
    result = cli("heartbeat", "refused")
    assert result.returncode == 1, result.stderr
    assert "holds nothing: Rejected (InsufficientRAM)" in result.stderr
    assert "requested 4096 MiB" in result.stderr
    assert "heartbeat sent" not in result.stdout
    annotations = rsv.get(custom, namespace, "refused")["metadata"].get("annotations") or {}
    assert "headroom.dev/heartbeat" not in annotations
    admitted = cli("heartbeat", "held")
    assert admitted.returncode == 0, admitted.stderr
    assert admitted.stdout.strip() == "reservation.headroom.dev/held heartbeat sent"


def test_summary_counts_what_is_held_on_a_deleted_node(
    cli: Callable[..., Any],
    scene: str,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    gone = f"gone-{scene}"
    make_node(gone, memory="9Gi")
    for index in range(3):
        rsv.create(custom, namespace, f"on-gone-{index}", gone, 1024)
    for index in range(3):
        assert rsv.wait_for(custom, namespace, f"on-gone-{index}")["status"]["phase"] == "Admitted"

    def headroom_of_gone(present: bool) -> None:
        names = [
            i["metadata"]["name"]
            for i in custom.list_cluster_custom_object("headroom.dev", "v1alpha1", "nodeheadrooms")[
                "items"
            ]
        ]
        assert (gone in names) is present

    eventually(lambda: headroom_of_gone(True))
    core.delete_node(gone)
    eventually(lambda: headroom_of_gone(False))
    assert {r["status"]["phase"] for r in rsv.list_all(custom, namespace)} == {"Admitted"}

    data = json.loads(cli("summary", "-o", "json").stdout)
    assert data["withoutNodeHeadroom"]["nodes"][gone] == 3
    assert data["withoutNodeHeadroom"]["reservedMB"] >= 3 * 1024
    assert data["activeEntries"] == data["reservations"]["Admitted"]
    assert data["totalReservedMB"] >= 6144 + 3 * 1024
    rows = {
        line.split("   ")[0].strip(): line.split("   ", 1)[1].strip()
        for line in cli("summary").stdout.splitlines()[1:]
    }
    assert rows["active entries"] == rows["reservations Admitted"]
    assert gone in rows["admitted on nodes without a NodeHeadroom"]


def test_reserve_on_gpus_prints_the_devices(
    cli: Callable[..., Any], device_admitter: DeviceAdmitter
) -> None:
    """Admitted on two GPUs (a stand-in writes the status as the operator would)."""
    both = ",".join(UUIDS)
    flags = ("--node", "gpu-node", "--ram", "0", "--vram", "4096", "--gpus", "2", "--wait")
    result = cli("reserve", *flags, "--name", "on-gpus")
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first.startswith("reservation.headroom.dev/on-gpus admitted: node gpu-node: ")
    assert second == f"devices: {both} (CUDA_VISIBLE_DEVICES={both})"
    data = json.loads(cli("reserve", *flags, "--name", "on-gpus-2", "-o", "json").stdout)
    assert data["devices"] == [
        {"id": UUIDS[0], "memoryMB": 2048},
        {"id": UUIDS[1], "memoryMB": 2048},
    ]
    assert json.loads(cli("why", "on-gpus-2", "-o", "json").stdout)["spec"]["gpus"] == 2
    why = cli("why", "on-gpus-2").stdout.splitlines()
    assert why[0].endswith(": 0 MiB RAM, 4096 MiB VRAM over 2 GPUs on node gpu-node")
    assert f"Devices: {UUIDS[0]} (2048 MiB), {UUIDS[1]} (2048 MiB)" in why
