"""Register the gating webhook by URL, for tests on a control plane with no Service routing.

The chart registers the webhook by Service (``clientConfig.service``); an operator
run as a local process is reached at ``https://127.0.0.1:PORT`` instead. Apart
from ``clientConfig``, the configuration is the chart's: the same rules,
selectors and policies, so what the tests see is what a cluster does.
"""

from __future__ import annotations

from typing import Any

from headroom.api.constants import CLAIM_LABEL

PATH = "/mutate-pods"


def gating_configuration(
    name: str,
    url: str,
    *,
    excluded_namespaces: tuple[str, ...] = ("kube-system",),
    failure_policy: str = "Fail",
    timeout_seconds: int = 5,
    ca_bundle: str | None = None,
) -> dict[str, Any]:
    """A MutatingWebhookConfiguration that sends opted-in Pod CREATEs to ``url``."""
    client_config: dict[str, Any] = {"url": url}
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
