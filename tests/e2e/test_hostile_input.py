"""R3: hostile input never crashes or stalls the operator, and harms no one else.

At least 50 bad objects and annotations: each is refused by the API server with
a message naming the field, or decided/ignored by the operator with a reason or
a Warning Event. Throughout, a control tenant's reservations are decided exactly
as if nothing had happened, and the operator process is the same one at the end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from subprocess import CompletedProcess
from typing import Any

import yaml
from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.integration.test_crd_contract import MALFORMED

BAD_HEARTBEATS = [
    "yesterday",
    "",
    "2026-13-45T99:99:99Z",
    "1e10",
    "２０２６-12-02T10:00:00Z",
    "2026-12-02T10:00:00",
    "9999-12-31T23:59:59Z",
    "1970-01-01T00:00:00Z",
    "x" * 10_000,
    "2026-12-02T10:00:00Z\n; rm -rf /",
    "null",
    "[]",
]
BAD_NODE_ANNOTATIONS = (
    [{"headroom.dev/max-overcommit-ratio": v} for v in ("lots", "-1", "1e999", "NaN", "1/0")]
    + [{"headroom.dev/system-reserve-mb": v} for v in ("-5", "abc", "1e3", "99999999999999")]
    + [{"headroom.dev/max-entries": v} for v in ("0", "9999999999", "many")]
)
BAD_GPU_LABELS = [{"nvidia.com/gpu.memory": v} for v in ("abc", "99999999999", "1.5")] + [
    {"nvidia.com/gpu.memory": "8192", "nvidia.com/gpu.count": "lots"}
]
ODD_MEMORY = ["0", "1", "1e30", "999Ei", "1023Ki"]


def test_r3_hostile_corpus(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    kubectl: Callable[..., CompletedProcess[str]],
) -> None:
    operator = run_operator()
    assert operator.popen is not None
    pid = operator.popen.pid
    control = f"control-{uuid.uuid4().hex[:6]}"
    make_node(control, memory="5Gi")  # limit 4096
    tried = 0

    # A. Malformed Reservations: refused by the API server naming the field.
    for _, body, expected in MALFORMED:
        result = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))
        assert result.returncode != 0, body
        assert expected in result.stderr, result.stderr
        tried += 1

    # B. Unicode and oversized names: refused by the API server.
    for name in ("réservation", "a" * 300, "UPPER", "dots..twice"):
        result = kubectl(
            "apply",
            "-n",
            namespace,
            "-f",
            "-",
            input=yaml.safe_dump(rsv.reservation(name, control, 1)),
        )
        assert result.returncode != 0, name
        assert "metadata.name" in result.stderr, result.stderr
        tried += 1

    # C. Garbage heartbeats on an admitted reservation: ignored with a Warning.
    rsv.create(custom, namespace, "beaten", control, 1024)
    assert rsv.wait_for(custom, namespace, "beaten")["status"]["phase"] == "Admitted"
    for value in BAD_HEARTBEATS:
        custom.patch_namespaced_custom_object(
            "headroom.dev",
            "v1alpha1",
            namespace,
            "reservations",
            "beaten",
            {"metadata": {"annotations": {"headroom.dev/heartbeat": value}}},
        )
        tried += 1

    # D–F. Nodes with odd memory, bad limit annotations, bad GPU labels.
    odd_nodes = []
    for i, memory in enumerate(ODD_MEMORY):
        odd_nodes.append(make_node(f"odd-mem-{i}-{uuid.uuid4().hex[:4]}", memory=memory))
        tried += 1
    for i, bad in enumerate(BAD_NODE_ANNOTATIONS):
        make_node(f"bad-ann-{i}-{uuid.uuid4().hex[:4]}", memory="4Gi", annotations=bad)
        tried += 1
    for i, labels in enumerate(BAD_GPU_LABELS):
        try:
            make_node(f"bad-gpu-{i}-{uuid.uuid4().hex[:4]}", memory="4Gi", labels=labels)
        except client.ApiException as error:  # label values the API itself refuses
            refused = error.status
        else:
            refused = 0
        assert refused in (0, 422)
        tried += 1
    bare = f"no-memory-{uuid.uuid4().hex[:4]}"
    core.create_node({"metadata": {"name": bare}})  # no status at all
    rsv.create(custom, namespace, "on-bare", bare, 1)
    tried += 1

    # G. A node that vanishes mid-admission.
    doomed = f"doomed-{uuid.uuid4().hex[:4]}"
    make_node(doomed, memory="4Gi")
    for i in range(5):
        rsv.create(custom, namespace, f"doomed-{i}", doomed, 512)
    core.delete_node(doomed)
    tried += 1

    # H. A namesake pod in another namespace must not heartbeat this one's reservation.
    other = f"t-other-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": other}})
    for where, beat in ((namespace, None), (other, "2099-01-01T00:00:00Z")):
        core.create_namespaced_pod(
            where,
            {
                "metadata": {
                    "name": "trainer",
                    "labels": {"headroom.dev/owner": "true"},
                    "annotations": {"headroom.dev/heartbeat": beat} if beat else {},
                },
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        )
    rsv.create(custom, namespace, "owned", control, 512, owner={"pod": "trainer"})
    tried += 1

    # I. An owner pod that does not exist: refused, not held for a whole window.
    rsv.create(custom, namespace, "ghost-owned", control, 512, owner={"pod": "nobody"})
    tried += 1

    print(f"R3: {tried} bad inputs tried")
    assert tried >= 50

    # The control tenant is unaffected and the operator is the same, healthy process.
    assert rsv.wait_for(custom, namespace, "on-bare")["status"]["reason"] == "NodeUnknown"
    owned = rsv.wait_for(custom, namespace, "owned")["status"]
    assert owned["phase"] == "Admitted"
    assert owned.get("lastHeartbeat", "") < "2099"
    ghost = rsv.wait_for(custom, namespace, "ghost-owned")["status"]
    assert (ghost["phase"], ghost["reason"]) == ("Rejected", "OwnerPodNotFound"), ghost
    for i in range(5):
        assert rsv.wait_for(custom, namespace, f"doomed-{i}")["status"]["phase"] in (
            "Admitted",
            "Rejected",
        )
    rsv.create(custom, namespace, "control-fits", control, 4096 - 1024 - 512)
    rsv.create(custom, namespace, "control-over", control, 1)
    assert rsv.wait_for(custom, namespace, "control-fits")["status"]["phase"] == "Admitted"
    over = rsv.wait_for(custom, namespace, "control-over")["status"]
    assert over["reason"] == "InsufficientRAM", over
    beaten = rsv.get(custom, namespace, "beaten")["status"]
    assert beaten["phase"] == "Admitted"
    assert beaten["lastHeartbeat"] < "9999"

    deadline = time.monotonic() + 15
    warnings: set[str] = set()
    while time.monotonic() < deadline:
        warnings = {
            e.reason for e in core.list_event_for_all_namespaces().items if e.type == "Warning"
        }
        if {"BadHeartbeat", "BadHeadroomSettings"} <= warnings:
            break
        time.sleep(0.3)
    assert {"BadHeartbeat", "BadHeadroomSettings"} <= warnings
    assert operator.popen is not None
    assert operator.popen.pid == pid
    assert operator.ready()
    assert "Traceback" not in operator.tail(500), operator.tail(60)
