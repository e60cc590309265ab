"""ServiceAccounts with real tokens, and grants of the chart's metrics-reader role: what
the tests of the TLS metrics endpoint and the live Prometheus scrape with."""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes import client

from tests.integration.test_chart import render

SECURE = {"metricsSecure": True}
"""Operator config: /metrics as the chart serves it (the harness opts in to plain HTTP)."""


def reader_rules() -> list[dict[str, Any]]:
    """The rules of the chart's metrics-reader ClusterRole, as rendered."""
    (role,) = [
        d
        for d in render()
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "headroom-metrics-reader"
    ]
    return list(role["rules"])


class Accounts:
    """ServiceAccounts of the test's namespace, their tokens, and metrics-reader grants."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.rbac = client.RbacAuthorizationV1Api(core.api_client)
        self.role = f"metrics-reader-{uuid.uuid4().hex[:6]}"  # cluster-scoped: unique
        self.rbac.create_cluster_role({"metadata": {"name": self.role}, "rules": reader_rules()})
        self.bindings: list[str] = []

    def token(self, name: str) -> str:
        self.core.create_namespaced_service_account(self.namespace, {"metadata": {"name": name}})
        answer = self.core.create_namespaced_service_account_token(
            name, self.namespace, {"spec": {"expirationSeconds": 3600}}
        )
        return str(answer.status.token)

    def grant(self, name: str) -> None:
        binding = f"{self.role}-{name}"
        self.rbac.create_cluster_role_binding(
            {
                "metadata": {"name": binding},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": self.role,
                },
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": self.namespace}],
            }
        )
        self.bindings.append(binding)

    def remove(self) -> None:
        for binding in self.bindings:
            self.rbac.delete_cluster_role_binding(binding)
        self.rbac.delete_cluster_role(self.role)
