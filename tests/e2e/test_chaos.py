"""Chaos: the ledger never overcommits and never decides twice, whatever happens.

R1 SIGKILLs the operator every 2–5 s while reservations pour in; R2 stops the
API server and then etcd mid-load. Each ends with the invariants checked from
the API alone (headroom_dev.invariants). Every run prints its seed; replay one
with ``HEADROOM_CHAOS_SEED=<seed>``. ``HEADROOM_CHAOS_SIZE`` sets the number of
reservations (CI default 800; the issue's full size is 5000).
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from headroom_dev import invariants
from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane
from headroom_dev.operator import OperatorProcess

SIZE = int(os.environ.get("HEADROOM_CHAOS_SIZE", "800"))
RESERVE_MB = 1024
CONFIG = {"limits": {"maxEntriesPerNode": 100_000, "systemReserveMB": RESERVE_MB}}


def make_nodes(make_node: Callable[..., Any], rng: random.Random, count: int = 20) -> list[str]:
    """Nodes of random sizes; some so small that they fill up early."""
    names = []
    for i in range(count):
        name = f"chaos-{i:02d}-{uuid.uuid4().hex[:4]}"
        make_node(name, memory=f"{rng.choice([2048, 4096, 8192, 65536])}Mi")
        names.append(name)
    return names


def pour(
    custom: client.CustomObjectsApi,
    namespace: str,
    nodes: list[str],
    rng: random.Random,
    count: int,
) -> None:
    sizes = [
        (f"r{i:05d}", rng.choice(nodes), rng.choice([64, 256, 512, 1024, 3000]))
        for i in range(count)
    ]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda s: rsv.create(custom, namespace, *s), sizes))


def settle(custom: client.CustomObjectsApi, namespace: str, count: int, seed: int) -> None:
    try:
        rsv.wait_all(custom, namespace, count, timeout=180)
    except TimeoutError as error:
        raise AssertionError(f"seed {seed}: not all decided: {error}") from None


def assert_invariants(
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    nodes: list[str],
    history: invariants.History,
    seed: int,
) -> None:
    violations = invariants.after_the_run(custom, core, namespace, RESERVE_MB, nodes, history)
    assert violations == [], f"seed {seed}: {len(violations)} violations: {violations[:10]}"


def test_r1_operator_sigkilled_every_few_seconds(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    seed: int,
    history: invariants.History,
) -> None:
    rng = random.Random(seed)
    nodes = make_nodes(make_node, rng)
    operator = run_operator(CONFIG)
    done, kills = threading.Event(), []

    def killer() -> None:
        while not done.wait(rng.uniform(2, 5)):
            operator.kill()
            kills.append(time.monotonic())
            operator.start(wait_ready=False)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    pour(custom, namespace, nodes, rng, SIZE)
    while len(kills) < max(3, SIZE // 500):  # more kills, also after the last create
        time.sleep(0.5)
    done.set()
    thread.join()
    operator.wait_ready()
    settle(custom, namespace, SIZE, seed)
    print(f"R1: {SIZE} reservations, {len(kills)} kills survived")
    assert kills, "the operator was never killed"
    assert_invariants(custom, core, namespace, nodes, history, seed)


def test_r2_api_server_then_etcd_restarted_mid_load(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    seed: int,
    history: invariants.History,
    control_plane: ControlPlane,
) -> None:
    rng = random.Random(seed)
    nodes = make_nodes(make_node, rng)
    operator = run_operator(CONFIG)
    assert operator.popen is not None
    pid = operator.popen.pid
    half = SIZE // 2
    pour(custom, namespace, nodes, rng, half)

    control_plane.stop_apiserver()
    time.sleep(3)
    control_plane.start_apiserver()
    pour_more = threading.Thread(
        target=lambda: _pour_range(custom, namespace, nodes, rng, half, SIZE), daemon=True
    )
    pour_more.start()
    time.sleep(1)
    control_plane.stop_etcd()
    time.sleep(3)
    control_plane.start_etcd()
    pour_more.join(timeout=120)

    created = len(rsv.list_all(custom, namespace))
    settle(custom, namespace, created, seed)
    print(f"R2: {created} reservations across an API server and an etcd restart")
    assert operator.popen is not None
    assert operator.popen.pid == pid, "the operator restarted instead of reconnecting"
    assert operator.ready()
    assert_invariants(custom, core, namespace, nodes, history, seed)


def _pour_range(
    custom: client.CustomObjectsApi,
    namespace: str,
    nodes: list[str],
    rng: random.Random,
    start: int,
    stop: int,
) -> None:
    """Create reservations, retrying while the API server is away."""
    for i in range(start, stop):
        body = (f"r{i:05d}", rng.choice(nodes), rng.choice([64, 256, 512, 1024, 3000]))
        for _ in range(100):
            try:
                rsv.create(custom, namespace, *body)
                break
            except client.ApiException as error:
                if error.status == 409:
                    break
                time.sleep(0.2)
            except Exception:  # connection refused while the API server restarts
                time.sleep(0.2)


def test_r5_leader_killed_under_load_standby_takes_over(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    seed: int,
    history: invariants.History,
) -> None:
    rng = random.Random(seed)
    nodes = make_nodes(make_node, rng)
    lease_duration = 4.0
    config = {
        **CONFIG,
        "leaderElection": {
            "enabled": True,
            "leaseName": f"headroom-{namespace}",
            "namespace": namespace,
            "leaseDuration": f"{lease_duration}s",
            "renewDeadline": "3s",
            "retryPeriod": "0.5s",
        },
    }
    leader = run_operator(config)
    leader.wait_ready(timeout=30, body="ok")  # first to take the Lease, then rebuilt
    standby = run_operator(config)
    assert standby.get("/readyz") == (200, "standby")

    half = SIZE // 2
    pour(custom, namespace, nodes, rng, half)
    leader.kill()
    killed = time.monotonic()
    rsv.create(custom, namespace, "after-kill", nodes[0], 1)
    rest = threading.Thread(
        target=lambda: _pour_range(custom, namespace, nodes, rng, half, SIZE), daemon=True
    )
    rest.start()
    rsv.wait_for(custom, namespace, "after-kill", timeout=30)
    takeover = time.monotonic() - killed
    rest.join(timeout=120)
    settle(custom, namespace, SIZE + 1, seed)
    print(f"R5: takeover {takeover:.2f}s (lease {lease_duration}s), {SIZE + 1} reservations")
    assert standby.get("/readyz") == (200, "ok")
    assert takeover <= lease_duration + 2, f"seed {seed}: takeover took {takeover:.2f}s"
    assert_invariants(custom, core, namespace, nodes, history, seed)
