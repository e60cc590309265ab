"""The chart's metrics security (issue 23, item 2), rendered with helm: secure by
default, plain HTTP only as an opt-in, the reader role and its binding, the
ServiceMonitor both ways, and the NetworkPolicy off by default."""

from __future__ import annotations

import json
from collections.abc import Callable
from subprocess import CompletedProcess
from typing import Any

import yaml

from headroom.api.config import parse_config
from tests.integration.test_chart import CHART, NAMESPACE, helm, refused, render


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    return found


def config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    text = one(docs, "ConfigMap", "headroom-config")["data"]["config.yaml"]
    parse_config(text)  # the operator accepts what the chart writes
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(found)


def operator_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list(one(docs, "ClusterRole", "headroom-operator")["rules"])


REVIEWS = [
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {
        "apiGroups": ["authorization.k8s.io"],
        "resources": ["subjectaccessreviews"],
        "verbs": ["create"],
    },
]


def test_metrics_are_secure_by_default_with_probes_on_their_own_port() -> None:
    docs = render()
    assert {k: v for k, v in config(docs).items() if "etrics" in k or "robe" in k} == {
        "metricsPort": 8443,
        "metricsSecure": True,
        "probePort": 8081,
    }
    pod = container(docs)
    ports = {p["name"]: p["containerPort"] for p in pod["ports"]}
    assert (ports["metrics"], ports["probes"]) == (8443, 8081)
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert pod[probe]["httpGet"]["port"] == "probes"
    assert {"name": "tmp", "mountPath": "/tmp"} in pod["volumeMounts"]  # the key, briefly
    assert all(rule in operator_rules(docs) for rule in REVIEWS)
    service = one(docs, "Service", "headroom-metrics")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8443, "targetPort": "metrics"}]
    reader = one(docs, "ClusterRole", "headroom-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert not [d for d in docs if d["kind"] == "ClusterRoleBinding" and "metrics" in str(d)]
    assert not [d for d in docs if d["kind"] in ("NetworkPolicy", "ServiceMonitor")]


def test_plain_http_is_an_explicit_opt_in_that_drops_the_review_rights() -> None:
    docs = render("metrics.secure=false", "metrics.port=8080", "webhook.enabled=false")
    assert config(docs)["metricsSecure"] is False
    assert config(docs)["metricsPort"] == 8080
    assert not [r for r in operator_rules(docs) if r in REVIEWS]
    assert "volumeMounts" not in str(container(docs)) or "tmp" not in str(
        container(docs)["volumeMounts"]
    )
    monitor = one(render("metrics.secure=false", "serviceMonitor.enabled=true"), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "http"
    assert not {"tlsConfig", "bearerTokenFile", "authorization"} & set(endpoint)


def test_readers_are_bound_to_the_metrics_reader_role() -> None:
    docs = render(
        'metrics.readers={"groups": ["sre"], "serviceAccounts":'
        ' [{"namespace": "monitoring", "name": "prometheus-k8s"}]}'
    )
    binding = one(docs, "ClusterRoleBinding", "headroom-metrics-reader")
    assert binding["roleRef"]["name"] == "headroom-metrics-reader"
    assert binding["subjects"] == [
        {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "sre"},
        {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"},
    ]


def test_the_service_monitor_scrapes_https_with_a_token() -> None:
    (endpoint,) = one(render("serviceMonitor.enabled=true"), "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}  # the self-signed default
    (endpoint,) = one(
        render(
            "serviceMonitor.enabled=true",
            'metrics.tls.secretName="metrics-tls"',
            'serviceMonitor.bearerTokenSecret={"name": "scraper", "key": "token"}',
        ),
        "ServiceMonitor",
    )["spec"]["endpoints"]
    assert "bearerTokenFile" not in endpoint
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "scraper", "key": "token"},
    }
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "metrics-tls", "key": "ca.crt"}},
        "serverName": f"headroom-metrics.{NAMESPACE}.svc",
    }
    custom = {"insecureSkipVerify": False, "serverName": "metrics.example"}
    given = f"serviceMonitor.tlsConfig={json.dumps(custom)}"
    (endpoint,) = one(render("serviceMonitor.enabled=true", given), "ServiceMonitor")["spec"][
        "endpoints"
    ]
    assert endpoint["tlsConfig"] == custom


