"""Gated pods under a HeadroomQuota (issue 29, items 4, 5, 8), on the real control plane.

No quota setting may strand a pod: its default wait fits the quota's maxWait, its
reservation goes only to a node the quota allows, a pod that can go nowhere says why
once and makes nothing until something changes, and a quota's lifetime ends the pod
(``activeDeadlineSeconds``) instead of being renewed for ever. Each quota here selects
only the test's own namespace, by name, and is deleted after the test.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from headroom_dev import quotas as hq
from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.integration.test_pod_gates import (
    GATE,
    claim_pod,
    gates_of,
    pinned_to,
    pool_nodes,
    untaint,
    wait_ungated,
)
from tests.polling import eventually

Start = Callable[..., OperatorProcess]
CONDITION = "headroom.dev/Admitted"
FAST = {"sweepPeriod": "200ms", "summaryInterval": "200ms"}


@pytest.fixture
def quota(custom: client.CustomObjectsApi, namespace: str) -> Iterator[Callable[..., str]]:
    """``quota(**spec)``: a HeadroomQuota over the test's namespace, deleted after it."""
    made: list[str] = []

    def make(**spec: Any) -> str:
        name = f"q-{uuid.uuid4().hex[:8]}"
        hq.create(custom, name, {"kubernetes.io/metadata.name": namespace}, **spec)
        made.append(name)
        return name

    yield make
    for name in made:
        hq.delete(custom, name)


class Reservations:
    """Every Reservation ADDED and DELETED in a namespace while it watches."""

    def __init__(self, custom: client.CustomObjectsApi, namespace: str) -> None:
        self._added: list[tuple[str, str]] = []  # (name, uid)
        self._deleted: list[tuple[str, str]] = []
        self.stopped = False
        self._broken: Exception | None = None
        self._watch = watch.Watch()
        listed = custom.list_namespaced_custom_object(rsv.GROUP, rsv.VERSION, namespace, rsv.PLURAL)
        for item in listed["items"]:
            self._added.append((item["metadata"]["name"], item["metadata"]["uid"]))
        version = listed["metadata"]["resourceVersion"]
        self._thread = threading.Thread(
            target=self._follow, args=(custom, namespace, version), daemon=True
        )
        self._thread.start()

    def _follow(self, custom: client.CustomObjectsApi, namespace: str, version: str) -> None:
        try:
            self._record(custom, namespace, version)
        except Exception as error:  # the stream cut when the test ends: what was seen is kept
            if not self.stopped:
                self._broken = error

    @property
    def added(self) -> list[tuple[str, str]]:
        """(name, uid) of each one created (or there when it began)."""
        assert self._broken is None, f"the watch broke: {self._broken!r}"
        return list(self._added)

    @property
    def deleted(self) -> list[tuple[str, str]]:
        assert self._broken is None, f"the watch broke: {self._broken!r}"
        return list(self._deleted)

    def _record(self, custom: client.CustomObjectsApi, namespace: str, version: str) -> None:
        for event in self._watch.stream(
            custom.list_namespaced_custom_object,
            rsv.GROUP,
            rsv.VERSION,
            namespace,
            rsv.PLURAL,
            resource_version=version,
            timeout_seconds=300,
        ):
            meta = event["object"]["metadata"]
            if event["type"] == "ADDED":
                self._added.append((meta["name"], meta["uid"]))
            elif event["type"] == "DELETED":
                self._deleted.append((meta["name"], meta["uid"]))

    def stop(self) -> None:
        self.stopped = True
        self._watch.stop()

    def of(self, name: str) -> list[str]:
        return [uid for added, uid in self.added if added == name]


@pytest.fixture
def reservations(
    custom: client.CustomObjectsApi, namespace: str
) -> Iterator[Callable[[], Reservations]]:
    started: list[Reservations] = []

    def start() -> Reservations:
        started.append(Reservations(custom, namespace))
        return started[-1]

    yield start
    for seen in started:
        seen.stop()


def condition(core: client.CoreV1Api, namespace: str, pod: str) -> tuple[str, str, str]:
    """The pod's one condition headroom.dev/Admitted: (status, reason, message)."""
    found = core.read_namespaced_pod(pod, namespace).status.conditions or []
    ours = [(c.status, c.reason, c.message) for c in found if c.type == CONDITION]
    assert len(ours) == 1, ours
    return ours[0]


