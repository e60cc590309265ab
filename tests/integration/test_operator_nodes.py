"""Node capacity, per-node overrides, NodeHeadroom summaries and metrics."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.nodes import set_node_memory
from headroom_dev.operator import OperatorProcess
from tests import polling

Start = Callable[..., OperatorProcess]


def headroom(custom: client.CustomObjectsApi, node: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom.get_cluster_custom_object(
        "headroom.dev", "v1alpha1", "nodeheadrooms", node
    )
    return obj.get("status") or {}


def eventually(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """A NodeHeadroom not written yet reads as a KeyError or a 404: not yet, either."""
    return polling.eventually(
        check, timeout, every=0.1, retry_on=(AssertionError, KeyError, client.ApiException)
    )


def test_node_resize_and_removal(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    run_operator()
    rsv.create(custom, namespace, "a", node, 4096)
    assert rsv.wait_for(custom, namespace, "a")["status"]["phase"] == "Admitted"

    set_node_memory(core, node, "9Gi")  # limit 8192

    def grown() -> None:
        assert headroom(custom, node)["allocatableRAMMB"] == 4096

    eventually(grown)
    rsv.create(custom, namespace, "b", node, 4096)
    assert rsv.wait_for(custom, namespace, "b")["status"]["phase"] == "Admitted"

    set_node_memory(core, node, "4Gi")  # shrinks below what is reserved: no eviction

    def shrunk() -> None:
        status = headroom(custom, node)
        assert status["overCommitted"] is True
        assert status["allocatableRAMMB"] == 0
        assert status["reservedRAMMB"] == 8192

    eventually(shrunk)
    assert rsv.get(custom, namespace, "a")["status"]["phase"] == "Admitted"

    core.delete_node(node)

    def removed() -> None:
        listed = custom.list_cluster_custom_object("headroom.dev", "v1alpha1", "nodeheadrooms")
        assert node not in [o["metadata"]["name"] for o in listed["items"]]

    eventually(removed)
    rsv.create(custom, namespace, "c", node, 1)
    assert rsv.wait_for(custom, namespace, "c")["status"]["reason"] == "NodeUnknown"


def test_per_node_overrides_and_a_bad_override(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    loose = f"loose-{uuid.uuid4().hex[:6]}"
    bad = f"bad-{uuid.uuid4().hex[:6]}"
    make_node(
        loose,
        memory="4Gi",
        annotations={
            "headroom.dev/max-overcommit-ratio": "1.5",
            "headroom.dev/system-reserve-mb": "0",
            "headroom.dev/max-entries": "2",
        },
    )
    make_node(bad, memory="4Gi", annotations={"headroom.dev/max-overcommit-ratio": "lots"})
    operator = run_operator()
    rsv.create(custom, namespace, "big", loose, 6144)  # 4096 × 1.5 − 0
    assert rsv.wait_for(custom, namespace, "big")["status"]["phase"] == "Admitted"
    rsv.create(custom, namespace, "small", loose, 0, vramMB=1)
    assert rsv.wait_for(custom, namespace, "small")["status"]["phase"] == "Admitted"
    rsv.create(custom, namespace, "third", loose, 0, vramMB=1)
    assert rsv.wait_for(custom, namespace, "third")["status"]["reason"] == "TooManyEntries"

    rsv.create(custom, namespace, "on-bad", bad, 3072)  # defaults: 4096 × 1 − 1024
    assert rsv.wait_for(custom, namespace, "on-bad")["status"]["phase"] == "Admitted"
    events = core.list_namespaced_event("default").items

    def warned() -> None:
        found = [
            e
            for e in core.list_namespaced_event("default").items
            if e.involved_object.name == bad and e.reason == "BadHeadroomSettings"
        ]
        assert found
        assert "headroom.dev/max-overcommit-ratio" in found[0].message
        assert "'lots'" in found[0].message

    eventually(warned)
    assert events is not None
    assert operator.ready()


def test_node_headroom_equals_a_recount_and_vram_from_labels(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"gpu-{uuid.uuid4().hex[:6]}"
    make_node(
        node, memory="16Gi", labels={"nvidia.com/gpu.memory": "8192", "nvidia.com/gpu.count": "2"}
    )
    run_operator()
    for i, (ram, vram) in enumerate([(1024, 4096), (2048, 8192), (512, 8192)]):
        rsv.create(custom, namespace, f"r{i}", node, ram, vram)
    phases = {
        i["metadata"]["name"]: i["status"]["phase"] for i in rsv.wait_all(custom, namespace, 3)
    }
    assert phases == {"r0": "Admitted", "r1": "Admitted", "r2": "Rejected"}  # VRAM 16384 full
    assert rsv.get(custom, namespace, "r2")["status"]["reason"] == "InsufficientVRAM"

    def matches() -> None:
        status = headroom(custom, node)
        assert status["capacityKnown"] is True
        assert status["totalRAMMB"] == 16384
        assert status["systemReserveMB"] == 1024
        assert status["reservedRAMMB"] == 3072
        assert status["allocatableRAMMB"] == 16384 - 1024 - 3072
        assert status["reservedVRAMMB"] == 12288
        assert status["vramCapacityMB"] == 16384
        assert status["activeEntries"] == 2
        assert status["staleEntries"] == 0
        assert status["utilizationPercent"] == 3072 * 100 // 16384

    eventually(matches)


def test_metrics_after_a_scripted_sequence(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    operator = run_operator()
    rsv.create(custom, namespace, "a", node, 1024)
    rsv.create(custom, namespace, "b", node, 2048)
    rsv.wait_all(custom, namespace, 2)
    rsv.create(custom, namespace, "too-big", node, 4096)
    rsv.create(custom, namespace, "lost", "no-such-node", 10)
    rsv.wait_all(custom, namespace, 4)
    rsv.delete(custom, namespace, "a")

    def counted() -> None:
        m = operator.metrics()
        assert m["headroom_reserved_mb_total"] == 3072
        assert m["headroom_released_mb_total"] == 1024
        assert m["headroom_reclaimed_mb_total"] == 0
        assert m['headroom_reserve_failures_total{reason="InsufficientRAM"}'] == 1
        assert m['headroom_reserve_failures_total{reason="NodeUnknown"}'] == 1
        assert m["headroom_active_entries"] == 1
        assert m[f'headroom_node_reserved_ram_mb{{node="{node}"}}'] == 2048
        assert m[f'headroom_node_allocatable_ram_mb{{node="{node}"}}'] == 2048
        assert m["headroom_admission_latency_seconds_count"] == 4
        assert m['headroom_decisions_total{phase="Admitted"}'] == 2
        # one Event per decision (the node's own Events add to it), all posted
        assert m["headroom_events_posted_total"] >= 4
        assert m["headroom_events_queued"] == 0
        assert m["headroom_events_dropped_total"] == 0
        # The same figures in bytes, the names that replace the MiB ones.
        mib = 1 << 20
        assert m["headroom_reserved_bytes_total"] == 3072 * mib
        assert m["headroom_released_bytes_total"] == 1024 * mib
        assert m["headroom_reclaimed_bytes_total"] == 0
        assert m[f'headroom_node_reserved_ram_bytes{{node="{node}"}}'] == 2048 * mib
        assert m[f'headroom_node_allocatable_ram_bytes{{node="{node}"}}'] == 2048 * mib
        assert m[f'headroom_node_ram_limit_bytes{{node="{node}"}}'] == 4096 * mib
        # "no-such-node" was looked up before it was refused: the API answered 404.
        assert m['headroom_api_errors_total{code="404",verb="get"}'] >= 1
        assert m["headroom_undecided_reservations"] == 0

    eventually(counted)
