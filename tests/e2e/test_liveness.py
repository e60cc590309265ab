"""Never drop the living (issue 11): outages, restarts, clocks and owner pods.

The operator runs as a process against the real control plane; each test does to
it what a node drain, a slow rebuild, a client with a wrong clock or a deleted
pod does, and checks that no reservation whose owner is alive is taken away —
and that one whose owner is really gone still is.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess

Start = Callable[..., OperatorProcess]
OWNER = {"headroom.dev/owner": "true"}


def beat_value(offset: timedelta = timedelta()) -> str:
    return (datetime.now(UTC) + offset).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def make_pod(core: client.CoreV1Api, namespace: str, name: str) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "labels": OWNER},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        },
    )


class Beater(threading.Thread):
    """Heartbeats once a second through a pod's or a reservation's annotation."""

    def __init__(self, patch: Callable[[str], Any], offset: timedelta = timedelta()) -> None:
        super().__init__(daemon=True)
        self.patch, self.offset = patch, offset
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            self.patch(beat_value(self.offset))


@pytest.fixture
def beaters() -> Iterator[list[Beater]]:
    running: list[Beater] = []
    yield running
    for beater in running:
        beater.stopped.set()


def annotate_pod(core: client.CoreV1Api, namespace: str, name: str) -> Callable[[str], Any]:
    return lambda value: rsv.heartbeat_pod(core, namespace, name, value)


def annotate_reservation(
    custom: client.CustomObjectsApi, namespace: str, name: str
) -> Callable[[str], Any]:
    return lambda value: rsv.heartbeat(custom, namespace, name, value)


def phase(custom: client.CustomObjectsApi, namespace: str, name: str) -> str:
    return str((rsv.get(custom, namespace, name).get("status") or {}).get("phase"))


def stays(
    custom: client.CustomObjectsApi, namespace: str, names: list[str], seconds: float
) -> None:
    """Every one of ``names`` stays Admitted for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name in names:
            assert phase(custom, namespace, name) == "Admitted", rsv.get(custom, namespace, name)
        time.sleep(0.25)


def test_an_outage_of_most_of_the_window_reclaims_nothing_alive(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    beaters: list[Beater],
) -> None:
    """Item 1: a 9 s outage with a 10 s window reclaimed pod-heartbeated reservations."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="16Gi")
    config = {"limits": {"heartbeatStaleWindow": "10s"}, "sweepPeriod": "200ms"}
    operator = run_operator(config)
    names = [f"pod-{i}" for i in range(3)] + [f"self-{i}" for i in range(2)]
    for i in range(3):
        make_pod(core, namespace, f"owner-{i}")
        rsv.create(custom, namespace, f"pod-{i}", node, 512, owner={"pod": f"owner-{i}"})
        beaters.append(Beater(annotate_pod(core, namespace, f"owner-{i}")))
    for i in range(2):
        rsv.create(custom, namespace, f"self-{i}", node, 512)
        beaters.append(Beater(annotate_reservation(custom, namespace, f"self-{i}")))
    for name in names:
        assert rsv.wait_for(custom, namespace, name)["status"]["phase"] == "Admitted"
    for beater in beaters:
        beater.start()
    stays(custom, namespace, names, 3)
    operator.kill()
    time.sleep(9)  # 90 % of the window, owners beating all along
    run_operator(config)
    stays(custom, namespace, names, 12)  # more than a window after the restart

    for beater in beaters:  # the owners go silent: now they are reclaimed
        beater.stopped.set()
    for name in names:
        status = rsv.wait_for(custom, namespace, name, ("Reclaimed",), timeout=20)["status"]
        assert status["reason"] == "HeartbeatStale", status


def test_a_reservation_created_during_a_long_outage_gets_a_full_window(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """Item 2: its stale clock started at creation; it went straight to Reclaimed."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="8Gi")
    config = {"limits": {"heartbeatStaleWindow": "4s"}, "sweepPeriod": "200ms"}
    operator = run_operator(config)
    operator.kill()
    rsv.create(custom, namespace, "born-in-outage", node, 512)
    time.sleep(6)  # longer than the window
    run_operator(config)
    admitted = rsv.wait_for(custom, namespace, "born-in-outage")["status"]
    assert admitted["phase"] == "Admitted", admitted
    stays(custom, namespace, ["born-in-outage"], 3)  # most of a window after admission
    reclaimed = rsv.wait_for(custom, namespace, "born-in-outage", ("Reclaimed",), timeout=10)
    assert reclaimed["status"]["reason"] == "HeartbeatStale"


