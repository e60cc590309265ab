"""Restarts, reclaim, heartbeats and owner pods on the real control plane."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess

Start = Callable[..., OperatorProcess]


def admitted_total(custom: client.CustomObjectsApi, namespace: str) -> int:
    return sum(
        i["spec"]["ramMB"]
        for i in rsv.list_all(custom, namespace)
        if (i.get("status") or {}).get("phase") == "Admitted"
    )


def test_delete_completes_with_the_operator_stopped_and_restart_agrees(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    operator = run_operator()
    rsv.create(custom, namespace, "held", node, 4096)
    assert rsv.wait_for(custom, namespace, "held")["status"]["phase"] == "Admitted"
    operator.kill()

    rsv.delete(custom, namespace, "held")  # no finalizer: gone at once
    assert rsv.list_all(custom, namespace) == []

    run_operator()
    rsv.create(custom, namespace, "after", node, 4096)
    assert rsv.wait_for(custom, namespace, "after")["status"]["phase"] == "Admitted"


def test_restart_with_many_admitted_decides_nothing_twice(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    nodes = [f"n{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    for node in nodes:
        make_node(node, memory="64Gi")  # 64512 MiB each after the reserve
    config = {"limits": {"maxEntriesPerNode": 1000}}
    operator = run_operator(config)
    count = 1000
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda i: rsv.create(custom, namespace, f"r{i:04d}", nodes[i % 4], 256),
                range(count),
            )
        )
    before = {i["metadata"]["name"]: i for i in rsv.wait_all(custom, namespace, count)}
    assert all(i["status"]["phase"] == "Admitted" for i in before.values())
    operator.stop()

    # Fill each node to 256 MiB short of its limit; then one more of 512 must not fit.
    # If the restarted operator admitted anything before its ledger held the 1,000,
    # these would be admitted.
    for node in nodes:
        rsv.create(custom, namespace, f"fill-{node}", node, 64512 - 250 * 256 - 256)
        rsv.create(custom, namespace, f"over-{node}", node, 512)
    run_operator(config)
    for node in nodes:
        assert rsv.wait_for(custom, namespace, f"fill-{node}")["status"]["phase"] == "Admitted"
        assert rsv.wait_for(custom, namespace, f"over-{node}")["status"]["phase"] == "Rejected"
    after = {i["metadata"]["name"]: i for i in rsv.list_all(custom, namespace)}
    for name, obj in before.items():
        assert after[name]["status"] == obj["status"], f"{name} was decided again"


def test_stale_and_expired_reservations_are_reclaimed_then_deleted(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="8Gi")
    run_operator(
        {
            "limits": {"heartbeatStaleWindow": "3s"},
            "sweepPeriod": "1s",
            "reclaimedRetention": "5s",
        }
    )
    soon = (datetime.now(UTC) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    rsv.create(custom, namespace, "expiring", node, 512, expiresAt=soon)
    rsv.create(custom, namespace, "silent", node, 512)
    rsv.create(custom, namespace, "alive", node, 512)
    for name in ("expiring", "silent", "alive"):
        assert rsv.wait_for(custom, namespace, name)["status"]["phase"] == "Admitted"

    # Keep "alive" alive through its annotation until both others are reclaimed:
    # the window is 3 s and the sweep period 1 s, so that must happen within ~5 s.
    started, statuses = time.monotonic(), {}
    while time.monotonic() - started < 8:
        rsv.heartbeat(custom, namespace, "alive")
        statuses = {n: rsv.get(custom, namespace, n)["status"] for n in ("expiring", "silent")}
        if all(s["phase"] == "Reclaimed" for s in statuses.values()):
            break
        time.sleep(0.3)
    assert time.monotonic() - started < 6, "reclaim later than window + sweep period"
    expired, silent = statuses["expiring"], statuses["silent"]
    assert (expired["phase"], expired["reason"]) == ("Reclaimed", "Expired")
    assert (silent["phase"], silent["reason"]) == ("Reclaimed", "HeartbeatStale")
    assert expired["reclaimedAt"]
    assert rsv.get(custom, namespace, "alive")["status"]["phase"] == "Admitted"

    deadline = time.monotonic() + 10
    names: set[str] = set()
    while time.monotonic() < deadline:
        names = {i["metadata"]["name"] for i in rsv.list_all(custom, namespace)}
        if names == {"alive"}:
            break
        time.sleep(0.2)
    assert names == {"alive"}, "reclaimed reservations not deleted after retention"


def test_owner_pod_heartbeats_and_its_deletion_releases(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    run_operator({"limits": {"heartbeatStaleWindow": "3s"}, "sweepPeriod": "1s"})
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "trainer", "labels": {"headroom.dev/owner": "true"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    rsv.create(custom, namespace, "by-pod", node, 4096, owner={"pod": "trainer"})
    assert rsv.wait_for(custom, namespace, "by-pod")["status"]["phase"] == "Admitted"

    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        rsv.heartbeat_pod(core, namespace, "trainer")
        time.sleep(0.5)
    status = rsv.get(custom, namespace, "by-pod")["status"]
    assert status["phase"] == "Admitted", "pod heartbeats did not keep the reservation"
    assert status["lastHeartbeat"] > status["admittedAt"]

    core.delete_namespaced_pod("trainer", namespace, grace_period_seconds=0)
    status = rsv.wait_for(custom, namespace, "by-pod", ("Reclaimed",))["status"]
    assert status["reason"] == "OwnerPodDeleted"
    rsv.create(custom, namespace, "next", node, 4096)
    assert rsv.wait_for(custom, namespace, "next")["status"]["phase"] == "Admitted"
