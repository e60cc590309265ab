"""The operator's /metrics on the real control plane: counters across a restart, the
node's RAM limit under an over-commitment, which replica decides, and what the client
and the watches report (API errors, watch restarts).

A restart must not make the counters jump: the new process holds every admitted
reservation again, and that is counted as restored, not as reserved. Prometheus
takes a counter that starts again at 0 as a reset; one that starts at the sum of
everything held would read as that much reserved in one scrape.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
from kubernetes import client

from headroom.api.paths import NODES, node_path
from headroom.kube.client import Credentials, KubeClient
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport
from headroom.kube.watch import follow
from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane, free_port
from headroom_dev.nodes import set_node_memory
from headroom_dev.operator import OperatorProcess
from tests.polling import eventually

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


class ShortWatches:
    """The operator's client, its watches ended by the server after a second (as the
    server ends them at the timeout asked for, 270 s in production)."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    def watch(
        self, path: str, *, resource_version: str, label_selector: str | None = None
    ) -> AsyncIterator[JSON]:
        return self.kube.watch(path, resource_version=resource_version, timeout_seconds=1)


async def test_the_client_reports_failed_requests_and_the_watch_its_restarts(
    control_plane: ControlPlane,
) -> None:
    errors: list[tuple[str, str]] = []
    kube = KubeClient(control_plane.admin_credentials(), on_error=lambda *e: errors.append(e))
    try:
        with pytest.raises(ApiError):
            await kube.get(node_path(f"none-{uuid.uuid4().hex[:6]}"))
        _, version = await kube.list_all(NODES)
        restarts: list[str] = []
        twice = asyncio.Event()

        def restarted(reason: str) -> None:
            restarts.append(reason)
            if len(restarts) == 2:
                twice.set()

        async def relist() -> str:
            return (await kube.list_all(NODES))[1]

        follower = asyncio.create_task(
            follow(
                cast(Transport, ShortWatches(kube)),
                NODES,
                version,
                lambda kind, obj: None,
                relist,
                restarted=restarted,
            )
        )
        try:
            await asyncio.wait_for(twice.wait(), timeout=20)
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        assert restarts[:2] == ["ended", "ended"]
    finally:
        await kube.close()
    assert errors == [("get", "404")]  # the watches ended cleanly: no error

    unreachable = Credentials(server=f"http://127.0.0.1:{free_port()}")
    nobody = KubeClient(unreachable, on_error=lambda *e: errors.append(e))
    try:
        with pytest.raises(ApiUnavailableError):
            await nobody.list_page(NODES)
    finally:
        await nobody.close()
    assert errors[1:] == [("list", "connection")]
