"""Register the gating webhook for tests: by URL, or by Service as the chart does.

An operator run as a local process is reached at ``https://127.0.0.1:PORT``; or,
through a selector-less Service whose EndpointSlice names this machine's address,
the way the API server reaches the chart's Service with ``--enable-aggregator-routing``
(EndpointSlices may not hold loopback addresses). Apart from ``clientConfig``, the
configuration is the chart's: the same rules, selectors and policies.
"""

from __future__ import annotations

from typing import Any

from headroom.api.constants import CLAIM_LABEL

PATH = "/mutate-pods"


def gating_configuration(
    name: str,
    url: str | None = None,
    *,
    service: tuple[str, str] | None = None,
    excluded_namespaces: tuple[str, ...] = ("kube-system",),
    failure_policy: str = "Fail",
    timeout_seconds: int = 5,
    ca_bundle: str | None = None,
) -> dict[str, Any]:
    """A MutatingWebhookConfiguration that sends opted-in Pod CREATEs to ``url``, or to
    the Service ``service`` = (namespace, name) on port 443 as the chart does."""
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url and service")
    client_config: dict[str, Any] = (
        {"url": url}
        if service is None
        else {"service": {"namespace": service[0], "name": service[1], "path": PATH, "port": 443}}
    )
    if ca_bundle is not None:
        client_config["caBundle"] = ca_bundle
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "gate.headroom.dev",
                "clientConfig": client_config,
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "objectSelector": {"matchLabels": {CLAIM_LABEL: "true"}},
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": list(excluded_namespaces),
                        }
                    ]
                },
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": timeout_seconds,
            }
        ],
    }


OUTLOOK_PATH = "/validate-reservations"


def outlook_configuration(
    name: str,
    url: str | None = None,
    *,
    service: tuple[str, str] | None = None,
    operator_user: str | None = None,
    timeout_seconds: int = 2,
    ca_bundle: str | None = None,
) -> dict[str, Any]:
    """A ValidatingWebhookConfiguration that sends Reservation CREATEs (real and dry-run)
    to ``url``, or to the Service ``service`` as the chart does, for their outlook. Never
    the creates of ``operator_user`` (the operator's own reservations for gated pods)."""
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url and service")
    client_config: dict[str, Any] = (
        {"url": url}
        if service is None
        else {
            "service": {
                "namespace": service[0],
                "name": service[1],
                "path": OUTLOOK_PATH,
                "port": 443,
            }
        }
    )
    if ca_bundle is not None:
        client_config["caBundle"] = ca_bundle
    webhook: dict[str, Any] = {
        "name": "outlook.headroom.dev",
        "clientConfig": client_config,
        "rules": [
            {
                "apiGroups": ["headroom.dev"],
                "apiVersions": ["*"],
                "operations": ["CREATE"],
                "resources": ["reservations"],
                "scope": "Namespaced",
            }
        ],
        "failurePolicy": "Ignore",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "matchPolicy": "Equivalent",
        "timeoutSeconds": timeout_seconds,
    }
    if operator_user is not None:
        webhook["matchConditions"] = [
            {
                "name": "not-the-operator",
                "expression": f"request.userInfo.username != {operator_user!r}",
            }
        ]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [webhook],
    }
