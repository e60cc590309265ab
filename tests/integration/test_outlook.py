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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml
from kubernetes import client

from headroom.api.constants import OUTLOOK_MODE, RAM_ANNOTATION
from headroom.api.outlook import Outlook, Verdict, parse_warning
from headroom_dev import reservations as rsv
from headroom_dev.controlplane import free_port
from headroom_dev.operator import OperatorProcess
from tests.integration.conftest import OUTLOOK_TIMEOUT_SECONDS
from tests.integration.test_pod_gates import untaint
from tests.integration.test_webhook import Gate, pod_yaml
from tests.polling import eventually

Kubectl = Callable[..., CompletedProcess[str]]
TIMEOUT_SECONDS = OUTLOOK_TIMEOUT_SECONDS


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
    core: client.CoreV1Api,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    """The API server reaches the standby (the configuration's port): it hands the review
    to the leader, at the URL the leader wrote on its Lease, and the answer is the
    leader's outlook. With the leader stopped it answers itself, in time, with none."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")
    untaint(core, node)
    election = {"enabled": True, "namespace": namespace, "leaseName": f"lease-{outlook.name}"}
    leader = run_operator({**outlook.config(free_port()), "leaderElection": election})
    leader.wait_ready(body="ok")
    standby = run_operator({**outlook.config(), "leaderElection": election}, wait_ready=False)
    standby.wait_ready(body="standby")
    wait_for_outlooks(kubectl, namespace, node)  # only the leader has one to give
    # An opted-in pod's review too: the standby hands it over whole, gate and outlook.
    pod = kubectl(
        "apply", "-n", namespace, "-f", "-", input=pod_yaml("claims", {RAM_ANNOTATION: "1Gi"})
    )
    assert pod.returncode == 0, pod.stderr
    assert [o.verdict for o in outlooks(pod.stderr)] == [Verdict.ADMITTED], pod.stderr

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


STRICT = {OUTLOOK_MODE: "strict"}


def label_strict(core: client.CoreV1Api, kubectl: Kubectl, namespace: str, node: str) -> None:
    """Label the namespace strict, and wait until the operator has seen the label."""
    core.patch_namespace(namespace, {"metadata": {"labels": STRICT}})

    def refused() -> None:
        result = kubectl(
            "apply",
            "-n",
            namespace,
            "-f",
            "-",
            "--dry-run=server",
            input=reservation_yaml("probe", node, 1_000_000),
        )
        assert result.returncode != 0, result.stderr

    eventually(refused, timeout=15, retry_on=(AssertionError,))


def strict_config(gate: Gate) -> dict[str, Any]:
    config = gate.config()
    config["webhook"]["provisionalHold"] = "3s"
    return config


def test_strict_mode_refuses_at_create_what_the_ledger_would_reject(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")  # 10240 MiB allocatable
    run_operator(strict_config(outlook))
    wait_for_outlooks(kubectl, namespace, node)
    # The annotation alone: refused at create (it holds nothing when admitted).
    annotated = rsv.reservation("annotated", node, 20_000)
    annotated["metadata"]["annotations"] = STRICT
    result = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(annotated))
    assert result.returncode != 0, result.stderr
    assert "denied the request" in result.stderr, result.stderr
    assert "InsufficientRAM" in result.stderr, result.stderr

    label_strict(core, kubectl, namespace, node)
    result = kubectl(
        "apply", "-n", namespace, "-f", "-", input=reservation_yaml("huge", node, 20_000)
    )
    assert result.returncode != 0, result.stderr
    assert "InsufficientRAM" in result.stderr, result.stderr
    assert rsv.list_all(custom, namespace) == []

    # A dry run is refused the same way, and holds nothing.
    tried = kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        "--dry-run=server",
        input=reservation_yaml("tried", node, 20_000),
    )
    assert tried.returncode != 0
    assert "InsufficientRAM" in tried.stderr

    fits = apply(kubectl, namespace, reservation_yaml("fits", node, 9000))
    assert fits.verdict is Verdict.ADMITTED
    assert rsv.wait_for(custom, namespace, "fits")["status"]["phase"] == "Admitted"

    # What would wait is not refused: it is created, and waits.
    waits = apply(kubectl, namespace, reservation_yaml("waits", node, 9000, wait="5m"))
    assert (waits.verdict, waits.position) == (Verdict.QUEUED, 1)


def test_strict_concurrent_creates_are_never_told_admitted_past_the_room(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    """64 creates at once for a node with room for 10: exactly 10 are let in (each holds
    its room from its answer on), the others are refused at create, and the 10 are
    decided Admitted, as they were told."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")  # 10240 MiB: 10 × 1000 MiB
    run_operator(strict_config(outlook))
    wait_for_outlooks(kubectl, namespace, node)
    label_strict(core, kubectl, namespace, node)

    def create(index: int) -> str:
        body = rsv.reservation(f"r-{index:02d}", node, 1000)
        try:
            custom.create_namespaced_custom_object(
                "headroom.dev", "v1alpha1", namespace, "reservations", body
            )
        except client.ApiException as error:
            refused = error.status == 403 and "InsufficientRAM" in str(error.body)
            return "refused" if refused else f"{error.status}: {error.body}"
        return "let in"

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(create, range(64)))
    assert sorted(set(answers)) == ["let in", "refused"], answers
    assert answers.count("let in") == 10
    created = [r["metadata"]["name"] for r in rsv.list_all(custom, namespace)]
    assert len(created) == 10
    phases = [rsv.wait_for(custom, namespace, name)["status"]["phase"] for name in created]
    assert phases == ["Admitted"] * 10


