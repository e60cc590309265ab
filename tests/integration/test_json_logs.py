"""``headroom run --log-format json`` on the real control plane: every line a JSON object,
the reservation's fields on the lines about one (issue 23, item 5)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.integration.test_decision_key import adopted_mark
from tests.polling import eventually


def _stamped_again(custom: client.CustomObjectsApi, namespace: str, name: str) -> None:
    assert rsv.get(custom, namespace, name)["status"]["decisionStamp"] != "0"


def test_every_line_is_json_and_a_line_about_a_reservation_names_it(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = make_node(f"logs-{uuid.uuid4().hex[:6]}", memory="8Gi").metadata.name
    config = {"decisionKey": {"enabled": True, "namespace": namespace, "secretName": "key"}}
    first = run_operator(config)
    adopted_mark(core, namespace, "key", "true")  # a fresh install: nothing to adopt
    rsv.create(custom, namespace, "forged", node, 1024)
    assert rsv.wait_for(custom, namespace, "forged")["status"]["phase"] == "Admitted"
    first.stop()
    forged = {"phase": "Admitted", "reason": "Fits", "decisionID": "x", "decisionStamp": "0"}
    rsv.write_status(custom, namespace, "forged", forged)  # without the key: distrusted

    operator = run_operator(config, args=("--log-format=json",))
    rsv.create(custom, namespace, "plain", node, 1024)
    assert rsv.wait_for(custom, namespace, "plain")["status"]["phase"] == "Admitted"
    eventually(lambda: _stamped_again(custom, namespace, "forged"))
    operator.stop()

    lines = operator.log.read_text().splitlines()
    parsed = [json.loads(text) for text in lines]  # every line, kopf's included
    assert len(parsed) > 5
    for line in parsed:
        assert {"time", "level", "logger", "message"} <= line.keys(), line
    about = [line for line in parsed if line.get("name") == "forged"]
    assert about, "no line about the forged status"
    uid = rsv.get(custom, namespace, "forged")["metadata"]["uid"]
    assert (about[0]["namespace"], about[0]["uid"], about[0]["node"]) == (namespace, uid, node)
    assert about[0]["level"] == "WARNING"
    assert "not written by this operator" in about[0]["message"]
