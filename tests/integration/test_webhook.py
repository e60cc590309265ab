"""The gating webhook on the real API server, with the real admission chain.

The operator runs as a process with the webhook on, registered by URL on
loopback (there is no Service routing here), but with everything else as in a
cluster: the operator creates the certificate Secret, patches the caBundle into
the configuration, and the API server verifies the served certificate against it.
There is no scheduler here, so a gated pod is asserted by its spec.
"""

from __future__ import annotations

import base64
import socket
import ssl
import uuid
from collections.abc import Callable, Iterator
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml
from kubernetes import client

from headroom.api.constants import CLAIM_LABEL, RAM_ANNOTATION, SCHEDULING_GATE
from headroom_dev.controlplane import free_port
from headroom_dev.operator import OperatorProcess
from headroom_dev.webhooks import PATH, gating_configuration
from tests.polling import eventually

Kubectl = Callable[..., CompletedProcess[str]]
GATE = [{"name": SCHEDULING_GATE}]


@pytest.fixture
def admission(api_client: client.ApiClient) -> client.AdmissionregistrationV1Api:
    return client.AdmissionregistrationV1Api(api_client)


@pytest.fixture
def excluded(core: client.CoreV1Api) -> Iterator[str]:
    """A namespace the webhook never matches, as the operator's own is in the chart."""
    name = f"t-excluded-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name)


class Gate:
    """One registered configuration and the operator config that serves it."""

    def __init__(self, admission: client.AdmissionregistrationV1Api, namespace: str, excluded: str):
        self.admission = admission
        self.name = f"headroom-test-{uuid.uuid4().hex[:6]}"
        self.namespace, self.excluded = namespace, excluded
        self.port = free_port()
        self.secret = "headroom-webhook-cert"

    def register(self, failure_policy: str = "Fail") -> None:
        self.admission.create_mutating_webhook_configuration(
            gating_configuration(
                self.name,
                f"https://127.0.0.1:{self.port}{PATH}",
                excluded_namespaces=(self.excluded, "kube-system"),
                failure_policy=failure_policy,
            )
        )

    def config(self, port: int | None = None, **certificate: Any) -> dict[str, Any]:
        return {
            "webhook": {
                "enabled": True,
                "host": "127.0.0.1",
                "port": port or self.port,
                "certificate": {
                    "namespace": self.namespace,
                    "secretName": self.secret,
                    "extraNames": ["127.0.0.1"],
                    "webhookConfiguration": self.name,
                    "checkPeriod": "1s",
                    **certificate,
                },
            }
        }

    def ca_bundle(self) -> bytes:
        configuration = self.admission.read_mutating_webhook_configuration(self.name)
        raw = configuration.webhooks[0].client_config.ca_bundle
        return base64.b64decode(raw) if raw else b""


@pytest.fixture
def gate(
    admission: client.AdmissionregistrationV1Api, namespace: str, excluded: str
) -> Iterator[Gate]:
    registered = Gate(admission, namespace, excluded)
    registered.register()
    yield registered
    # Removed first: a Fail-policy webhook left behind would refuse later tests' pods.
    admission.delete_mutating_webhook_configuration(registered.name)


def pod_yaml(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> str:
    labels = {CLAIM_LABEL: "true"} if annotations is not None else {}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
    }
    return yaml.safe_dump(body)


def secret_data(core: client.CoreV1Api, gate: Gate) -> dict[str, bytes]:
    secret = core.read_namespaced_secret(gate.secret, gate.namespace)
    return {k: base64.b64decode(v) for k, v in secret.data.items()}


