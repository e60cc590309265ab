"""Losing or rotating the decision key never takes memory back (issue 14, item 5).

A new key cannot verify the stamps made with the old one. Before, every
reservation was then decided again, and one on a node that had shrunk since
became Rejected while its owner still used the memory. Now the statuses a new key
cannot verify are adopted — kept, counted, stamped again — and once that is done,
a status without a valid stamp is distrusted again, as before.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.nodes import set_node_memory
from headroom_dev.operator import OperatorProcess

ADOPTED = "headroom.dev/statuses-adopted"


def adopted_mark(core: client.CoreV1Api, namespace: str, name: str, want: str) -> str:
    deadline = time.monotonic() + 15
    mark = ""
    while time.monotonic() < deadline:
        secret = core.read_namespaced_secret(name, namespace)
        mark = (secret.metadata.annotations or {}).get(ADOPTED, "")
        if mark == want:
            return mark
        time.sleep(0.2)
    raise AssertionError(f"Secret {namespace}/{name}: {ADOPTED}={mark!r}, wanted {want!r}")


def stamped_again(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 15
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = rsv.get(custom, namespace, name)["status"]
        if "-adopted-" in status.get("decisionID", ""):
            return status
        time.sleep(0.2)
    raise AssertionError(f"{name} not stamped again: {status}")


def test_a_lost_key_keeps_every_decision_and_then_distrusts_forgeries(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    node = f"key-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="9Gi")  # limit 8192
    secret = f"key-{uuid.uuid4().hex[:6]}"
    config = {"decisionKey": {"enabled": True, "namespace": namespace, "secretName": secret}}
    operator = run_operator(config)
    adopted_mark(core, namespace, secret, "true")  # a fresh install has nothing to adopt
    rsv.create(custom, namespace, "in-use", node, 6144)
    rsv.create(custom, namespace, "refused", node, 4096)
    assert rsv.wait_for(custom, namespace, "in-use")["status"]["phase"] == "Admitted"
    assert rsv.wait_for(custom, namespace, "refused")["status"]["phase"] == "Rejected"
    old_key = core.read_namespaced_secret(secret, namespace).data["decision-key"]
    operator.stop()

    # The node shrinks below what is reserved, and the key is lost.
    set_node_memory(core, node, "5Gi")  # limit 4096 < 6144 reserved
    core.delete_namespaced_secret(secret, namespace)
    operator = run_operator(config)

    in_use = stamped_again(custom, namespace, "in-use")
    assert in_use["phase"] == "Admitted", in_use  # kept: its owner still uses the memory
    assert stamped_again(custom, namespace, "refused")["phase"] == "Rejected"
    adopted_mark(core, namespace, secret, "true")
    assert core.read_namespaced_secret(secret, namespace).data["decision-key"] != old_key
    reasons = {e.reason for e in core.list_namespaced_event(namespace).items}
    assert "OverCommitted" in reasons  # said, not evicted
    assert "UntrustedStatus" not in reasons
    rsv.create(custom, namespace, "more", node, 1)  # the node is over its limit: no room
    assert rsv.wait_for(custom, namespace, "more")["status"]["reason"] == "InsufficientRAM"

    # Adoption is over: a status written without the key is distrusted and decided again.
    rsv.create(custom, namespace, "forged", node, 2048)
    assert rsv.wait_for(custom, namespace, "forged")["status"]["phase"] == "Rejected"
    operator.stop()
    forged = {"phase": "Admitted", "reason": "Fits", "decisionID": "x", "decisionStamp": "0"}
    rsv.write_status(custom, namespace, "forged", forged)
    run_operator(config)
    status = rsv.wait_for(custom, namespace, "forged", ("Rejected",))["status"]
    assert status["decisionStamp"] != "0"
    reasons = {e.reason for e in core.list_namespaced_event(namespace).items}
    assert "UntrustedStatus" in reasons


def test_turning_the_key_on_for_an_existing_install_keeps_its_decisions(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    node = f"key-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    operator = run_operator()  # no decision key: statuses carry no stamp
    rsv.create(custom, namespace, "before", node, 4096)
    assert rsv.wait_for(custom, namespace, "before")["status"]["phase"] == "Admitted"
    operator.stop()
    set_node_memory(core, node, "4Gi")  # limit 3072: "before" would not fit if decided again

    secret = f"key-{uuid.uuid4().hex[:6]}"
    run_operator({"decisionKey": {"enabled": True, "namespace": namespace, "secretName": secret}})
    assert stamped_again(custom, namespace, "before")["phase"] == "Admitted"
    adopted_mark(core, namespace, secret, "true")
    key = base64.b64decode(core.read_namespaced_secret(secret, namespace).data["decision-key"])
    assert len(key) == 32


def test_a_created_key_carries_the_labels_and_an_existing_one_is_never_created(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    labels = {"app.kubernetes.io/instance": "ops", "app.kubernetes.io/managed-by": "Helm"}
    made = run_operator(
        {"decisionKey": {"enabled": True, "namespace": namespace, "labels": labels}}
    )
    secret = core.read_namespaced_secret("headroom-decision-key", namespace)
    assert labels.items() <= (secret.metadata.labels or {}).items()
    made.stop()

    # Made elsewhere (create: false): while it is missing the operator does not start.
    external = {"enabled": True, "namespace": namespace, "secretName": "corp", "create": False}
    waiting = run_operator({"decisionKey": external}, wait_ready=False)
    time.sleep(3)
    status, _ = waiting.get("/readyz")
    assert status != 200
    assert f"decision key Secret {namespace}/corp not found" in waiting.tail(400)
    waiting.stop()
    names = {s.metadata.name for s in core.list_namespaced_secret(namespace).items}
    assert "corp" not in names  # never created

    key = base64.b64encode(bytes(range(32))).decode()
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "corp"}, "data": {"decision-key": key}}
    )
    run_operator({"decisionKey": external})
    node = make_node(f"key-{uuid.uuid4().hex[:6]}", memory="5Gi").metadata.name
    rsv.create(custom, namespace, "stamped", node, 1024)
    assert rsv.wait_for(custom, namespace, "stamped")["status"]["phase"] == "Admitted"
