"""``--node auto`` (and ``claim(AUTO)``): the best node by ``fit``'s order and, when it
filled up between reading the figures and the claim, the next one — at most three,
each attempt a new reservation, the refused ones deleted.

Two ways to put a node's filling-up between the reading and the claim, for real:
in-process, the library's read of the NodeHeadrooms is wrapped so that the node
fills up right after it; for the command line (another process), the operator
runs with a ``summaryInterval`` of an hour, so that the NodeHeadrooms keep the
figures written before the nodes filled up, as figures at most one interval old
may be.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from headroom.client import AUTO, Connection, claim, placement
from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.integration.cli_checks import Cli, Hold, assert_one_line_error, run
from tests.polling import eventually

NODEHEADROOMS = ("headroom.dev", "v1alpha1", "nodeheadrooms")


def publish(custom: client.CustomObjectsApi, node: Any, limit_mb: int) -> None:
    """A NodeHeadroom as the operator writes it for an empty ``node`` with ``limit_mb`` to
    give (owned by that Node and carrying its labels, as the operator's are)."""
    name, uid = node.metadata.name, node.metadata.uid
    owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}
    metadata = {"name": name, "ownerReferences": [owner], "labels": node.metadata.labels or {}}
    custom.create_cluster_custom_object(
        *NODEHEADROOMS,
        {"apiVersion": "headroom.dev/v1alpha1", "kind": "NodeHeadroom", "metadata": metadata},
    )
    status = {
        "capacityKnown": True,
        "totalRAMMB": limit_mb + 1024,
        "systemReserveMB": 1024,
        "maxOvercommitRatio": "1",
        "limitRAMMB": limit_mb,
        "reservedRAMMB": 0,
        "allocatableRAMMB": limit_mb,
        "reservedVRAMMB": 0,
        "activeEntries": 0,
        "staleEntries": 0,
        "maxEntries": 110,
        "utilizationPercent": 0,
        "overCommitted": False,
    }
    custom.patch_cluster_custom_object_status(*NODEHEADROOMS, name, {"status": status})


def fill(custom: client.CustomObjectsApi, namespace: str, node: str, ram_mb: int) -> str:
    name = f"fill-{node}"
    rsv.create(custom, namespace, name, node, ram_mb)
    assert rsv.wait_for(custom, namespace, name)["status"]["phase"] == "Admitted"
    return name


def on_nodes(custom: client.CustomObjectsApi, namespace: str) -> dict[str, str]:
    return {r["metadata"]["name"]: r["spec"]["node"] for r in rsv.list_all(custom, namespace)}


@pytest.fixture
def stale_figures(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
) -> Any:
    """Nodes a1 (32768 MiB to give), a2 (24576), a3 (20480), b (16384), labelled
    ``auto-test=<prefix>``, whose NodeHeadrooms say they are empty, whatever happens."""
    prefix = f"auto-{uuid.uuid4().hex[:5]}"
    sizes = {"a1": 32768, "a2": 24576, "a3": 20480, "b": 16384}
    nodes = {
        short: make_node(
            f"{prefix}-{short}", memory=f"{limit + 1024}Mi", labels={"auto-test": prefix}
        )
        for short, limit in sizes.items()
    }
    run_operator({"summaryInterval": "1h"})  # the operator writes no NodeHeadroom meanwhile
    for short, limit in sizes.items():
        publish(custom, nodes[short], limit)
    yield prefix
    for short in sizes:
        custom.delete_cluster_custom_object(*NODEHEADROOMS, f"{prefix}-{short}")


