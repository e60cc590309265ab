"""The webhook during a takeover (issue 29, item 14): it answers from every replica
that has its certificate, leader, standby or rebuilding, and while one stops.

In a cluster the API server reaches the webhook through its Service, which routes to
ready pods only, and under ``failurePolicy: Fail`` every opted-in pod create that
finds no answer is refused. So a replica rebuilding its ledger must stay ready
(its webhook needs no ledger), and a stopping one must go on answering for
``webhook.drainDelay`` (its endpoint leaves the Service only as the EndpointSlice
controller and the API server see it go, and the API server keeps its connections
open) while it hands the Lease over at once. Here the webhook is registered by
URL, so the API server keeps sending to the replica that stops, as it would to a
terminating pod until its endpoint is gone. On the real node, through the chart's
Service: tests/e2e/test_webhook_takeover_on_node.py.
"""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import uuid
from collections.abc import Callable, Iterator
from subprocess import CompletedProcess
from typing import Any

import pytest
from kubernetes import client

from headroom.api.constants import RAM_ANNOTATION, SCHEDULING_GATE
from headroom_dev.controlplane import free_port
from headroom_dev.operator import OperatorProcess
from headroom_dev.webhooks import PATH
from tests.integration.test_webhook import Gate, pod_yaml, wait_until_gating
from tests.integration.test_webhook_server import REVIEW
from tests.polling import eventually

Kubectl = Callable[..., CompletedProcess[str]]
DRAIN = "60s"  # far longer than a takeover: these tests end the drain with a second signal


@pytest.fixture
def gate(
    api_client: client.ApiClient, namespace: str, make_namespace: Callable[[], str]
) -> Iterator[Gate]:
    admission = client.AdmissionregistrationV1Api(api_client)
    registered = Gate(admission, namespace, make_namespace())
    registered.register()  # failurePolicy: Fail, as the chart's default
    yield registered
    admission.delete_mutating_webhook_configuration(registered.name)


def draining(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "webhook": {**config["webhook"], "drainDelay": DRAIN}}


def review(port: int) -> tuple[int, str | None, dict[str, Any]]:
    """POST one AdmissionReview to a replica's webhook: status, Connection header, body."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
    try:
        body = json.dumps(REVIEW)
        conn.request("POST", PATH, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer: dict[str, Any] = json.loads(response.read())
        return response.status, response.getheader("Connection"), answer
    finally:
        conn.close()


def gated(core: client.CoreV1Api, kubectl: Kubectl, namespace: str) -> None:
    """An opted-in pod created now through the API server is created, behind the gate."""
    name = f"during-{uuid.uuid4().hex[:6]}"
    made = kubectl(
        "apply", "-n", namespace, "-f", "-", input=pod_yaml(name, {RAM_ANNOTATION: "1Gi"})
    )
    assert made.returncode == 0, made.stderr
    gates = core.read_namespaced_pod(name, namespace).spec.scheduling_gates or []
    assert [g.name for g in gates] == [SCHEDULING_GATE]


def exits_cleanly_on_a_second_signal(process: OperatorProcess) -> None:
    assert process.popen is not None
    process.popen.send_signal(signal.SIGINT)  # ends the drain at once
    assert process.popen.wait(timeout=30) == 0, process.tail()


def test_a_leader_rebuilding_its_ledger_is_ready_since_its_webhook_answers(
    gate: Gate,
    run_operator: Callable[..., OperatorProcess],
    core: client.CoreV1Api,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    """Held before its rebuild (its decision key Secret is missing), the leader
    answers the webhook, so the Service must keep routing to it: /readyz 200."""
    key = {"enabled": True, "namespace": namespace, "secretName": "corp", "create": False}
    operator = run_operator({**gate.config(), "decisionKey": key}, wait_ready=False)
    wait_until_gating(kubectl, namespace)
    missing = f"decision key Secret {namespace}/corp not found"
    eventually(lambda: _equal(missing in operator.tail(400), True), timeout=30)
    assert operator.get("/readyz") == (200, "rebuilding the ledger")
    gated(core, kubectl, namespace)


def test_a_stopping_leader_hands_the_lease_over_at_once_and_answers_while_it_drains(
    gate: Gate,
    run_operator: Callable[..., OperatorProcess],
    core: client.CoreV1Api,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    election = {"enabled": True, "namespace": namespace, "leaseName": f"lease-{gate.name}"}
    leader = run_operator({**draining(gate.config()), "leaderElection": election})
    leader.wait_ready(body="ok")
    standby = run_operator(
        {**gate.config(free_port()), "leaderElection": election}, wait_ready=False
    )
    standby.wait_ready(body="standby")
    wait_until_gating(kubectl, namespace)  # the configuration sends reviews to the leader
    assert leader.popen is not None

    leader.popen.send_signal(signal.SIGTERM)  # what the kubelet sends a deleted pod
    standby.wait_ready(timeout=60, body="ok")  # the Lease moved: the standby decides
    assert leader.popen.poll() is None, leader.tail()  # ...while the old leader drains
    assert leader.get("/readyz") == (503, "stopping")
    status, connection, answer = review(gate.port)
    gated(core, kubectl, namespace)  # the API server's review found it answering
    assert status == 200
    assert answer["response"]["allowed"] is True
    assert "patch" in answer["response"]
    # Each answer closes its connection: the API server's next review dials again and
    # goes, through the Service, to a replica that stays.
    assert connection == "close"
    exits_cleanly_on_a_second_signal(leader)


def test_a_standby_stopped_while_it_waits_for_the_lease_drains_too(
    gate: Gate,
    run_operator: Callable[..., OperatorProcess],
    namespace: str,
) -> None:
    election = {"enabled": True, "namespace": namespace, "leaseName": f"lease-{gate.name}"}
    leader = run_operator({**gate.config(), "leaderElection": election})
    port = free_port()
    standby = run_operator(
        {**draining(gate.config(port)), "leaderElection": election}, wait_ready=False
    )
    standby.wait_ready(body="standby")
    assert standby.popen is not None

    standby.popen.send_signal(signal.SIGTERM)
    eventually(lambda: _equal(standby.get("/readyz"), (503, "stopping")), timeout=10)
    status, connection, answer = review(port)
    assert (status, connection) == (200, "close")
    assert answer["response"]["allowed"] is True
    exits_cleanly_on_a_second_signal(standby)
    assert leader.get("/readyz") == (200, "ok")  # the leader never noticed


def _equal(got: object, expected: object) -> None:
    assert got == expected, got
