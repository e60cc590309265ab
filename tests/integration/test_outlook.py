"""The answer at ``kubectl apply`` (issue 32): the outlook as warnings, on the real API server.

The operator runs as a process with its webhook on loopback, registered by URL (a
ValidatingWebhookConfiguration of the chart's shape, the caBundle patched in by the
operator). kubectl prints the warnings on stderr; a server-side dry run gets the
same answer with nothing stored. The decision made afterwards must agree with what
was said, and a replica that cannot say (a standby, a stopped process) never holds
a create up beyond the webhook's timeout.
"""

from __future__ import annotations

import base64
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml
from kubernetes import client

from headroom.api.outlook import Outlook, Verdict, parse_warning
from headroom_dev import reservations as rsv
from headroom_dev.controlplane import free_port
from headroom_dev.operator import OperatorProcess
from headroom_dev.webhooks import OUTLOOK_PATH, outlook_configuration
from tests.integration.test_webhook import Gate
from tests.polling import eventually

Kubectl = Callable[..., CompletedProcess[str]]
TIMEOUT_SECONDS = 2


@pytest.fixture
def admission(api_client: client.ApiClient) -> client.AdmissionregistrationV1Api:
    return client.AdmissionregistrationV1Api(api_client)


@pytest.fixture
def outlook(admission: client.AdmissionregistrationV1Api, namespace: str) -> Iterator[Gate]:
    """The Reservations' validating configuration, sent to ``gate.port`` on loopback,
    beside the pods' mutating one of the same name, as the chart has them; the operator
    keeps the caBundle of both (``webhookConfiguration`` names them)."""
    gate = Gate(admission, namespace, "kube-system")
    gate.register()
    admission.create_validating_webhook_configuration(
        outlook_configuration(
            gate.name,
            f"https://127.0.0.1:{gate.port}{OUTLOOK_PATH}",
            timeout_seconds=TIMEOUT_SECONDS,
        )
    )
    yield gate
    admission.delete_validating_webhook_configuration(gate.name)
    admission.delete_mutating_webhook_configuration(gate.name)


def reservation_yaml(name: str, node: str, ram_mb: int, **spec: Any) -> str:
    return yaml.safe_dump(rsv.reservation(name, node, ram_mb, **spec))


def outlooks(stderr: str) -> list[Outlook]:
    """The outlooks kubectl printed (``Warning: ...`` lines)."""
    said = [line.removeprefix("Warning: ") for line in stderr.splitlines()]
    return [o for o in map(parse_warning, said) if o is not None]


def apply(kubectl: Kubectl, namespace: str, body: str, *flags: str) -> Outlook:
    result = kubectl("apply", "-n", namespace, "-f", "-", *flags, input=body)
    assert result.returncode == 0, result.stderr
    found = outlooks(result.stderr)
    assert len(found) == 1, result.stderr
    return found[0]


def wait_for_outlooks(kubectl: Kubectl, namespace: str, node: str) -> None:
    """Once the API server trusts the published caBundle and the leader has rebuilt, a
    dry run gets an outlook (until then the webhook fails open: no warning)."""

    def answered() -> None:
        said = apply(kubectl, namespace, reservation_yaml("probe", node, 1), "--dry-run=server")
        assert said.verdict is Verdict.ADMITTED, said

    eventually(answered, timeout=30, retry_on=(AssertionError,))


