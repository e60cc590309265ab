"""The chart's values a production install tunes (issue 23, item 6), rendered with helm."""

from __future__ import annotations

from typing import Any

import yaml

from tests.integration.test_chart import CHART, helm, refused, render


def deployment(*values: str) -> dict[str, Any]:
    (found,) = [d for d in render(*values) if d["kind"] == "Deployment"]
    return found


def test_extra_env_volumes_pod_labels_and_probe_timings_reach_the_pod() -> None:
    pod = deployment(
        'podLabels={"team": "ml"}',
        'extraEnv=[{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]',
        'extraVolumes=[{"name": "ca", "configMap": {"name": "corp-ca"}}]',
        'extraVolumeMounts=[{"name": "ca", "mountPath": "/etc/corp-ca"}]',
        'probes={"liveness": {"periodSeconds": 30, "timeoutSeconds": 5, "failureThreshold": 4}}',
    )["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    (container,) = pod["spec"]["containers"]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in container["env"]
    assert container["env"][0]["name"] == "POD_NAMESPACE"  # the chart's own stays
    assert {"name": "ca", "mountPath": "/etc/corp-ca"} in container["volumeMounts"]
    assert {"name": "ca", "configMap": {"name": "corp-ca"}} in pod["spec"]["volumes"]
    probe = container["livenessProbe"]
    assert (probe["periodSeconds"], probe["timeoutSeconds"], probe["failureThreshold"]) == (
        30,
        5,
        4,
    )
    assert container["startupProbe"]["failureThreshold"] == 30  # defaults kept


def test_the_pod_selector_is_not_changed_by_pod_labels() -> None:
    spec = deployment('podLabels={"team": "ml"}')["spec"]
    assert "team" not in spec["selector"]["matchLabels"]


def test_name_overrides_rename_the_objects() -> None:
    names = {
        d["metadata"]["name"]
        for d in render('fullnameOverride="hr"')
        if d["kind"] in ("Deployment", "ServiceAccount", "ConfigMap")
    }
    assert "hr" in names
    labels = deployment('nameOverride="ledger"')["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "ledger"


def test_notes_give_the_next_commands() -> None:
    result = helm("install", "hr", str(CHART), "--dry-run", "--namespace", "ops")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl get nodeheadrooms" in notes
    assert "kind: Reservation" in notes
    assert "rollout status deployment/hr-headroom" in notes


def test_bad_values_are_refused_naming_the_value() -> None:
    for value, named in (
        ('probes={"liveness": {"periodSeconds": 0}}', "periodSeconds"),
        ('probes={"liveness": {"period": 3}}', "period"),
        ('extraEnv=[{"value": "x"}]', "name"),
        ('extraVolumeMounts=[{"name": "ca"}]', "mountPath"),
        ('fullnameOverride="Bad_Name"', "fullnameOverride"),
    ):
        refused(value, named)


def test_an_existing_decision_key_is_used_and_secrets_are_never_created() -> None:
    objects = render('decisionKey={"enabled": true, "existingSecret": "corp-key"}')
    (config_map,) = [
        d for d in objects if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})
    ]
    key = yaml.safe_load(config_map["data"]["config.yaml"])["decisionKey"]
    assert (key["secretName"], key["create"]) == ("corp-key", False)
    (role,) = [
        d for d in objects if d["kind"] == "Role" and "decision-key" in d["metadata"]["name"]
    ]
    assert [r["verbs"] for r in role["rules"]] == [["get", "patch"]]
    assert role["rules"][0]["resourceNames"] == ["corp-key"]


def test_the_key_the_operator_creates_carries_the_release_labels() -> None:
    objects = render()
    (config_map,) = [
        d for d in objects if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})
    ]
    key = yaml.safe_load(config_map["data"]["config.yaml"])["decisionKey"]
    assert key["create"] is True
    assert key["labels"]["app.kubernetes.io/instance"] == "headroom"
    assert key["labels"]["app.kubernetes.io/managed-by"] == "Helm"


CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "FlowSchema",
    "PriorityLevelConfiguration",
}


def test_two_releases_in_two_namespaces_share_no_cluster_scoped_name() -> None:
    def names(release: str, namespace: str) -> set[tuple[str, str]]:
        result = helm("template", release, str(CHART), "--namespace", namespace)
        assert result.returncode == 0, result.stderr
        return {
            (d["kind"], d["metadata"]["name"])
            for d in yaml.safe_load_all(result.stdout)
            if d and d["kind"] in CLUSTER_SCOPED
        }

    first, second = names("gpu-a", "team-a"), names("gpu-b", "team-b")
    assert {kind for kind, _ in first} >= {"ClusterRole", "ClusterRoleBinding", "FlowSchema"}
    assert not first & second, sorted(first & second)