def test_reserve_and_hold_try_the_next_node_when_the_best_filled_up(
    cli: Cli,
    hold: Hold,
    stale_figures: str,
    custom: client.CustomObjectsApi,
    namespace: str,
    tmp_path: Path,
) -> None:
    p, selector = stale_figures, f"auto-test={stale_figures}"
    fill(custom, namespace, f"{p}-a1", 32768 - 4096)
    fill(custom, namespace, f"{p}-a2", 24576 - 4096)
    fitting = cli("fit", "--ram", "8192", "-l", selector)
    assert [line.split()[0] for line in fitting.stdout.splitlines()[1:]] == [
        f"{p}-a1", f"{p}-a2", f"{p}-a3", f"{p}-b",
    ]  # fmt: skip

    reserved = cli(
        "reserve", "--node", "auto", "--ram", "8192", "-l", selector, "--name", "auto-1", "--wait"
    )
    assert reserved.returncode == 0, reserved.stderr
    assert f"reservation.headroom.dev/auto-1 admitted: node {p}-a3:" in reserved.stdout
    refusals = reserved.stderr.splitlines()
    assert len(refusals) == 2, reserved.stderr
    assert refusals[0].startswith(
        f"node {p}-a1 refused reservation {namespace}/auto-1 (InsufficientRAM"
    )
    assert refusals[0].endswith(f"deleted it, trying node {p}-a2")
    assert refusals[1].endswith(f"deleted it, trying node {p}-a3")
    assert on_nodes(custom, namespace)["auto-1"] == f"{p}-a3"

    fill(custom, namespace, f"{p}-a3", 20480 - 8192)  # a3 is full now too; b is not
    marker = tmp_path / "ran"
    refused = run(
        hold("--node", "auto", "--ram", "8192", "-l", selector, command=["touch", str(marker)])
    )
    assert refused.returncode == 1, refused.stderr
    *reports, error = refused.stderr.splitlines()
    assert reports[0].startswith(f"hold: node {p}-a1 chosen")
    assert [r.split("(")[0] for r in reports[1:]] == [
        f"hold: node {p}-a1 refused it ",
        f"hold: node {p}-a2 refused it ",
    ]
    assert f"on node {p}-a3: Rejected (InsufficientRAM)" in error  # three nodes, then no more
    assert error.endswith("the command was not run")
    assert not marker.exists()
    assert set(on_nodes(custom, namespace)) == {
        f"fill-{p}-a1",
        f"fill-{p}-a2",
        f"fill-{p}-a3",
        "auto-1",
    }

    rsv.delete(custom, namespace, "auto-1")
    command = [sys.executable, "-c", "import os; print(os.environ['HEADROOM_RESERVATION'])"]
    held = run(
        hold("--node", "auto", "--ram", "8192", "-l", selector, "--name", "auto-2", command=command)
    )
    assert held.returncode == 0, held.stderr
    assert held.stdout.strip() == f"{namespace}/auto-2"
    assert f"hold: holding {namespace}/auto-2 on node {p}-a3" in held.stderr


def test_a_node_auto_without_any_room_is_refused_before_anything_is_created(
    cli: Cli, stale_figures: str, custom: client.CustomObjectsApi, namespace: str
) -> None:
    result = cli("reserve", "--node", "auto", "--ram", "40000", "-l", f"auto-test={stale_figures}")
    assert result.returncode == 1
    assert_one_line_error(
        result, f"no node matching 'auto-test={stale_figures}' has room for 40000 MiB RAM now"
    )
    assert rsv.list_all(custom, namespace) == []


def test_the_library_places_on_the_next_node_when_the_best_fills_up_after_reading(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    connection: Connection,
    custom: client.CustomObjectsApi,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = f"lib-{uuid.uuid4().hex[:5]}"
    make_node(f"{p}-c1", memory="33Gi", labels={"auto-test": p})
    make_node(f"{p}-c2", memory="17Gi", labels={"auto-test": p})
    run_operator()

    def published() -> None:
        rooms = placement.nodes_with_room(8192, selector=f"auto-test={p}", connection=connection)
        assert [room.node for room in rooms] == [f"{p}-c1", f"{p}-c2"]

    eventually(published)
    read = placement.read

    def read_then_fill(*args: Any) -> list[placement.NodeRoom]:
        rooms = read(*args)
        fill(custom, namespace, f"{p}-c1", 32768 - 4096)  # between the reading and the claim
        return rooms

    monkeypatch.setattr(placement, "read", read_then_fill)
    lines: list[str] = []
    with claim(
        AUTO, ram_mb=8192, selector=f"auto-test={p}", connection=connection, report=lines.append
    ) as held:
        assert held.node == f"{p}-c2"
        assert [(r.node, r.reason) for r in held.refused_by] == [(f"{p}-c1", "InsufficientRAM")]
        assert on_nodes(custom, namespace) == {f"fill-{p}-c1": f"{p}-c1", held.name: f"{p}-c2"}
    assert lines[0].startswith(f"node {p}-c1 chosen (most allocatable RAM first")
    assert lines[1].startswith(f"node {p}-c1 refused it (InsufficientRAM: ")
    assert lines[1].endswith(f"trying node {p}-c2")
    assert on_nodes(custom, namespace) == {f"fill-{p}-c1": f"{p}-c1"}