def test_a_create_that_fails_after_being_allowed_gives_its_hold_back(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    """A create whose name a Rejected reservation keeps fails as AlreadyExists after the
    review: it is held nothing, so the room goes at once to the next create. One refused
    after the webhook allowed it (here by a ResourceQuota, whose admission runs after the
    webhooks) had its room held for a create that never comes, until ``provisionalHold``
    (3 s here) gives it back."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")
    run_operator(strict_config(outlook))
    wait_for_outlooks(kubectl, namespace, node)
    rsv.create(custom, namespace, "taken", node, 20_000)
    assert rsv.wait_for(custom, namespace, "taken")["status"]["phase"] == "Rejected"

    label_strict(core, kubectl, namespace, node)

    def strict(name: str, ram_mb: int) -> None:
        body = rsv.reservation(name, node, ram_mb)
        custom.create_namespaced_custom_object(
            "headroom.dev", "v1alpha1", namespace, "reservations", body
        )

    with pytest.raises(client.ApiException) as exists:
        strict("taken", 9000)  # fits, but the name is kept by the rejected one
    assert exists.value.status == 409
    strict("other", 9000)  # nothing was held for the create that failed
    assert rsv.wait_for(custom, namespace, "other")["status"]["phase"] == "Admitted"
    rsv.delete(custom, namespace, "other")
    eventually(lambda: strict("again", 9000), timeout=15, retry_on=(client.ApiException,))
    rsv.delete(custom, namespace, "again")  # its room comes back once the deletion is seen

    no_more = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="no-more"),
        spec=client.V1ResourceQuotaSpec(hard={"count/reservations.headroom.dev": "0"}),
    )
    core.create_namespaced_resource_quota(namespace, no_more)
    # No quota controller runs here: its usage is written as the controller would.
    counted = {"count/reservations.headroom.dev": "0"}
    core.patch_namespaced_resource_quota_status(
        "no-more", namespace, {"status": {"hard": counted, "used": counted}}
    )

    def quota_in_force() -> None:  # a dry run holds nothing: until admission has the quota
        body = rsv.reservation("probe", node, 1)
        with pytest.raises(client.ApiException) as quota:
            custom.create_namespaced_custom_object(
                "headroom.dev", "v1alpha1", namespace, "reservations", body, dry_run="All"
            )
        assert quota.value.status == 403

    eventually(quota_in_force, timeout=15, retry_on=(pytest.fail.Exception,))
    with pytest.raises(client.ApiException) as quota:
        strict("held", 9000)  # allowed and held by the webhook, then refused
    assert quota.value.status == 403
    assert "refused at create" not in str(quota.value.body), quota.value.body
    core.delete_namespaced_resource_quota("no-more", namespace)
    seen: list[str] = []

    def let_in() -> None:
        try:
            strict("later", 9000)
        except client.ApiException as error:
            seen.append(str(error.body))
            raise

    eventually(let_in, timeout=15, retry_on=(client.ApiException,))
    assert any("refused at create" in body for body in seen), "the hold was there first"
    assert rsv.wait_for(custom, namespace, "later")["status"]["phase"] == "Admitted"


def test_with_the_leader_killed_creates_go_on_and_the_new_leader_answers(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    """The leader is killed: the standby (where the configuration sends reviews) cannot
    reach it and answers at once with no outlook; once it has taken the Lease and
    rebuilt, it answers from its own ledger, which holds what was admitted before."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")  # 10240 MiB
    election = {
        "enabled": True,
        "namespace": namespace,
        "leaseName": f"lease-{outlook.name}",
        "leaseDuration": "3s",
        "renewDeadline": "2s",
        "retryPeriod": "0.5s",
    }
    leader = run_operator({**outlook.config(free_port()), "leaderElection": election})
    leader.wait_ready(body="ok")
    standby = run_operator({**outlook.config(), "leaderElection": election}, wait_ready=False)
    standby.wait_ready(body="standby")
    wait_for_outlooks(kubectl, namespace, node)
    assert apply(kubectl, namespace, reservation_yaml("before", node, 6000)).node == node
    assert rsv.wait_for(custom, namespace, "before")["status"]["phase"] == "Admitted"

    assert leader.popen is not None
    leader.popen.kill()
    leader.popen.wait(10)
    started = time.monotonic()
    during = apply(kubectl, namespace, reservation_yaml("during", node, 100))
    took = time.monotonic() - started
    assert during.verdict is Verdict.UNKNOWN, during
    assert took < TIMEOUT_SECONDS + 1.0, f"the create waited {took:.2f}s"

    standby.wait_ready(timeout=60, body="ok")
    after = apply(kubectl, namespace, reservation_yaml("after", node, 6000), "--dry-run=server")
    assert (after.verdict, after.reason) == (Verdict.REJECTED, "InsufficientRAM"), after
    assert rsv.wait_for(custom, namespace, "during")["status"]["phase"] == "Admitted"


def test_an_opted_in_pods_create_says_where_its_claim_would_go(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    """The gating webhook's answer carries the outlook of the pod's claim, on the node
    the gate would choose: admitted there, or waiting there in the queue."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")  # 10240 MiB; the only node, so the gate's choice
    untaint(core, node)
    run_operator(outlook.config())
    wait_for_outlooks(kubectl, namespace, node)

    def created(name: str, ram: str) -> Outlook:
        result = kubectl(
            "apply", "-n", namespace, "-f", "-", input=pod_yaml(name, {RAM_ANNOTATION: ram})
        )
        assert result.returncode == 0, result.stderr
        (said,) = outlooks(result.stderr)
        return said

    first = created("first", "6000Mi")
    assert (first.verdict, first.node) == (Verdict.ADMITTED, node), first
    assert first.detail.startswith("6000 of 10240 MiB RAM free"), first

    def waits() -> None:  # once the first one's reservation holds its room
        said = created(f"second-{uuid.uuid4().hex[:4]}", "6000Mi")
        assert (said.verdict, said.node, said.reason) == (Verdict.QUEUED, node, "InsufficientRAM")

    eventually(waits, timeout=15, retry_on=(AssertionError,))