def pod_events(core: client.CoreV1Api, namespace: str, pod: str) -> list[tuple[str, str]]:
    """The Events about the pod (its Reservation has the same name: not those)."""
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod},involvedObject.kind=Pod"
    )
    return [(e.reason, e.message or "") for e in events.items]


def bind(core: client.CoreV1Api, namespace: str, pod: str, node: str) -> None:
    """What kube-scheduler does (no scheduler runs on this plane)."""
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    # The generated client cannot read the answer back into a V1Binding: not parsed.
    core.create_namespaced_pod_binding(pod, namespace, body, _preload_content=False)


def held_still(check: Callable[[], Any], seconds: float) -> None:
    """``check`` holds now and still after ``seconds``: what must not change does not."""
    check()
    time.sleep(seconds)
    check()


def test_a_pod_without_a_wait_waits_no_longer_than_its_quotas_max_wait(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    quota: Callable[..., str],
    reservations: Callable[[], Reservations],
) -> None:
    pool, nodes = pool_nodes(make_node, core, only="8Gi")  # room for one 6Gi pod
    quota(maxWait="10m")
    run_operator(FAST)
    seen = reservations()
    core.create_namespaced_pod(namespace, claim_pod("first", pool, "6Gi"))
    core.create_namespaced_pod(namespace, claim_pod("second", pool, "6Gi"))

    first = wait_ungated(core, namespace, "first")
    assert pinned_to(first) == [nodes["only"]]
    assert rsv.get(custom, namespace, "first")["spec"]["wait"] == "600s"
    waiting = rsv.wait_for(custom, namespace, "second", phases=("Queued",))
    assert waiting["spec"]["wait"] == "600s"
    assert waiting["status"]["reason"] == "InsufficientRAM"

    def one_reservation_each() -> None:
        assert (len(seen.of("first")), len(seen.of("second"))) == (1, 1), seen.added
        assert seen.deleted == []
        assert gates_of(core.read_namespaced_pod("second", namespace)) == [GATE]

    # A refusal would be deleted and made again 10 s later: watch for longer than that.
    held_still(one_reservation_each, 15)


def test_a_wait_over_the_quotas_max_wait_is_said_once_and_nothing_is_made(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    quota: Callable[..., str],
    reservations: Callable[[], Reservations],
) -> None:
    pool, nodes = pool_nodes(make_node, core, only="16Gi")
    name = quota(maxWait="10m")
    run_operator(FAST)
    seen = reservations()
    pod = claim_pod("patient", pool, "1Gi", annotations={"headroom.dev/wait": "1h"})
    core.create_namespaced_pod(namespace, pod)

    def said_why() -> None:
        status, reason, message = condition(core, namespace, "patient")
        assert (status, reason) == ("False", "WaitTooLong"), message
        assert f"(quota {name}): spec.wait 1h is longer than spec.maxWait 10m" in message

    eventually(said_why)

    def still_nothing() -> None:
        said_why()
        assert seen.added == []
        assert seen.deleted == []
        assert gates_of(core.read_namespaced_pod("patient", namespace)) == [GATE]
        assert [r for r, _ in pod_events(core, namespace, "patient")] == ["WaitTooLong"]

    held_still(still_nothing, 15)

    # The quota changes: the pod is placed at once, without being edited.
    hq.patch_spec(custom, name, maxWait="2h")
    assert pinned_to(wait_ungated(core, namespace, "patient")) == [nodes["only"]]
    assert rsv.get(custom, namespace, "patient")["spec"]["wait"] == "3600s"
    assert len(seen.of("patient")) == 1


def test_a_quotas_node_selector_places_the_pod_on_an_allowed_node_not_the_roomiest(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    quota: Callable[..., str],
    reservations: Callable[[], Reservations],
) -> None:
    pool, nodes = pool_nodes(make_node, core, small="8Gi", big="32Gi")
    core.patch_node(nodes["small"], {"metadata": {"labels": {"tier": pool}}})
    quota(nodeSelector={"matchLabels": {"tier": pool}})
    run_operator(FAST)
    seen = reservations()
    core.create_namespaced_pod(namespace, claim_pod("train", pool, "4Gi"))

    assert pinned_to(wait_ungated(core, namespace, "train")) == [nodes["small"]]
    status = rsv.get(custom, namespace, "train")["status"]
    assert (status["phase"], status["reason"]) == ("Admitted", "Fits"), status
    assert len(seen.of("train")) == 1
    assert seen.deleted == []


