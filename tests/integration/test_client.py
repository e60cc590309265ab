"""The claim library (``headroom.client``) against the real operator and API server.

What a program relies on: a claim is admitted and kept alive past the stale window
by its heartbeats, a refusal is an exception with the reason and the numbers, the
reservation is gone however the block ends (normally, an exception, SIGTERM, even
while it waits in the queue), a queued claim is admitted when room appears, and a
bad value is refused before anything is sent.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from headroom.client import (
    ClaimLostError,
    ClaimRefusedError,
    Connection,
    InvalidClaimError,
    claim,
    connect,
)
from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane
from tests.integration.stand_in import UUIDS, DeviceAdmitter
from tests.polling import eventually


def phases(custom: client.CustomObjectsApi, namespace: str) -> dict[str, str | None]:
    return {
        item["metadata"]["name"]: (item.get("status") or {}).get("phase")
        for item in rsv.list_all(custom, namespace)
    }


def test_heartbeats_keep_a_claim_past_its_stale_window_and_leaving_releases_it(
    claim_node: str, connection: Connection, custom: client.CustomObjectsApi, namespace: str
) -> None:
    rsv.create(custom, namespace, "silent", claim_node, 512)  # nobody heartbeats this one
    with claim(claim_node, ram_mb=1024, vram_mb=512, connection=connection) as held:
        assert held.node == claim_node
        assert held.heartbeat_interval_from == "NodeHeadroom"
        assert held.heartbeat_interval == pytest.approx(1.0)  # a third of 3 s
        assert "reserved 1024 MiB RAM and 512 MiB VRAM" in held.message
        obj = rsv.get(custom, namespace, held.name)
        assert obj["spec"] == {"node": claim_node, "ramMB": 1024, "vramMB": 512}
        time.sleep(8)  # well past the 3 s window
        assert phases(custom, namespace) == {held.name: "Admitted", "silent": "Reclaimed"}
        assert held.lost is None
        held.check()
        beat = rsv.get(custom, namespace, held.name)["metadata"]["annotations"]
        assert beat["headroom.dev/heartbeat"] != obj["metadata"].get("annotations", {}).get(
            "headroom.dev/heartbeat"
        )
    assert held.released
    assert held.name not in phases(custom, namespace)


def test_a_refused_claim_raises_with_the_reason_and_the_numbers(
    claim_node: str, connection: Connection, custom: client.CustomObjectsApi, namespace: str
) -> None:
    with (
        pytest.raises(ClaimRefusedError) as refused,
        claim(claim_node, ram_mb=16384, connection=connection, name="too-big"),
    ):
        pytest.fail("the block of a refused claim must not run")
    error = refused.value
    assert (error.phase, error.reason, error.node) == ("Rejected", "InsufficientRAM", claim_node)
    assert "requested 16384 MiB, allocatable 8192 MiB" in error.message
    assert f"reservation {namespace}/too-big on node {claim_node}: Rejected" in str(error)
    assert phases(custom, namespace) == {}  # the refused reservation was deleted


def test_an_exception_in_the_block_releases_the_claim(
    claim_node: str, connection: Connection, custom: client.CustomObjectsApi, namespace: str
) -> None:
    seen: dict[str, str | None] = {}

    def failing_job() -> None:
        with claim(claim_node, ram_mb=2048, connection=connection, name="job"):
            seen.update(phases(custom, namespace))
            raise RuntimeError("the job failed")

    with pytest.raises(RuntimeError, match="the job failed"):
        failing_job()
    assert seen == {"job": "Admitted"}
    assert phases(custom, namespace) == {}


HOLDER = textwrap.dedent(
    """
    import sys, time
    from headroom.client import claim, from_kubeconfig

    kubeconfig, namespace, node, ram, wait = sys.argv[1:]
    connection = from_kubeconfig(kubeconfig, namespace=namespace)
    with claim(node, ram_mb=int(ram), wait=wait or None, connection=connection,
               name="held-by-child", report=lambda line: print(line, flush=True)) as held:
        print("holding", held.name, flush=True)
        time.sleep(120)
    """
)


def start_holder(
    control_plane: ControlPlane, namespace: str, node: str, ram: int, wait: str = ""
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER,
            str(control_plane.kubeconfig),
            namespace,
            node,
            str(ram),
            wait,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_sigterm_releases_the_claim_of_a_holding_process(
    claim_node: str,
    control_plane: ControlPlane,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    holder = start_holder(control_plane, namespace, claim_node, 1024)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().split() == ["holding", "held-by-child"]
        assert phases(custom, namespace) == {"held-by-child": "Admitted"}
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(20) == 128 + signal.SIGTERM  # it ended as a SIGTERM ends a process
    finally:
        holder.kill()
    assert phases(custom, namespace) == {}


def test_sigterm_while_queued_deletes_the_waiting_reservation(
    claim_node: str,
    control_plane: ControlPlane,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    rsv.create(custom, namespace, "big", claim_node, 7168)
    assert rsv.wait_for(custom, namespace, "big")["status"]["phase"] == "Admitted"
    rsv.heartbeat(custom, namespace, "big")
    holder = start_holder(control_plane, namespace, claim_node, 2048, wait="1m")
    try:
        assert holder.stdout is not None
        assert "queued on node" in holder.stdout.readline()
        assert phases(custom, namespace)["held-by-child"] == "Queued"
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(20) == 128 + signal.SIGTERM
    finally:
        holder.kill()
    assert set(phases(custom, namespace)) <= {"big"}


def test_a_queued_claim_is_admitted_when_another_is_released(
    claim_node: str, connection: Connection, custom: client.CustomObjectsApi, namespace: str
) -> None:
    lines: list[str] = []
    outcome: dict[str, Any] = {}
    may_leave = threading.Event()

    def second() -> None:
        try:
            with claim(
                claim_node,
                ram_mb=4096,
                wait="30s",
                name="second",
                connection=connection,
                report=lines.append,
            ) as held:
                outcome["admitted"] = (held.name, rsv.get(custom, namespace, "second")["status"])
                may_leave.wait(30)
        except BaseException as error:  # reported to the test below
            outcome["error"] = error

    waiter = threading.Thread(target=second)
    try:
        with claim(claim_node, ram_mb=6144, connection=connection, name="first") as first:
            waiter.start()

            def queued() -> None:
                listed = {i["metadata"]["name"]: i for i in rsv.list_all(custom, namespace)}
                status = listed.get("second", {}).get("status") or {}
                assert (status.get("phase"), status.get("queuePosition")) == ("Queued", 1)
                assert status["reason"] == "InsufficientRAM"

            eventually(queued)
            assert phases(custom, namespace)["first"] == "Admitted"
            assert first.release()
            eventually(lambda: admitted(outcome))
    finally:
        may_leave.set()
        if waiter.is_alive():
            waiter.join(20)
    assert "error" not in outcome, outcome.get("error")
    assert any("queued on node" in line and "at position 1" in line for line in lines), lines
    assert phases(custom, namespace) == {}


def admitted(outcome: dict[str, Any]) -> None:
    assert "error" not in outcome, outcome["error"]
    assert "admitted" in outcome
    name, status = outcome["admitted"]
    assert name == "second"
    assert status["phase"] == "Admitted"


BAD_VALUES = [
    (
        {"ram_mb": -5},
        "spec.ramMB",
        "spec.ramMB: Invalid value: -5: should be greater than or equal to 0",
    ),
    ({"ram_mb": 1 << 31}, "spec.ramMB", "should be less than or equal to 1073741824"),
    ({"ram_mb": 0}, "spec.ramMB", "at least one of spec.ramMB and spec.vramMB must be above 0"),
    (
        {"node": "UPPER"},
        "spec.node",
        'spec.node: Invalid value: "UPPER": a lowercase RFC 1123 subdomain',
    ),
    ({"node": "n" * 254}, "spec.node", "spec.node: Too long: may not be more than 253 characters"),
    ({"name": "Bad_Name"}, "metadata.name", 'metadata.name: Invalid value: "Bad_Name"'),
    ({"wait": "25h"}, "spec.wait", 'spec.wait: Invalid value: "25h": must be at most 24h'),
    (
        {"wait": ".5s"},
        "spec.wait",
        'spec.wait: Invalid value: ".5s": spec.wait in body should match',
    ),
    ({"wait": "soon"}, "spec.wait", "spec.wait in body should match"),
    (
        {"vram_mb": 1024, "gpus": -1},
        "spec.gpus",
        "spec.gpus: Invalid value: -1: should be greater than or equal to 0",
    ),
    ({"vram_mb": 1024, "gpus": 2000}, "spec.gpus", "should be less than or equal to 1024"),
    ({"ttl": "-1h"}, "ttl", "ttl: not a duration"),
    ({"ttl": "0s"}, "ttl", "outside 1ms"),
    ({"description": "x" * 1025}, "spec.description", "may not be more than 1024 characters"),
    ({"owner_pod": "-pod"}, "spec.owner.pod", 'spec.owner.pod: Invalid value: "-pod"'),
    ({"timeout": "never"}, "timeout", "timeout: not a duration"),
]


@pytest.mark.parametrize(
    ("change", "field", "message"),
    BAD_VALUES,
    ids=[b[1] + ":" + str(b[0])[:20] for b in BAD_VALUES],
)
def test_a_bad_value_is_refused_before_anything_is_sent(
    connection: Connection,
    custom: client.CustomObjectsApi,
    namespace: str,
    crds: list[str],
    tmp_path: Path,
    change: dict[str, Any],
    field: str,
    message: str,
) -> None:
    arguments: dict[str, Any] = {"node": "some-node", "ram_mb": 64, **change}
    node = arguments.pop("node")
    with pytest.raises(InvalidClaimError) as refused:
        claim(node, connection=connection, **arguments)  # refused here, before `with`
    assert refused.value.field == field
    assert message in str(refused.value)
    assert phases(custom, namespace) == {}


def test_a_claim_deleted_or_replaced_is_lost_and_a_namesake_is_never_touched(
    claim_node: str, connection: Connection, custom: client.CustomObjectsApi, namespace: str
) -> None:
    told: list[ClaimLostError] = []
    with claim(claim_node, ram_mb=1024, connection=connection, on_lost=told.append) as held:
        rsv.delete(custom, namespace, held.name)

        def noticed() -> None:
            # The heartbeat thread sets `lost` and then calls on_lost: wait for both.
            assert held.lost is not None
            assert told == [held.lost]

        eventually(noticed)  # by the background heartbeats, a second later
        assert held.lost is not None
        assert (held.lost.reason, held.lost.reference) == ("Deleted", held.reference)
        with pytest.raises(ClaimLostError):
            held.check()

    # Replaced between two heartbeats (none due for a minute): the next one refuses.
    with claim(
        claim_node, ram_mb=1024, name="same", heartbeat_interval=60, connection=connection
    ) as held:
        rsv.delete(custom, namespace, "same")
        namesake = rsv.create(custom, namespace, "same", claim_node, 512)
        with pytest.raises(ClaimLostError) as lost:
            held.heartbeat()
        assert lost.value.reason == "Replaced"
        assert held.lost is lost.value
    obj = rsv.get(custom, namespace, "same")  # the release's uid precondition spared it
    assert obj["metadata"]["uid"] == namesake["metadata"]["uid"]
    assert "headroom.dev/heartbeat" not in (obj["metadata"].get("annotations") or {})


def test_connect_finds_the_cluster_as_kubectl_does(
    control_plane: ControlPlane,
    namespace: str,
    crds: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``$KUBECONFIG`` read at each call (the official client reads it once, at import),
    its current context, and that context's namespace."""
    config = control_plane.write_kubeconfig(
        tmp_path / "team.kubeconfig", "admin-too", ("system:masters",), namespace=namespace
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    found = connect()
    assert found.namespace == namespace
    assert found.api.configuration.host == control_plane.url
    assert (
        found.custom.list_namespaced_custom_object(
            "headroom.dev", "v1alpha1", namespace, "reservations"
        )["items"]
        == []
    )
    assert connect(namespace="elsewhere").namespace == "elsewhere"


def test_a_claim_on_gpu_devices_shows_them_and_the_cuda_devices(
    device_admitter: DeviceAdmitter,
    connection: Connection,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """The devices as the operator writes them in the status (a stand-in writes them)."""
    with claim(
        "gpu-node", vram_mb=2049, gpus=2, heartbeat_interval=60, connection=connection
    ) as held:
        assert rsv.get(custom, namespace, held.name)["spec"]["gpus"] == 2
        assert [(d.id, d.memory_mb) for d in held.devices] == [(UUIDS[0], 1025), (UUIDS[1], 1025)]
        assert held.cuda_visible_devices == ",".join(UUIDS)
        assert "on GPU-aabbccdd… (1025 MiB)" in held.message
    with claim("gpu-node", vram_mb=2048, gpus=0, connection=connection) as spanning:
        assert (spanning.devices, spanning.cuda_visible_devices) == ((), None)
    assert phases(custom, namespace) == {}
    device_admitter.ids = ("gfd-0",)
    with claim("gpu-node", ram_mb=64, vram_mb=1024, connection=connection) as synthetic:
        assert [d.id for d in synthetic.devices] == ["gfd-0"]
        assert synthetic.cuda_visible_devices is None
