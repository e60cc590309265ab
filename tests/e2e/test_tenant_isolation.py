"""One tenant must never hurt another (issue 14): every case, live and across a restart.

Each case plants a hostile value — in a Reservation, an annotation, a Node — and
says what the operator must do with it. Every case runs twice: against a live
operator, and planted while the operator is down so that the object is already
there when it starts (the restart once made a single object stop the rebuild
forever). After each, a control tenant's reservation must be decided within a
second, the operator must be the same healthy process, and the ledger's
invariants must hold.

Values the schema now refuses (a far ``expiresAt``) are also planted the way
they exist in a real cluster: created under the previous, looser schema, then
the current CRD put back.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml
from kubernetes import client

from headroom.api.constants import MAX_MB
from headroom.api.crd import reservation_crd
from headroom_dev import invariants
from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess

GROUP, VERSION = "headroom.dev", "v1alpha1"
FAR_TIMES = ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"]
CONTROL_DEADLINE = 1.0  # seconds from create to decision seen


@dataclass
class Scene:
    """What the cases share: the namespace, the API, and the nodes each case made."""

    namespace: str
    custom: client.CustomObjectsApi
    core: client.CoreV1Api
    make_node: Callable[..., Any]
    tag: str
    nodes: list[str] = field(default_factory=list)
    operator_running: bool = False
    operator_starts: int = 0

    def node(self, name: str, **kwargs: Any) -> str:
        full = f"{name}-{self.tag}"
        self.make_node(full, **{"memory": "8Gi", **kwargs})
        if self.operator_running:  # test the case's own value, not Node/Reservation order
            self.headroom(full)
        return full

    def annotate(self, name: str, value: str) -> None:
        rsv.heartbeat(self.custom, self.namespace, name, value)

    def status(self, name: str, phases: tuple[str, ...] = rsv.DECIDED) -> dict[str, Any]:
        return dict(rsv.wait_for(self.custom, self.namespace, name, phases)["status"])

    def warnings(self, reason: str, about: str, timeout: float = 15) -> list[str]:
        """Messages of Warning Events with ``reason`` about object ``about`` (waits for one)."""
        deadline = time.monotonic() + timeout
        messages: list[str] = []
        while time.monotonic() < deadline:
            events = self.core.list_event_for_all_namespaces(
                field_selector=f"involvedObject.name={about},reason={reason}"
            ).items
            messages = [e.message for e in events if e.type == "Warning"]
            if messages:
                return messages
            time.sleep(0.2)
        raise AssertionError(f"no {reason} Warning about {about}")

    def headroom(self, node: str, timeout: float = 15, **expected: Any) -> dict[str, Any]:
        """The NodeHeadroom status of ``node`` once it shows ``expected``."""
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                obj = self.custom.get_cluster_custom_object(GROUP, VERSION, "nodeheadrooms", node)
                status = obj.get("status") or {}
            except client.ApiException as error:
                if error.status != 404:
                    raise
            if status and all(status.get(k) == v for k, v in expected.items()):
                return status
            time.sleep(0.2)
        raise AssertionError(f"NodeHeadroom {node} never showed {expected}: {status}")


@dataclass(frozen=True)
class Case:
    name: str
    plant: Callable[[Scene], None]
    check: Callable[[Scene], None]


# -- the cases (issue 14, items 1-4 and 8) -------------------------------------------------------


def plant_far_heartbeat_on_new(scene: Scene) -> None:
    node = scene.node("beat-new")
    for i, value in enumerate(FAR_TIMES):
        body = rsv.reservation(f"far-beat-new-{i}", node, 256)
        body["metadata"]["annotations"] = {"headroom.dev/heartbeat": value}
        scene.custom.create_namespaced_custom_object(
            GROUP, VERSION, scene.namespace, "reservations", body
        )


def check_far_heartbeat_on_new(scene: Scene) -> None:
    for i in range(len(FAR_TIMES)):
        status = scene.status(f"far-beat-new-{i}")
        assert status["phase"] == "Admitted", status  # the bad annotation is ignored, not fatal
        assert status["lastHeartbeat"] < "9000"


def plant_far_heartbeat_on_admitted(scene: Scene) -> None:
    node = scene.node("beat-old")
    rsv.create(scene.custom, scene.namespace, "far-beat-old", node, 256)
    scene.status("far-beat-old")
    for value in FAR_TIMES:
        scene.annotate("far-beat-old", value)


def check_far_heartbeat_on_admitted(scene: Scene) -> None:
    status = scene.status("far-beat-old")
    assert status["phase"] == "Admitted", status
    messages = scene.warnings("BadHeartbeat", "far-beat-old")
    assert any("headroom.dev/heartbeat" in m and "outside" in m for m in messages), messages


def plant_vram_sum_past_a_reservation_bound(scene: Scene) -> None:
    bare = scene.node("no-gpu")  # no GPU labels: VRAM tracked, not enforced
    unlimited = scene.node(
        "unlimited", annotations={"headroom.dev/max-overcommit-ratio": "0"}, memory="4Gi"
    )
    for i in range(2):
        rsv.create(scene.custom, scene.namespace, f"vram-{i}", bare, 1, MAX_MB)
        rsv.create(scene.custom, scene.namespace, f"ram-{i}", unlimited, MAX_MB)


def check_vram_sum_past_a_reservation_bound(scene: Scene) -> None:
    for i in range(2):
        assert scene.status(f"vram-{i}")["phase"] == "Admitted"
        assert scene.status(f"ram-{i}")["phase"] == "Admitted"
    scene.headroom(f"no-gpu-{scene.tag}", reservedVRAMMB=2 * MAX_MB, activeEntries=2)
    scene.headroom(f"unlimited-{scene.tag}", reservedRAMMB=2 * MAX_MB, activeEntries=2)


def plant_node_memory_1e40(scene: Scene) -> None:
    node = scene.node("huge", memory="1e40")
    rsv.create(scene.custom, scene.namespace, "on-huge", node, 256)


def check_node_memory_1e40(scene: Scene) -> None:
    status = scene.status("on-huge")
    assert status["reason"] == "NodeUnknown", status
    messages = scene.warnings("BadHeadroomSettings", f"huge-{scene.tag}")
    assert any("memory" in m and "above" in m for m in messages), messages  # "10e39" on the wire


def plant_ratio_with_a_huge_exponent(scene: Scene) -> None:
    for i, value in enumerate(["1e20000000", "1e999999999999999999999"]):
        node = scene.node(f"exp-{i}", annotations={"headroom.dev/max-overcommit-ratio": value})
        rsv.create(scene.custom, scene.namespace, f"on-exp-{i}", node, 4096)


def check_ratio_with_a_huge_exponent(scene: Scene) -> None:
    for i in range(2):
        status = scene.status(f"on-exp-{i}")
        assert status["phase"] == "Admitted", status  # the default ratio is used
        messages = scene.warnings("BadHeadroomSettings", f"exp-{i}-{scene.tag}")
        assert any("max-overcommit-ratio" in m and "outside" in m for m in messages), messages


def plant_far_expiry_from_an_older_schema(scene: Scene) -> None:
    node = scene.node("legacy")
    for i, value in enumerate(FAR_TIMES):
        rsv.create(scene.custom, scene.namespace, f"legacy-expiry-{i}", node, 256, expiresAt=value)


def check_far_expiry_from_an_older_schema(scene: Scene) -> None:
    for i in range(len(FAR_TIMES)):
        status = scene.status(f"legacy-expiry-{i}")
        assert (status["phase"], status["reason"]) == ("Rejected", "InvalidSpec"), status
        assert "spec.expiresAt" in status["message"], status


def plant_pod_heartbeat_garbage(scene: Scene) -> None:
    node = scene.node("pod-owner")
    scene.core.create_namespaced_pod(
        scene.namespace,
        {
            "metadata": {
                "name": "noisy",
                "labels": {"headroom.dev/owner": "true"},
                "annotations": {"headroom.dev/heartbeat": "not a time"},
            },
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    rsv.create(scene.custom, scene.namespace, "owned-by-noisy", node, 256, owner={"pod": "noisy"})
    scene.status("owned-by-noisy")
    for i in range(20):  # unrelated updates: the bad value stays the same
        scene.core.patch_namespaced_pod(
            "noisy", scene.namespace, {"metadata": {"labels": {"round": str(i)}}}
        )


def check_pod_heartbeat_garbage(scene: Scene) -> None:
    assert scene.status("owned-by-noisy")["phase"] == "Admitted"
    scene.warnings("BadHeartbeat", "noisy")
    time.sleep(1)  # let any late duplicate arrive
    events = scene.core.list_namespaced_event(
        scene.namespace, field_selector="involvedObject.name=noisy,reason=BadHeartbeat"
    ).items
    # One per distinct bad value and operator start, not one per update of the pod.
    assert sum(e.count or 1 for e in events) <= scene.operator_starts, [e.message for e in events]


CASES = [
    Case(
        "far heartbeat on a new reservation", plant_far_heartbeat_on_new, check_far_heartbeat_on_new
    ),
    Case(
        "far heartbeat on an admitted reservation",
        plant_far_heartbeat_on_admitted,
        check_far_heartbeat_on_admitted,
    ),
    Case(
        "sums past one reservation's bound",
        plant_vram_sum_past_a_reservation_bound,
        check_vram_sum_past_a_reservation_bound,
    ),
    Case("node memory 1e40", plant_node_memory_1e40, check_node_memory_1e40),
    Case("ratio 1e20000000", plant_ratio_with_a_huge_exponent, check_ratio_with_a_huge_exponent),
    Case(
        "far expiresAt from an older schema",
        plant_far_expiry_from_an_older_schema,
        check_far_expiry_from_an_older_schema,
    ),
    Case("pod heartbeat garbage", plant_pod_heartbeat_garbage, check_pod_heartbeat_garbage),
]
NEEDS_OLD_SCHEMA = {"far expiresAt from an older schema"}
#: Cases that need an admitted reservation before the hostile value arrives.
NEEDS_LIVE_OPERATOR = {"far heartbeat on an admitted reservation", "pod heartbeat garbage"}


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def older_schema(kubectl: Callable[..., CompletedProcess[str]]) -> Iterator[Callable[[], Any]]:
    """A context in which the Reservation CRD lacks the expiresAt bound (as before issue 14)."""
    current = reservation_crd()
    loose = copy.deepcopy(current)
    spec_schema = loose["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["properties"]["expiresAt"].pop("x-kubernetes-validations")

    def apply(crd: dict[str, Any]) -> None:
        live = kubectl("get", "crd", crd["metadata"]["name"], "-o", "yaml")
        assert live.returncode == 0, live.stderr
        body = {**crd, "metadata": yaml.safe_load(live.stdout)["metadata"]}
        result = kubectl("replace", "-f", "-", input=yaml.safe_dump(body))
        assert result.returncode == 0, result.stderr
        time.sleep(1.5)  # the API server rebuilds the CRD's validator

    class Loosened:
        def __enter__(self) -> None:
            apply(loose)

        def __exit__(self, *_: object) -> None:
            apply(current)

    try:
        yield Loosened
    finally:
        apply(current)


def control_decided_within(scene: Scene, node: str, label: str) -> None:
    name = f"control-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    rsv.create(scene.custom, scene.namespace, name, node, 64)
    status = rsv.wait_for(scene.custom, scene.namespace, name, timeout=10)["status"]
    took = time.monotonic() - started
    assert status["phase"] == "Admitted", (label, status)
    assert took < CONTROL_DEADLINE, f"{label}: control decided after {took:.2f}s"
    rsv.delete(scene.custom, scene.namespace, name)


def assert_healthy(operator: OperatorProcess, pid: int) -> None:
    assert operator.popen is not None
    assert operator.popen.pid == pid
    assert operator.ready("ok")
    assert "Traceback" not in operator.tail(2000), operator.tail(80)


def assert_invariants(scene: Scene) -> None:
    items = rsv.list_all(scene.custom, scene.namespace)
    undecided = [i["metadata"]["name"] for i in items if not (i.get("status") or {}).get("phase")]
    assert undecided == []
    control = [n for n in scene.nodes if n.startswith("control")]
    assert invariants.check(scene.custom, scene.core, scene.namespace, 1024, control) == []


@pytest.fixture
def scene(
    namespace: str,
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    make_node: Callable[..., Any],
) -> Scene:
    made = Scene(namespace, custom, core, make_node, uuid.uuid4().hex[:5])
    made.nodes.append(made.node("control", memory="5Gi"))
    return made


# -- the tests ---------------------------------------------------------------------------------


def test_each_hostile_value_on_a_live_operator(
    run_operator: Callable[..., OperatorProcess], scene: Scene, older_schema: Any
) -> None:
    operator = run_operator({"limits": {"maxEntriesPerNode": 1000}})
    scene.operator_running, scene.operator_starts = True, 1
    assert operator.popen is not None
    pid = operator.popen.pid
    control = scene.nodes[0]
    for case in CASES:
        if case.name in NEEDS_OLD_SCHEMA:
            with older_schema():
                case.plant(scene)
        else:
            case.plant(scene)
        case.check(scene)
        control_decided_within(scene, control, case.name)
        assert_healthy(operator, pid)
    assert_invariants(scene)


def test_each_hostile_value_already_there_at_start(
    run_operator: Callable[..., OperatorProcess], scene: Scene, older_schema: Any
) -> None:
    config = {"limits": {"maxEntriesPerNode": 1000}}
    operator = run_operator(config)
    scene.operator_running, scene.operator_starts = True, 1
    for case in CASES:  # these need a decision before their hostile value arrives
        if case.name in NEEDS_LIVE_OPERATOR:
            case.plant(scene)
    operator.stop()
    scene.operator_running = False
    for case in CASES:
        if case.name in NEEDS_OLD_SCHEMA:
            with older_schema():
                case.plant(scene)
        elif case.name not in NEEDS_LIVE_OPERATOR:
            case.plant(scene)
        if case.name == "far heartbeat on an admitted reservation":
            for value in FAR_TIMES:  # and again while the operator is down
                scene.annotate("far-beat-old", value)

    restarted = run_operator(config)  # must become ready: the rebuild survives every case
    scene.operator_starts += 1
    assert restarted.popen is not None
    pid = restarted.popen.pid
    control_decided_within(scene, scene.nodes[0], "after restart")
    for case in CASES:
        case.check(scene)
        control_decided_within(scene, scene.nodes[0], case.name)
    assert_healthy(restarted, pid)
    assert_invariants(scene)