def test_a_pod_no_allowed_node_fits_says_why_once_then_goes_when_one_appears(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    quota: Callable[..., str],
    reservations: Callable[[], Reservations],
) -> None:
    # The pod may run on the pool's nodes; the quota allows only nodes of its tier; no
    # node is both until one is made.
    pool, _ = pool_nodes(make_node, core, one="16Gi", two="16Gi")
    outside = f"outside-{pool}"
    make_node(outside, memory="16Gi", labels={"tier": pool})
    untaint(core, outside)
    name = quota(nodeSelector={"matchLabels": {"tier": pool}})
    run_operator(FAST)
    seen = reservations()
    core.create_namespaced_pod(namespace, claim_pod("stuck", pool, "4Gi"))

    def said_why() -> None:
        status, reason, message = condition(core, namespace, "stuck")
        assert (status, reason) == ("False", "NodeNotAllowed"), message
        assert "its quota allows none of the 2 nodes it may run on" in message
        assert f"(quota {name})" in message
        assert f"tier={pool}" in message

    eventually(said_why)

    def still_nothing() -> None:
        said_why()
        assert seen.added == []
        assert seen.deleted == []
        assert gates_of(core.read_namespaced_pod("stuck", namespace)) == [GATE]
        assert [r for r, _ in pod_events(core, namespace, "stuck")] == ["NodeNotAllowed"]

    held_still(still_nothing, 12)

    both = f"both-{pool}"
    make_node(both, memory="16Gi", labels={"pool": pool, "tier": pool})
    untaint(core, both)
    assert pinned_to(wait_ungated(core, namespace, "stuck")) == [both]
    assert len(seen.of("stuck")) == 1
    assert seen.deleted == []


def test_a_quota_lifetime_ends_the_pod_and_is_never_renewed(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
    quota: Callable[..., str],
    reservations: Callable[[], Reservations],
) -> None:
    pool, nodes = pool_nodes(make_node, core, only="16Gi")
    quota(defaultLifetime="15s")
    config = {**FAST, "reclaimedRetention": "1s"}
    operator = run_operator(config)
    seen = reservations()
    core.create_namespaced_pod(namespace, claim_pod("bounded", pool, "1Gi"))

    pod = wait_ungated(core, namespace, "bounded")
    # The kubelet ends it (Failed, DeadlineExceeded) by the time its reservation expires.
    assert pod.spec.active_deadline_seconds is not None
    assert 1 <= pod.spec.active_deadline_seconds <= 15
    reservation = rsv.get(custom, namespace, "bounded")
    assert reservation["status"]["expiresAt"]
    bind(core, namespace, "bounded", nodes["only"])  # it runs there (no kubelet here)

    # No kubelet runs here to end it: its reservation runs out first, as it would in the
    # slack between the expiry and the pod's deadline. It is reclaimed, then deleted.
    reclaimed = rsv.wait_for(custom, namespace, "bounded", phases=("Reclaimed",), timeout=30)
    assert reclaimed["status"]["reason"] == "Expired"

    def said_why() -> None:
        status, reason, message = condition(core, namespace, "bounded")
        assert (status, reason) == ("False", "Expired"), message
        assert "gets no other reservation" in message

    eventually(said_why)

    def deleted() -> None:
        assert seen.deleted == [("bounded", reclaimed["metadata"]["uid"])], seen.deleted

    eventually(deleted)

    def never_another() -> None:
        said_why()
        assert seen.of("bounded") == [reclaimed["metadata"]["uid"]], seen.added
        assert core.read_namespaced_pod("bounded", namespace).spec.node_name == nodes["only"]
        assert [r for r, _ in pod_events(core, namespace, "bounded")].count("Expired") == 1

    held_still(never_another, 8)
    # A new operator knows it from the pod's condition alone: still no other.
    operator.kill()
    run_operator(config)
    held_still(never_another, 8)