def test_apply_says_admitted_queued_or_rejected_and_the_decision_agrees(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")  # 11264 MiB − 1024 reserve: 10240 MiB allocatable
    run_operator(outlook.config())
    wait_for_outlooks(kubectl, namespace, node)

    first = apply(kubectl, namespace, reservation_yaml("first", node, 6000))
    assert first.verdict is Verdict.ADMITTED
    assert first.node == node
    assert first.detail.startswith("6000 of 10240 MiB RAM free"), first
    assert rsv.wait_for(custom, namespace, "first")["status"]["phase"] == "Admitted"

    # A dry run: the same answer, nothing stored, nothing held.
    tried = apply(kubectl, namespace, reservation_yaml("tried", node, 6000), "--dry-run=server")
    assert (tried.verdict, tried.reason) == (Verdict.REJECTED, "InsufficientRAM"), tried
    assert [r["metadata"]["name"] for r in rsv.list_all(custom, namespace)] == ["first"]

    for position, name in enumerate(("second", "third"), start=1):
        said = apply(kubectl, namespace, reservation_yaml(name, node, 6000, wait="5m"))
        assert (said.verdict, said.node, said.position) == (Verdict.QUEUED, node, position)
        assert said.reason == "InsufficientRAM"
        status = rsv.wait_for(custom, namespace, name, phases=("Queued",))["status"]
        assert (status["phase"], status["queuePosition"]) == ("Queued", position), status

    refused = apply(kubectl, namespace, reservation_yaml("huge", node, 20_000))
    assert (refused.verdict, refused.reason) == (Verdict.REJECTED, "InsufficientRAM")
    status = rsv.wait_for(custom, namespace, "huge")["status"]
    assert (status["phase"], status["reason"]) == ("Rejected", "InsufficientRAM")
    assert refused.detail == status["message"]

    nowhere = apply(kubectl, namespace, reservation_yaml("nowhere", "no-such-node", 1))
    assert (nowhere.verdict, nowhere.reason) == (Verdict.REJECTED, "NodeUnknown")


def test_a_standby_forwards_to_the_leader_and_answers_alone_when_it_cannot(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    kubectl: Kubectl,
    namespace: str,
) -> None:
    """The API server reaches the standby (the configuration's port): it hands the review
    to the leader, at the URL the leader wrote on its Lease, and the answer is the
    leader's outlook. With the leader stopped it answers itself, in time, with none."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")
    election = {"enabled": True, "namespace": namespace, "leaseName": f"lease-{outlook.name}"}
    leader = run_operator({**outlook.config(free_port()), "leaderElection": election})
    leader.wait_ready(body="ok")
    standby = run_operator({**outlook.config(), "leaderElection": election}, wait_ready=False)
    standby.wait_ready(body="standby")
    wait_for_outlooks(kubectl, namespace, node)  # only the leader has one to give

    assert leader.popen is not None
    leader.popen.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        result = kubectl(
            "apply",
            "-n",
            namespace,
            "-f",
            "-",
            "--dry-run=server",
            input=reservation_yaml("while-hung", node, 1),
        )
        took = time.monotonic() - started
    finally:
        leader.popen.send_signal(signal.SIGCONT)
    assert result.returncode == 0, result.stderr
    (said,) = outlooks(result.stderr)
    assert said.verdict is Verdict.UNKNOWN, said
    assert took < TIMEOUT_SECONDS + 1.0, f"the create waited {took:.2f}s"


def test_a_standby_with_no_leader_to_forward_to_says_so(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    kubectl: Kubectl,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")
    election = {"enabled": True, "namespace": namespace, "leaseName": f"lease-{outlook.name}"}
    # Listening on every address, with no $POD_IP: the leader has no URL to advertise.
    unadvertised = outlook.config(free_port())
    unadvertised["webhook"]["host"] = "0.0.0.0"
    leader = run_operator({**unadvertised, "leaderElection": election})
    leader.wait_ready(body="ok")
    standby = run_operator({**outlook.config(), "leaderElection": election}, wait_ready=False)
    standby.wait_ready(body="standby")

    def answered() -> None:
        said = apply(kubectl, namespace, reservation_yaml("probe", node, 1), "--dry-run=server")
        assert said.verdict is Verdict.UNKNOWN, said
        assert "does not decide now" in said.detail

    eventually(answered, timeout=30, retry_on=(AssertionError,))


def test_a_stopped_operator_holds_a_create_up_no_longer_than_the_timeout(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")
    operator = run_operator(outlook.config())
    wait_for_outlooks(kubectl, namespace, node)
    assert operator.popen is not None
    operator.popen.send_signal(signal.SIGSTOP)  # hung: the review's connection is never read
    try:
        started = time.monotonic()
        rsv.create(custom, namespace, "while-hung", node, 1000)
        took = time.monotonic() - started
    finally:
        operator.popen.send_signal(signal.SIGCONT)
    # The contract's bound (issue 32): timeoutSeconds, then failurePolicy Ignore lets it in.
    assert took < TIMEOUT_SECONDS + 1.0, f"the create waited {took:.2f}s"
    assert rsv.wait_for(custom, namespace, "while-hung")["status"]["phase"] == "Admitted"


def test_the_operator_keeps_the_validating_configurations_ca_bundle(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    admission: client.AdmissionregistrationV1Api,
    core: client.CoreV1Api,
) -> None:
    run_operator(outlook.config())

    def published() -> None:
        configuration = admission.read_validating_webhook_configuration(outlook.name)
        raw = configuration.webhooks[0].client_config.ca_bundle
        secret = core.read_namespaced_secret(outlook.secret, outlook.namespace)
        assert raw
        assert base64.b64decode(raw) == base64.b64decode(secret.data["ca-bundle.crt"])

    eventually(published, timeout=30, retry_on=(AssertionError, TypeError))
