"""The operator's /metrics on the real control plane: counters across a restart, the
node's RAM limit under an over-commitment, and which replica decides.

A restart must not make the counters jump: the new process holds every admitted
reservation again, and that is counted as restored, not as reserved. Prometheus
takes a counter that starts again at 0 as a reset; one that starts at the sum of
everything held would read as that much reserved in one scrape.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.nodes import set_node_memory
from headroom_dev.operator import OperatorProcess
from tests.integration.polling import eventually

Start = Callable[..., OperatorProcess]
MIB = 1 << 20


def admitted(custom: client.CustomObjectsApi, namespace: str, name: str) -> None:
    assert rsv.wait_for(custom, namespace, name)["status"]["phase"] == "Admitted"


def test_a_restart_over_held_reservations_counts_only_what_it_admits(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"m-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    first = run_operator()
    rsv.create(custom, namespace, "a", node, 1024)
    rsv.create(custom, namespace, "b", node, 2048)
    for name in ("a", "b"):
        admitted(custom, namespace, name)

    def counted_by_the_first() -> None:
        m = first.metrics()
        assert m["headroom_reserved_bytes_total"] == 3072 * MIB
        assert m["headroom_reserved_mb_total"] == 3072  # deprecated, kept one release
        assert m["headroom_restored_bytes_total"] == 0

    eventually(counted_by_the_first)
    first.kill()  # a crash: nothing is handed over but what the API holds

    second = run_operator()
    m = second.metrics()  # ready: the ledger is rebuilt
    assert m["headroom_reserved_bytes_total"] == 0
    assert m["headroom_reserved_mb_total"] == 0
    assert m["headroom_restored_bytes_total"] == 3072 * MIB
    assert m[f'headroom_node_reserved_ram_bytes{{node="{node}"}}'] == 3072 * MIB
    assert m["headroom_active_entries"] == 2
    assert m["headroom_leader"] == 1  # leader election off: the ready replica decides

    rsv.create(custom, namespace, "c", node, 512)
    admitted(custom, namespace, "c")
    rsv.delete(custom, namespace, "a")  # restored, then released: counted once, here

    def counted_by_the_second() -> None:
        m = second.metrics()
        assert m["headroom_reserved_bytes_total"] == 512 * MIB
        assert m["headroom_released_bytes_total"] == 1024 * MIB
        assert m["headroom_reclaimed_bytes_total"] == 0
        assert m["headroom_restored_bytes_total"] == 3072 * MIB
        assert m[f'headroom_node_reserved_ram_bytes{{node="{node}"}}'] == 2560 * MIB
        assert m["headroom_undecided_reservations"] == 0

    eventually(counted_by_the_second)


def test_an_over_committed_node_reads_reserved_above_its_limit(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"m-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    operator = run_operator()
    rsv.create(custom, namespace, "held", node, 3072)
    admitted(custom, namespace, "held")
    set_node_memory(core, node, "3Gi")  # limit 2048 now, under what it holds
    labels = f'{{node="{node}"}}'

    def over_committed() -> None:
        m = operator.metrics()
        assert m[f"headroom_node_ram_limit_bytes{labels}"] == 2048 * MIB
        assert m[f"headroom_node_reserved_ram_bytes{labels}"] == 3072 * MIB
        assert m[f"headroom_node_allocatable_ram_bytes{labels}"] == 0  # stops at 0
        assert m[f"headroom_node_total_ram_bytes{labels}"] == 3072 * MIB

    eventually(over_committed)


def test_one_replica_decides_and_a_standby_takes_over_with_its_counters_at_zero(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"m-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")
    election = {
        "enabled": True,
        "namespace": namespace,
        "leaseName": f"lease-{node}",
        "leaseDuration": "4s",
        "renewDeadline": "3s",
        "retryPeriod": "1s",
    }
    leader = run_operator({"leaderElection": election}, wait_ready=False)
    leader.wait_ready(body="ok")
    standby = run_operator({"leaderElection": election}, wait_ready=False)
    standby.wait_ready(body="standby")
    rsv.create(custom, namespace, "held", node, 1024)
    admitted(custom, namespace, "held")
    assert leader.metrics()["headroom_leader"] == 1
    waiting = standby.metrics()
    assert waiting["headroom_leader"] == 0
    assert "headroom_reserved_bytes_total" not in waiting  # no ledger on a standby
    info = [value for key, value in waiting.items() if key.startswith("headroom_build_info{")]
    assert info == [1]

    leader.kill()
    standby.wait_ready(timeout=30, body="ok")
    m = standby.metrics()
    assert m["headroom_leader"] == 1
    assert m["headroom_reserved_bytes_total"] == 0
    assert m["headroom_restored_bytes_total"] == 1024 * MIB
