"""The chart's webhook through a takeover (issue 29, item 14), rendered with helm.

A terminating replica answers the webhook for ``webhook.drainDelaySeconds`` after
SIGTERM (the operator's ``webhook.drainDelay``), so the pod's grace period must
cover it; the webhook Service routes by readiness (not ``publishNotReadyAddresses``)
because the operator's readiness already says "my webhook answers here", rebuilding
or not. The operator side: tests/integration/test_webhook_takeover.py.
"""

from __future__ import annotations

from collections.abc import Callable
from subprocess import CompletedProcess

import yaml

from headroom.api.config import parse_config
from tests.integration.test_chart import NAMESPACE, OPERATOR_USER, refused, render
from tests.integration.test_chart_metrics import config, one


def test_a_replica_drains_its_webhook_within_its_grace_period() -> None:
    docs = render()
    assert config(docs)["webhook"]["drainDelay"] == "5s"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 30
    service = one(docs, "Service", "headroom-webhook")["spec"]
    assert "publishNotReadyAddresses" not in service  # endpoints follow readiness

    longer = render("webhook.drainDelaySeconds=20", "terminationGracePeriodSeconds=45")
    assert config(longer)["webhook"]["drainDelay"] == "20s"
    assert (
        one(longer, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45
    )
    assert config(render("webhook.drainDelaySeconds=0"))["webhook"]["drainDelay"] == "0s"


def test_a_grace_period_the_drain_does_not_fit_in_is_refused() -> None:
    refused("webhook.drainDelaySeconds=25", "terminationGracePeriodSeconds must be at least")
    refused("webhook.drainDelaySeconds=301", "drainDelaySeconds")
    refused('webhook.drainDelaySeconds="5s"', "drainDelaySeconds")
    refused("terminationGracePeriodSeconds=0", "terminationGracePeriodSeconds")
    # Without the webhook there is nothing to drain: any grace period renders.
    pod = one(render("webhook.enabled=false", "webhook.drainDelaySeconds=60"), "Deployment")[
        "spec"
    ]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 30


def test_the_webhook_objects_pass_the_api_servers_validation(
    kubectl: Callable[..., CompletedProcess[str]],
) -> None:
    """The real API server's own validation (a server-side dry run) of the Deployment,
    the webhook Service and the configuration as the chart renders them."""
    docs = render("webhook.drainDelaySeconds=20", "terminationGracePeriodSeconds=45")
    wanted = [
        one(docs, "Deployment"),
        one(docs, "Service", "headroom-webhook"),
        one(docs, "ConfigMap", "headroom-config"),
        one(docs, "MutatingWebhookConfiguration"),
        one(docs, "ValidatingWebhookConfiguration"),
    ]
    kubectl("create", "namespace", NAMESPACE)  # may exist already: the dry run needs it
    result = kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(wanted))
    assert result.returncode == 0, result.stderr
    for created in (
        "deployment.apps/headroom",
        "service/headroom-webhook",
        "configmap/headroom-config",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/headroom",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/headroom",
    ):
        assert f"{created} " in result.stdout, result.stdout
    assert "(server dry run)" in result.stdout


def test_the_outlook_is_asked_of_every_reservation_create_but_the_operators() -> None:
    """The Reservations' validating webhook: CREATE only, never refusing, never the
    operator's own creates, and the operator gives up on its ledger before the API
    server gives up on it."""
    docs = render()
    hook = one(docs, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert hook["clientConfig"]["service"]["path"] == "/validate-reservations"
    assert hook["rules"] == [
        {
            "apiGroups": ["headroom.dev"],
            "apiVersions": ["*"],
            "operations": ["CREATE"],
            "resources": ["reservations"],
            "scope": "Namespaced",
        }
    ]
    assert hook["failurePolicy"] == "Ignore"
    (condition,) = hook["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username != '{OPERATOR_USER}'"
    waited = parse_config(yaml.safe_dump(config(docs))).webhook.outlook_timeout
    assert waited.total_seconds() < hook["timeoutSeconds"], (waited, hook["timeoutSeconds"])

    off = render("webhook.outlook.enabled=false")
    assert not [d for d in off if d["kind"] == "ValidatingWebhookConfiguration"]