def served_certificate(port: int) -> bytes:
    """The PEM certificate a replica serves now (not verified: it is compared)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return ssl.DER_cert_to_PEM_cert(der).encode()


def same_cert(a: bytes, b: bytes) -> bool:
    return b"".join(a.split()) == b"".join(b.split())


def wait_until_gating(kubectl: Kubectl, namespace: str) -> None:
    """The first create succeeds once the API server trusts the published caBundle."""
    probe = f"probe-{uuid.uuid4().hex[:6]}"

    def created() -> None:
        result = kubectl(
            "apply", "-n", namespace, "-f", "-", input=pod_yaml(probe, {RAM_ANNOTATION: "1Gi"})
        )
        assert result.returncode == 0, result.stderr

    eventually(created, timeout=30)
    kubectl("delete", "pod", probe, "-n", namespace, "--grace-period=0", "--wait=false")


def test_opted_in_pods_are_gated_bad_ones_refused_others_untouched(
    gate: Gate,
    run_operator: Callable[..., OperatorProcess],
    core: client.CoreV1Api,
    kubectl: Kubectl,
    namespace: str,
    excluded: str,
) -> None:
    operator = run_operator(gate.config())
    data = secret_data(core, gate)
    eventually(lambda: _assert(gate.ca_bundle() == data["ca-bundle.crt"]))
    assert same_cert(served_certificate(gate.port), data["tls.crt"])
    assert "BEGIN" not in operator.tail(400)  # no PEM, above all no key, in the log
    wait_until_gating(kubectl, namespace)

    applied = kubectl(
        "apply", "-n", namespace, "-f", "-", input=pod_yaml("gated", {RAM_ANNOTATION: "8Gi"})
    )
    assert applied.returncode == 0, applied.stderr
    gated = core.read_namespaced_pod("gated", namespace)
    assert [g.to_dict() for g in gated.spec.scheduling_gates] == GATE
    assert gated.spec.node_name is None

    kept = pod_yaml(
        "two-gates", {RAM_ANNOTATION: "1Gi"}, schedulingGates=[{"name": "example.com/other"}]
    )
    assert kubectl("apply", "-n", namespace, "-f", "-", input=kept).returncode == 0
    gates = core.read_namespaced_pod("two-gates", namespace).spec.scheduling_gates
    assert [g.name for g in gates] == ["example.com/other", SCHEDULING_GATE]

    refused = kubectl(
        "apply", "-n", namespace, "-f", "-", input=pod_yaml("bad", {RAM_ANNOTATION: "8 gigs"})
    )
    assert refused.returncode != 0
    assert "denied the request" in refused.stderr
    assert "annotation headroom.dev/ram" in refused.stderr
    assert "'8 gigs'" in refused.stderr
    pinned = kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=pod_yaml("pinned", {RAM_ANNOTATION: "1Gi"}, nodeName="node-a"),
    )
    assert pinned.returncode != 0
    assert "spec.nodeName" in pinned.stderr
    assert "headroom.dev/node" in pinned.stderr

    plain = kubectl("apply", "-n", namespace, "-f", "-", input=pod_yaml("plain"))
    assert plain.returncode == 0, plain.stderr
    assert core.read_namespaced_pod("plain", namespace).spec.scheduling_gates is None

    # In an excluded namespace the webhook is not even called: a bad value passes.
    elsewhere = pod_yaml("elsewhere", {RAM_ANNOTATION: "8 gigs"})
    result = kubectl("apply", "-n", excluded, "-f", "-", input=elsewhere)
    assert result.returncode == 0, result.stderr
    assert core.read_namespaced_pod("elsewhere", excluded).spec.scheduling_gates is None

    # Every review the API server sent is counted by its result (the probes of
    # wait_until_gating were gated too: patched at least three times, denied twice).
    reviews = operator.metrics()
    assert reviews['headroom_webhook_reviews_total{result="patched"}'] >= 3
    assert reviews['headroom_webhook_reviews_total{result="denied"}'] == 2
    assert reviews['headroom_webhook_reviews_total{result="error"}'] == 0
    assert reviews["headroom_webhook_review_seconds_count"] == sum(
        reviews[f'headroom_webhook_reviews_total{{result="{result}"}}']
        for result in ("allowed", "patched", "denied", "error")
    )


def _assert(condition: bool) -> None:
    assert condition


def test_two_replicas_share_one_secret_and_serve_the_same_certificate(
    gate: Gate,
    run_operator: Callable[..., OperatorProcess],
    core: client.CoreV1Api,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    election = {"enabled": True, "namespace": namespace, "leaseName": f"lease-{gate.name}"}
    second_port = free_port()
    first = run_operator({**gate.config(), "leaderElection": election}, wait_ready=False)
    second = run_operator(
        {**gate.config(second_port), "leaderElection": election}, wait_ready=False
    )
    first.wait_ready()
    second.wait_ready()  # the standby serves the webhook too, and says ready once it can
    secret = core.read_namespaced_secret(gate.secret, gate.namespace)
    data = secret_data(core, gate)
    for port in (gate.port, second_port):
        assert same_cert(served_certificate(port), data["tls.crt"])
    eventually(lambda: _assert(gate.ca_bundle() == data["ca-bundle.crt"]))
    wait_until_gating(kubectl, namespace)
    again = core.read_namespaced_secret(gate.secret, gate.namespace)
    assert again.metadata.uid == secret.metadata.uid
    assert again.metadata.resource_version == secret.metadata.resource_version
    created = [
        line for op in (first, second) for line in op.tail(400).splitlines() if "written" in line
    ]
    assert len(created) == 1, created


def test_a_wiped_ca_bundle_and_a_deleted_secret_are_mended(
    gate: Gate,
    run_operator: Callable[..., OperatorProcess],
    core: client.CoreV1Api,
    admission: client.AdmissionregistrationV1Api,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    run_operator(gate.config())
    before = secret_data(core, gate)
    eventually(lambda: _assert(gate.ca_bundle() == before["ca-bundle.crt"]))
    # A tool that replaces the configuration wholesale (no caBundle in its copy).
    live = admission.read_mutating_webhook_configuration(gate.name)
    live.webhooks[0].client_config.ca_bundle = None
    admission.replace_mutating_webhook_configuration(gate.name, live)
    assert gate.ca_bundle() == b""
    eventually(lambda: _assert(gate.ca_bundle() == before["ca-bundle.crt"]), timeout=15)
    # The Secret deleted: a new CA and certificate, published and served.
    core.delete_namespaced_secret(gate.secret, namespace)

    def recreated() -> None:
        try:
            assert secret_data(core, gate)["ca.crt"] != before["ca.crt"]
        except client.ApiException as error:
            raise AssertionError(error.reason) from None

    eventually(recreated)
    after = secret_data(core, gate)
    eventually(lambda: _assert(gate.ca_bundle() == after["ca-bundle.crt"]), timeout=15)
    eventually(lambda: _assert(same_cert(served_certificate(gate.port), after["tls.crt"])))
    wait_until_gating(kubectl, namespace)
    applied = kubectl(
        "apply", "-n", namespace, "-f", "-", input=pod_yaml("late", {RAM_ANNOTATION: "1Gi"})
    )
    assert applied.returncode == 0, applied.stderr
    assert (
        core.read_namespaced_pod("late", namespace).spec.scheduling_gates[0].name == SCHEDULING_GATE
    )


def test_with_the_webhook_down_fail_refuses_opted_in_pods_only(
    gate: Gate,
    run_operator: Callable[..., OperatorProcess],
    core: client.CoreV1Api,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    operator = run_operator(gate.config())
    wait_until_gating(kubectl, namespace)
    operator.stop()
    refused = kubectl(
        "apply", "-n", namespace, "-f", "-", input=pod_yaml("opted", {RAM_ANNOTATION: "1Gi"})
    )
    assert refused.returncode != 0
    assert "failed calling webhook" in refused.stderr, refused.stderr
    with pytest.raises(client.ApiException):
        core.read_namespaced_pod("opted", namespace)
    plain = kubectl("apply", "-n", namespace, "-f", "-", input=pod_yaml("plain"))
    assert plain.returncode == 0, plain.stderr


def test_readiness_waits_for_the_serving_certificate(
    gate: Gate, run_operator: Callable[..., OperatorProcess], namespace: str
) -> None:
    # A Secret the operator may not read yet: a name in a namespace that does not exist.
    operator = run_operator(
        gate.config(namespace=f"missing-{uuid.uuid4().hex[:6]}"), wait_ready=False
    )
    eventually(lambda: _assert("not synced" in operator.tail(100)), timeout=30)
    status, text = operator.get("/readyz")
    assert (status, text) == (503, "no webhook serving certificate loaded yet")


def this_machines_address() -> str:
    """A non-loopback IPv4 address of this machine (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))
        address = probe.getsockname()[0]
    assert not address.startswith("127."), "no non-loopback IPv4 address for an EndpointSlice"
    return str(address)