def test_a_client_whose_clock_is_an_hour_behind_keeps_its_reservation(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
    beaters: list[Beater],
) -> None:
    """Item 8: a heartbeat counts when the operator sees a new value, whatever its time."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="8Gi")
    run_operator({"limits": {"heartbeatStaleWindow": "3s"}, "sweepPeriod": "200ms"})
    rsv.create(custom, namespace, "late-clock", node, 512)
    assert rsv.wait_for(custom, namespace, "late-clock")["status"]["phase"] == "Admitted"
    beater = Beater(annotate_reservation(custom, namespace, "late-clock"), -timedelta(hours=1))
    beaters.append(beater)
    beater.start()
    stays(custom, namespace, ["late-clock"], 8)  # almost three windows


def test_an_untrusted_status_cannot_keep_an_entry_alive(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """Item 7: the lastHeartbeat of a forged status was kept when it was decided again."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="8Gi")
    config = {
        "limits": {"heartbeatStaleWindow": "3s"},
        "sweepPeriod": "200ms",
        "decisionKey": {"enabled": True, "namespace": namespace, "secretName": "key"},
    }
    operator = run_operator(config)
    time.sleep(1)  # the key's (empty) adoption is over
    operator.stop()
    rsv.create(custom, namespace, "forged", node, 512)
    custom.patch_namespaced_custom_object_status(
        "headroom.dev",
        "v1alpha1",
        namespace,
        "reservations",
        "forged",
        {
            "status": {
                "phase": "Admitted",
                "reason": "Fits",
                "lastHeartbeat": "2099-01-01T00:00:00Z",
            }
        },
    )
    run_operator(config)
    decided = rsv.wait_for(custom, namespace, "forged", ("Reclaimed",), timeout=15)["status"]
    assert decided["reason"] == "HeartbeatStale", decided


def test_owner_pods_gone_or_unlabelled_or_never_there(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    beaters: list[Beater],
) -> None:
    """Item 9: only events were followed; a pod deleted during an outage was never noticed,
    an unlabelled pod counted as deleted, a pod that never existed was held for a window."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="16Gi")
    config = {"limits": {"heartbeatStaleWindow": "60s"}, "sweepPeriod": "200ms"}
    operator = run_operator(config)
    for name in ("doomed", "unlabelled", "reborn"):
        make_pod(core, namespace, name)
        rsv.create(custom, namespace, f"of-{name}", node, 512, owner={"pod": name})
        assert rsv.wait_for(custom, namespace, f"of-{name}")["status"]["phase"] == "Admitted"
    rsv.create(custom, namespace, "of-nobody", node, 512, owner={"pod": "nobody"})
    nobody = rsv.wait_for(custom, namespace, "of-nobody")["status"]
    assert (nobody["phase"], nobody["reason"]) == ("Rejected", "OwnerPodNotFound"), nobody

    core.patch_namespaced_pod(
        "unlabelled", namespace, {"metadata": {"labels": {"headroom.dev/owner": None}}}
    )
    time.sleep(2)
    assert phase(custom, namespace, "of-unlabelled") == "Admitted"  # running, only unlabelled

    # Deleted and created again under the same name (a StatefulSet's pod): a new owner.
    core.delete_namespaced_pod("reborn", namespace, grace_period_seconds=0)
    make_pod(core, namespace, "reborn")
    reborn = rsv.wait_for(custom, namespace, "of-reborn", ("Reclaimed",), timeout=10)["status"]
    assert reborn["reason"] == "OwnerPodDeleted", reborn

    operator.kill()
    core.delete_namespaced_pod("doomed", namespace, grace_period_seconds=0)
    run_operator(config)
    gone = rsv.wait_for(custom, namespace, "of-doomed", ("Reclaimed",), timeout=10)["status"]
    assert gone["reason"] == "OwnerPodDeleted", gone
    assert phase(custom, namespace, "of-unlabelled") == "Admitted"


def test_a_node_created_a_moment_before_its_reservation_is_known(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """Item 6: Node and Reservation events arrive on unordered streams."""
    run_operator()
    names = []
    for i in range(15):
        node = f"fresh-{i}-{uuid.uuid4().hex[:4]}"
        make_node(node, memory="4Gi")
        rsv.create(custom, namespace, f"on-fresh-{i}", node, 1024)
        names.append(f"on-fresh-{i}")
    rsv.create(custom, namespace, "on-missing", "no-such-node", 1024)
    for name in names:
        status = rsv.wait_for(custom, namespace, name)["status"]
        assert status["phase"] == "Admitted", (name, status)
    assert rsv.wait_for(custom, namespace, "on-missing")["status"]["reason"] == "NodeUnknown"