def test_a_given_secret_is_mounted_and_named_in_the_config() -> None:
    docs = render('metrics.tls.secretName="metrics-tls"')
    assert config(docs)["metricsCertDir"] == "/var/run/headroom/metrics-tls"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "metrics-tls", "secret": {"secretName": "metrics-tls"}} in pod["volumes"]
    (main,) = pod["containers"]
    assert {
        "name": "metrics-tls",
        "mountPath": "/var/run/headroom/metrics-tls",
        "readOnly": True,
    } in main["volumeMounts"]


def test_the_network_policy_admits_only_the_three_ports_from_their_peers() -> None:
    docs = render("networkPolicy.enabled=true")
    policy = one(docs, "NetworkPolicy")
    spec = policy["spec"]
    assert (
        spec["podSelector"]["matchLabels"]
        == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    )
    assert spec["policyTypes"] == ["Ingress"]  # egress is not restricted
    webhook, metrics, probes = spec["ingress"]
    assert webhook == {"ports": [{"port": 9443, "protocol": "TCP"}]}  # from anywhere
    assert metrics == {
        "ports": [{"port": 8443, "protocol": "TCP"}],
        "from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
    }
    assert probes == {"ports": [{"port": 8081, "protocol": "TCP"}]}
    narrowed = one(
        render(
            "networkPolicy.enabled=true",
            'networkPolicy.webhook.from=[{"ipBlock": {"cidr": "10.0.0.0/24"}}]',
            'networkPolicy.egress=[{"ports": [{"port": 443}]}]',
            "webhook.enabled=false",
        ),
        "NetworkPolicy",
    )["spec"]
    assert narrowed["policyTypes"] == ["Ingress", "Egress"]
    assert narrowed["egress"] == [{"ports": [{"port": 443}]}]
    assert [rule["ports"][0]["port"] for rule in narrowed["ingress"]] == [8443, 8081]
    webhook_on = one(
        render(
            "networkPolicy.enabled=true",
            'networkPolicy.webhook.from=[{"ipBlock": {"cidr": "10.0.0.0/24"}}]',
        ),
        "NetworkPolicy",
    )["spec"]["ingress"][0]
    assert webhook_on["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]


def test_bad_metrics_values_are_refused() -> None:
    for value, named in (
        ("metrics.secure=1", "secure"),
        ('serviceMonitor.bearerTokenSecret={"name": "s"}', "key"),
        ('networkPolicy={"enabled": true, "ingress": []}', "ingress"),
        ("probes.port=0", "port"),
    ):
        refused(value, named)


def test_the_notes_say_who_may_scrape() -> None:
    result = helm("install", "hr", str(CHART), "--dry-run", "--namespace", "ops")
    assert result.returncode == 0, result.stderr
    notes = " ".join(result.stdout.split("NOTES:", 1)[1].split())
    assert "https://hr-headroom-metrics.ops.svc:8443/metrics" in notes
    assert "ClusterRole hr-headroom-metrics-reader" in notes
    plain = helm(
        "install", "hr", str(CHART), "--dry-run", "-n", "ops", "--set", "metrics.secure=false"
    )
    assert "metrics-reader" not in plain.stdout.split("NOTES:", 1)[1]


def test_the_network_policy_and_the_metrics_objects_pass_the_api_servers_validation(
    kubectl: Callable[..., CompletedProcess[str]],
) -> None:
    """The real API server's own validation (a server-side dry run) of what the chart
    renders with the NetworkPolicy on and a mounted certificate."""
    docs = render(
        "networkPolicy.enabled=true",
        'networkPolicy.webhook.from=[{"ipBlock": {"cidr": "10.0.0.0/24"}}]',
        'networkPolicy.egress=[{"ports": [{"port": 443}]}]',
        'metrics.tls.secretName="metrics-tls"',
        'metrics.readers={"serviceAccounts": [{"namespace": "monitoring", "name": "prom"}]}',
    )
    kinds = {"NetworkPolicy", "Deployment", "Service", "ClusterRole", "ClusterRoleBinding"}
    wanted = [d for d in docs if d["kind"] in kinds]
    assert {d["kind"] for d in wanted} == kinds
    kubectl("create", "namespace", NAMESPACE)  # may exist already: the dry run needs it
    result = kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(wanted))
    assert result.returncode == 0, result.stderr
    assert "networkpolicy.networking.k8s.io/headroom created (server dry run)" in result.stdout