def test_the_api_server_reaches_the_webhook_through_its_service(
    admission: client.AdmissionregistrationV1Api,
    api_client: client.ApiClient,
    run_operator: Callable[..., OperatorProcess],
    core: client.CoreV1Api,
    kubectl: Kubectl,
    namespace: str,
    excluded: str,
) -> None:
    """As on the real node: kube-apiserver (--enable-aggregator-routing) resolves the
    Service to a ready EndpointSlice address, no kube-proxy, and verifies the served
    certificate for the Service's DNS name against the caBundle the operator wrote."""
    address, port = this_machines_address(), free_port()
    service = "headroom-webhook"
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": service},
            "spec": {"ports": [{"name": "webhook", "port": 443, "targetPort": port}]},
        },
    )
    client.DiscoveryV1Api(api_client).create_namespaced_endpoint_slice(
        namespace,
        {
            "metadata": {
                "name": f"{service}-1",
                "labels": {"kubernetes.io/service-name": service},
            },
            "addressType": "IPv4",
            "ports": [{"name": "webhook", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        },
    )
    name = f"headroom-svc-{uuid.uuid4().hex[:6]}"
    admission.create_mutating_webhook_configuration(
        gating_configuration(
            name, service=(namespace, service), excluded_namespaces=(excluded, "kube-system")
        )
    )
    try:
        run_operator(
            {
                "webhook": {
                    "enabled": True,
                    "host": address,
                    "port": port,
                    "certificate": {
                        "namespace": namespace,
                        "serviceName": service,  # no extra names: the Service's own only
                        "webhookConfiguration": name,
                        "checkPeriod": "1s",
                    },
                }
            }
        )
        wait_until_gating(kubectl, namespace)
        applied = kubectl(
            "apply", "-n", namespace, "-f", "-", input=pod_yaml("routed", {RAM_ANNOTATION: "2Gi"})
        )
        assert applied.returncode == 0, applied.stderr
        gates = core.read_namespaced_pod("routed", namespace).spec.scheduling_gates
        assert [g.name for g in gates] == [SCHEDULING_GATE]
    finally:
        admission.delete_mutating_webhook_configuration(name)
