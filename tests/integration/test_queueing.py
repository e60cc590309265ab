"""Waiting for room (issue 13, item 1), on the real control plane.

A reservation with ``spec.wait`` that does not fit is Queued instead of
Rejected, holds nothing, and is admitted in creation order as soon as it fits
(a release, a reclaim, a node that grows), or Rejected WaitTimeout when its wait
runs out; the queue survives a restart.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from headroom_dev import invariants
from headroom_dev import reservations as rsv
from headroom_dev.nodes import set_node_memory
from headroom_dev.operator import OperatorProcess
from tests.integration.cli_checks import Cli
from tests.polling import eventually

Start = Callable[..., OperatorProcess]
QUEUED = ("Queued",)


def queued(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    return dict(rsv.wait_for(custom, namespace, name, QUEUED)["status"])


def phase_of(custom: client.CustomObjectsApi, namespace: str, name: str) -> str | None:
    return (rsv.get(custom, namespace, name).get("status") or {}).get("phase")


def _exists(custom: client.CustomObjectsApi, namespace: str, name: str) -> None:
    assert any(o["metadata"]["name"] == name for o in rsv.list_all(custom, namespace)), name


def soon(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_queued_then_admitted_on_release_reclaim_and_growth(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"q-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    run_operator({"sweepPeriod": "200ms"})
    rsv.create(custom, namespace, "holder", node, 4096)
    assert rsv.wait_for(custom, namespace, "holder")["status"]["phase"] == "Admitted"

    # On release.
    rsv.create(custom, namespace, "after-release", node, 4096, wait="2m")
    status = queued(custom, namespace, "after-release")
    assert (status["reason"], status["queuePosition"]) == ("InsufficientRAM", 1), status
    assert "allocatable 0 MiB" in status["message"]
    rsv.delete(custom, namespace, "holder")
    assert rsv.wait_for(custom, namespace, "after-release")["status"]["phase"] == "Admitted"

    # On reclaim (the holder expires).
    rsv.delete(custom, namespace, "after-release")
    rsv.create(custom, namespace, "expiring", node, 4096, expiresAt=soon(3))
    assert rsv.wait_for(custom, namespace, "expiring")["status"]["phase"] == "Admitted"
    rsv.create(custom, namespace, "after-reclaim", node, 4096, wait="2m")
    queued(custom, namespace, "after-reclaim")
    assert rsv.wait_for(custom, namespace, "after-reclaim", timeout=15)["status"]["phase"] == (
        "Admitted"
    )
    assert phase_of(custom, namespace, "expiring") == "Reclaimed"

    # On node growth.
    rsv.create(custom, namespace, "after-growth", node, 2048, wait="2m")
    queued(custom, namespace, "after-growth")
    set_node_memory(core, node, "7Gi")  # limit 6144
    assert rsv.wait_for(custom, namespace, "after-growth")["status"]["phase"] == "Admitted"
    assert invariants.check(custom, core, namespace, 1024, [node]) == []


def test_a_wait_runs_out_and_deleting_a_queued_one_moves_the_queue(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"q-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    run_operator({"sweepPeriod": "200ms", "summaryInterval": "100ms"})
    rsv.create(custom, namespace, "holder", node, 4096)
    rsv.wait_for(custom, namespace, "holder")
    rsv.create(custom, namespace, "short", node, 1024, wait="3s")
    rsv.create(custom, namespace, "first", node, 1024, wait="2m")
    rsv.create(custom, namespace, "second", node, 1024, wait="2m")
    for name in ("short", "first", "second"):
        queued(custom, namespace, name)
    timed_out = rsv.wait_for(custom, namespace, "short", ("Rejected",), timeout=10)["status"]
    assert timed_out["reason"] == "WaitTimeout", timed_out
    rsv.delete(custom, namespace, "first")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if queued(custom, namespace, "second").get("queuePosition") == 1:
            break
        time.sleep(0.1)
    assert queued(custom, namespace, "second")["queuePosition"] == 1
    rsv.heartbeat(custom, namespace, "second")  # accepted, changes nothing
    time.sleep(0.5)
    assert phase_of(custom, namespace, "second") == "Queued"


def test_strict_fifo_the_head_blocks_best_effort_lets_small_ones_by(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    strict, best = f"strict-{uuid.uuid4().hex[:4]}", f"best-{uuid.uuid4().hex[:4]}"
    for node in (strict, best):
        make_node(node, memory="5Gi")  # limit 4096
    operator = run_operator({"queueing": {"strategy": "StrictFIFO"}})
    for node in (strict, best):
        rsv.create(custom, namespace, f"hold-{node}", node, 3072)
        rsv.wait_for(custom, namespace, f"hold-{node}")

    rsv.create(custom, namespace, f"big-{strict}", strict, 4096, wait="2m")
    queued(custom, namespace, f"big-{strict}")
    for i in range(3):  # 512 each would fit the 1024 left, but the big one is ahead
        rsv.create(custom, namespace, f"small-{strict}-{i}", strict, 512, wait="2m")
        assert queued(custom, namespace, f"small-{strict}-{i}")["reason"] == "WaitersAhead"
    rsv.create(custom, namespace, f"nowait-{strict}", strict, 512)  # no wait: refused
    assert rsv.wait_for(custom, namespace, f"nowait-{strict}")["status"]["reason"] == (
        "WaitersAhead"
    )
    rsv.delete(custom, namespace, f"hold-{strict}")
    assert rsv.wait_for(custom, namespace, f"big-{strict}")["status"]["phase"] == "Admitted"
    for i in range(3):  # the big one took all but nothing of what is left
        assert phase_of(custom, namespace, f"small-{strict}-{i}") == "Queued"
    operator.stop()

    run_operator({"queueing": {"strategy": "BestEffortFIFO"}})
    rsv.create(custom, namespace, f"big-{best}", best, 4096, wait="2m")
    queued(custom, namespace, f"big-{best}")
    rsv.create(custom, namespace, f"small-{best}", best, 512, wait="2m")
    assert rsv.wait_for(custom, namespace, f"small-{best}")["status"]["phase"] == "Admitted"
    assert phase_of(custom, namespace, f"big-{best}") == "Queued"


def test_a_queue_survives_a_restart_and_empties_in_order(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    nodes = [f"q{i}-{uuid.uuid4().hex[:4]}" for i in range(3)]
    for node in nodes:
        make_node(node, memory="5Gi")  # limit 4096
    config = {"queueing": {"strategy": "StrictFIFO"}, "sweepPeriod": "200ms"}
    operator = run_operator(config)
    for node in nodes:
        rsv.create(custom, namespace, f"hold-{node}", node, 4096)
        for i in range(4):
            rsv.create(custom, namespace, f"w{i}-{node}", node, 1024, wait="5m")
    for node in nodes:
        for i in range(4):
            queued(custom, namespace, f"w{i}-{node}")
    operator.kill()
    # Creation order is creationTimestamp (whole seconds), then name: "late-…" would
    # sort before "w…" within the same second, so it is created in a later one.
    newest = max(o["metadata"]["creationTimestamp"] for o in rsv.list_all(custom, namespace))
    next_second = datetime.strptime(newest, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    while datetime.now(UTC) < next_second + timedelta(seconds=1):
        time.sleep(0.05)
    for node in nodes:  # room for all four, while the operator is down; one more waits
        rsv.delete(custom, namespace, f"hold-{node}")
        rsv.create(custom, namespace, f"late-{node}", node, 1024, wait="5m")
    run_operator(config)
    for node in nodes:
        for i in range(4):
            assert rsv.wait_for(custom, namespace, f"w{i}-{node}", ("Admitted",))
        assert queued(custom, namespace, f"late-{node}")["queuePosition"] == 1
    assert invariants.check(custom, core, namespace, 1024, nodes) == []


def test_a_node_headroom_carries_its_nodes_labels(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
) -> None:
    """So that placement code that may not read Nodes can still select NodeHeadrooms."""
    node = f"l-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi", labels={"gpu": "a100", "zone": "z1"})
    run_operator({"summaryInterval": "100ms"})
    deadline = time.monotonic() + 15
    labels: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            headroom = custom.get_cluster_custom_object(
                "headroom.dev", "v1alpha1", "nodeheadrooms", node
            )
            labels = headroom["metadata"].get("labels") or {}
        except client.ApiException:
            labels = {}
        if labels.get("gpu") == "a100":
            break
        time.sleep(0.1)
    assert labels == {"gpu": "a100", "zone": "z1"}
    core.patch_node(node, {"metadata": {"labels": {"zone": None, "tier": "spot"}}})
    while time.monotonic() < deadline + 15:
        headroom = custom.get_cluster_custom_object(
            "headroom.dev", "v1alpha1", "nodeheadrooms", node
        )
        labels = headroom["metadata"].get("labels") or {}
        if "zone" not in labels:
            break
        time.sleep(0.1)
    assert labels == {"gpu": "a100", "tier": "spot"}
    selected = custom.list_cluster_custom_object(
        "headroom.dev", "v1alpha1", "nodeheadrooms", label_selector="gpu=a100,tier=spot"
    )
    assert [i["metadata"]["name"] for i in selected["items"]] == [node]


def test_a_queued_one_whose_node_goes_away_waits_until_its_wait_runs_out(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"q-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    run_operator({"sweepPeriod": "200ms"})
    rsv.create(custom, namespace, "holder", node, 4096)
    rsv.wait_for(custom, namespace, "holder")
    rsv.create(custom, namespace, "waiter", node, 1024, wait="6s")
    queued(custom, namespace, "waiter")
    core.delete_node(node)
    rsv.delete(custom, namespace, "holder")  # room, but on a node that is gone
    time.sleep(2)
    assert phase_of(custom, namespace, "waiter") == "Queued"
    over = rsv.wait_for(custom, namespace, "waiter", ("Rejected",), timeout=15)["status"]
    assert over["reason"] == "WaitTimeout", over
    assert f"node {node}: capacity unknown" in over["message"], over


def test_reserve_waits_through_the_queue_with_wait_for_room(
    run_operator: Start,
    make_node: Callable[..., Any],
    cli: Cli,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"q-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    run_operator()
    rsv.create(custom, namespace, "holder", node, 4096)
    rsv.wait_for(custom, namespace, "holder")
    argv = ["reserve", "--node", node, "--ram", "1024", "--name", "patient"]
    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(cli, *argv, "--wait-for-room", "2m", "--wait", "-o", "json")
        eventually(lambda: _exists(custom, namespace, "patient"))  # the CLI is starting
        assert queued(custom, namespace, "patient")["queuePosition"] == 1
        assert rsv.get(custom, namespace, "patient")["spec"]["wait"] == "2m"
        time.sleep(1)  # still waiting: Queued is not a decision
        assert not result.done()
        rsv.delete(custom, namespace, "holder")
        done = result.result(timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"phase": "Admitted"' in done.stdout
