"""Chaos with queues: bursts of releases under StrictFIFO while the leader dies.

Ten full nodes, fifteen waiters each (created concurrently, so creation times
tie), then every holder released in one burst while the leader is SIGKILLed and
a new replica joins; then half of what was admitted is released in a second
burst, and the new leader is killed too. At the end, from the API alone: no node
over its limit, no reservation decided twice, NodeHeadroom equals a recount, and
strict FIFO held (no waiter admitted ahead of an older one, no head that fits
left waiting). ``HEADROOM_CHAOS_SEED`` replays a run.
"""

from __future__ import annotations

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
from headroom_dev.operator import OperatorProcess

RESERVE_MB = 1024
NODES, HOLDERS, WAITERS = 10, 4, 15  # a node's limit is 4 holders of 1024 MiB
SIZES = [256, 512, 1024, 2048, 3000]


def in_parallel(work: Callable[[Any], Any], items: list[Any]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(work, items))


def phases(custom: client.CustomObjectsApi, namespace: str) -> dict[str, str | None]:
    return {
        o["metadata"]["name"]: (o.get("status") or {}).get("phase")
        for o in rsv.list_all(custom, namespace)
    }


def kill_soon(operator: OperatorProcess, delay: float) -> threading.Thread:
    killer = threading.Thread(target=lambda: (time.sleep(delay), operator.kill()), daemon=True)
    killer.start()
    return killer


def leader_of(replicas: list[OperatorProcess], timeout: float = 30) -> OperatorProcess:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for replica in replicas:
            if replica.ready(body="ok"):
                return replica
        time.sleep(0.2)
    raise AssertionError("no replica took the Lease")


def still(
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    nodes: list[str],
    seed: int,
) -> list[str]:
    """Wait until the queues stop moving and strict FIFO holds (or time runs out)."""
    deadline = time.monotonic() + 60
    found = ["never looked"]
    while time.monotonic() < deadline:
        found = invariants.strict_fifo(custom, core, namespace, RESERVE_MB, nodes)
        if not found:
            return []
        time.sleep(0.5)
    return [f"seed {seed}: {line}" for line in found]


def test_r6_queues_drain_in_strict_order_through_bursts_and_failovers(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    seed: int,
    history: invariants.History,
) -> None:
    rng = random.Random(seed)
    config = {
        "limits": {"maxEntriesPerNode": 100_000, "systemReserveMB": RESERVE_MB},
        "queueing": {"strategy": "StrictFIFO"},
        "sweepPeriod": "200ms",
        "summaryInterval": "200ms",
        "leaderElection": {
            "enabled": True,
            "leaseName": f"headroom-{namespace}",
            "namespace": namespace,
            "leaseDuration": "4s",
            "renewDeadline": "3s",
            "retryPeriod": "0.5s",
        },
    }
    nodes = [f"fifo-{i:02d}-{uuid.uuid4().hex[:4]}" for i in range(NODES)]
    for node in nodes:
        make_node(node, memory=f"{(HOLDERS + 1) * 1024}Mi")
    replicas = [run_operator(config)]
    replicas[0].wait_ready(timeout=30, body="ok")
    replicas.append(run_operator(config))

    holders = [(f"hold-{n}-{i}", n) for n in nodes for i in range(HOLDERS)]
    in_parallel(lambda h: rsv.create(custom, namespace, h[0], h[1], 1024), holders)
    rsv.wait_all(custom, namespace, len(holders), timeout=60, phases=("Admitted",))
    waiters = [(f"w-{n}-{i:02d}", n, rng.choice(SIZES)) for n in nodes for i in range(WAITERS)]
    rng.shuffle(waiters)
    in_parallel(lambda w: rsv.create(custom, namespace, *w, wait="10m"), waiters)
    total = len(holders) + len(waiters)
    rsv.wait_all(custom, namespace, total, timeout=60, phases=("Admitted", "Queued"))
    now = phases(custom, namespace)
    assert all(now[w[0]] == "Queued" for w in waiters), "the nodes are full: every waiter waits"

    # Burst 1: every holder released while the leader dies and a new replica joins.
    killer = kill_soon(leader_of(replicas), rng.uniform(0, 1.0))
    in_parallel(lambda h: rsv.delete(custom, namespace, h[0]), holders)
    killer.join()
    replicas.append(run_operator(config, wait_ready=False))
    assert (found := still(custom, core, namespace, nodes, seed)) == [], found

    # Burst 2: half of the admitted waiters released; the new leader dies too.
    admitted = [n for n, p in phases(custom, namespace).items() if p == "Admitted"]
    released = rng.sample(admitted, len(admitted) // 2)
    killer = kill_soon(leader_of(replicas), rng.uniform(0, 1.0))
    in_parallel(lambda name: rsv.delete(custom, namespace, name), released)
    killer.join()
    assert (found := still(custom, core, namespace, nodes, seed)) == [], found

    violations = invariants.after_the_run(custom, core, namespace, RESERVE_MB, nodes, history)
    left = phases(custom, namespace)
    print(
        f"R6: {sum(p == 'Admitted' for p in left.values())} admitted, "
        f"{sum(p == 'Queued' for p in left.values())} still queued after two bursts"
    )
    assert violations == [], f"seed {seed}: {len(violations)} violations: {violations[:10]}"
