"""Admission on the real control plane: reasons, numbers, serialization, release."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess

Start = Callable[..., OperatorProcess]


def test_admit_and_reject_with_reason_and_numbers(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"gpu-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="32Gi")  # 32768 MiB; limit 32768 × 1 − 1024 = 31744
    run_operator()
    rsv.create(custom, namespace, "fits", node, 25600)
    admitted = rsv.wait_for(custom, namespace, "fits")
    status = admitted["status"]
    assert status["phase"] == "Admitted"
    assert status["reason"] == "Fits"
    assert status["admittedAt"]
    assert [c["type"] for c in status["conditions"]] == ["Admitted"]
    assert status["conditions"][0]["status"] == "True"

    rsv.create(custom, namespace, "too-big", node, 8192)
    rejected = rsv.wait_for(custom, namespace, "too-big")["status"]
    assert rejected["phase"] == "Rejected"
    assert rejected["reason"] == "InsufficientRAM"
    for number in ("8192", "6144", "32768", "1024", "25600"):
        assert number in rejected["message"], rejected["message"]
    assert rejected["conditions"][0]["status"] == "False"

    rsv.create(custom, namespace, "nowhere", "no-such-node", 1)
    assert rsv.wait_for(custom, namespace, "nowhere")["status"]["reason"] == "NodeUnknown"


def test_concurrent_creates_into_the_last_headroom_admit_exactly_what_fits(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"tight-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")  # 11264 MiB − 1024 reserve = 10240 = 80 × 128 MiB
    run_operator()
    names = [f"r-{i:03d}" for i in range(200)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: rsv.create(custom, namespace, n, node, 128), names))
    items = rsv.wait_all(custom, namespace, len(names))
    phases = [i["status"]["phase"] for i in items]
    assert phases.count("Admitted") == 80
    assert phases.count("Rejected") == 120
    assert {i["status"]["reason"] for i in items if i["status"]["phase"] == "Rejected"} == {
        "InsufficientRAM"
    }


def test_delete_returns_capacity_at_once(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    run_operator()
    rsv.create(custom, namespace, "first", node, 4096)
    assert rsv.wait_for(custom, namespace, "first")["status"]["phase"] == "Admitted"
    rsv.create(custom, namespace, "second", node, 4096)
    assert rsv.wait_for(custom, namespace, "second")["status"]["phase"] == "Rejected"
    rsv.delete(custom, namespace, "first")
    rsv.create(custom, namespace, "third", node, 4096)
    assert rsv.wait_for(custom, namespace, "third")["status"]["phase"] == "Admitted"


def test_decisions_are_recorded_as_events(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="4Gi")
    run_operator()
    rsv.create(custom, namespace, "ok", node, 1024)
    rsv.create(custom, namespace, "no", node, 8192)
    rsv.wait_all(custom, namespace, 2)
    deadline_events = _events(core, namespace, want=2)
    by_object = {e.involved_object.name: e for e in deadline_events}
    assert by_object["ok"].reason == "Fits"
    assert by_object["ok"].type == "Normal"
    assert by_object["no"].reason == "InsufficientRAM"
    assert by_object["no"].type == "Warning"
    assert "8192" in by_object["no"].message


def test_invalid_spec_that_slips_past_the_schema_is_rejected_not_crashing(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """expiresAt already in the past is valid YAML but cannot be admitted."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="4Gi")
    operator = run_operator()
    rsv.create(custom, namespace, "late", node, 64, expiresAt="2020-01-01T00:00:00Z")
    status = rsv.wait_for(custom, namespace, "late")["status"]
    assert status["phase"] == "Rejected"
    assert status["reason"] == "AlreadyExpired"
    assert operator.ready()


def _events(core: client.CoreV1Api, namespace: str, want: int) -> list[Any]:
    import time

    deadline = time.monotonic() + 20
    events: list[Any] = []
    while time.monotonic() < deadline:
        events = core.list_namespaced_event(namespace).items
        if len(events) >= want:
            return events
        time.sleep(0.1)
    raise AssertionError(json.dumps([e.reason for e in events]))
