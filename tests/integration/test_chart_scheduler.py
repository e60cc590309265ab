"""The chart with ``scheduler.enabled``: a second kube-scheduler whose extender is the
operator (preview, docs/tasks/schedule-pods.md).

Rendered and read here, and applied to the real API server (server-side dry run), so
every object is one the API server takes. That the rendered scheduler configuration
runs in the real kube-scheduler and binds through the operator is in
``tests/e2e/test_scheduler_extender.py``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from headroom.api.config import parse_config
from headroom_dev.controlplane import ControlPlane
from headroom_dev.logtext import http_statuses
from tests.integration.test_chart import (
    CHART,
    NAMESPACE,
    helm,
    installed,
    operator_as_service_account,
    render,
)
from tests.polling import eventually

__all__ = ["installed"]  # a fixture of the chart's tests, used here too

Kubectl = Callable[..., CompletedProcess[str]]
ON = '{"enabled": true}'


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def operator_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = by_kind(docs, "ClusterRole")["headroom-operator"]["rules"]
    return rules


def scheduler_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(
        by_kind(docs, "ConfigMap")["headroom-scheduler"]["data"]["config.yaml"]
    )
    return config


def test_off_by_default_nothing_of_it_is_rendered() -> None:
    docs = render()
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert not {n for n in names if "scheduler" in n[1] or "extender" in n[1]}
    assert not [r for r in operator_rules(docs) if "pods/binding" in r["resources"]]
    config = parse_config(by_kind(docs, "ConfigMap")["headroom-config"]["data"]["config.yaml"])
    assert config.placement.mode == "gate"
    assert config.extender_port is None


def test_on_the_operator_serves_the_extender_and_may_bind() -> None:
    docs = render(f"scheduler={ON}")
    config = parse_config(by_kind(docs, "ConfigMap")["headroom-config"]["data"]["config.yaml"])
    assert (config.placement.mode, config.placement.scheduler_name) == ("scheduler", "headroom")
    assert config.extender_port == 9444
    assert config.placement.bind_grace.total_seconds() == 60
    binding = [r for r in operator_rules(docs) if r["resources"] == ["pods/binding"]]
    assert binding == [{"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}]
    operator = by_kind(docs, "Deployment")["headroom"]
    [container] = operator["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["extender"] == 9444
    service = by_kind(docs, "Service")["headroom-extender"]
    assert service["spec"]["selector"] == operator["spec"]["selector"]["matchLabels"]
    [port] = service["spec"]["ports"]
    assert port == {"name": "extender", "port": 9444, "targetPort": "extender"}


def test_on_the_scheduler_binds_through_the_extender_and_is_never_ignorable() -> None:
    config = scheduler_config(render(f"scheduler={ON}"))
    [profile] = config["profiles"]
    assert profile == {"schedulerName": "headroom", "percentageOfNodesToScore": 100}
    [extender] = config["extenders"]
    assert extender["urlPrefix"] == f"https://headroom-extender.{NAMESPACE}.svc:9444"
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceName": "headroom-scheduler",
        "resourceNamespace": NAMESPACE,
    }
    single = scheduler_config(render('scheduler={"enabled": true, "replicas": 1}'))
    assert single["leaderElection"]["leaderElect"] is True  # a rolling update surges a second


def test_on_the_extender_answers_only_the_client_certificate_the_scheduler_mounts() -> None:
    docs = render(f"scheduler={ON}")
    config = parse_config(by_kind(docs, "ConfigMap")["headroom-config"]["data"]["config.yaml"])
    assert config.webhook.enabled
    assert config.extender_client_secret == "headroom-scheduler-client"
    names = config.webhook.certificate.extra_names
    assert f"headroom-extender.{NAMESPACE}.svc" in names  # the urlPrefix's host
    [extender] = scheduler_config(docs)["extenders"]
    assert extender["enableHTTPS"] is True
    folder = "/etc/headroom-scheduler-client"
    assert extender["tlsConfig"] == {
        "certFile": f"{folder}/tls.crt",
        "keyFile": f"{folder}/tls.key",
        "caFile": f"{folder}/ca.crt",
    }
    pod = by_kind(docs, "Deployment")["headroom-scheduler"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "headroom-scheduler-client"
    # The operator may write it (beside its webhook's), by name.
    rules = by_kind(docs, "Role")["headroom-webhook-cert"]["rules"]
    [secrets] = [r for r in rules if "resourceNames" in r and r["resources"] == ["secrets"]]
    assert secrets["resourceNames"] == ["headroom-webhook-cert", "headroom-scheduler-client"]
    assert secrets["verbs"] == ["get", "update"]
    # And restart the scheduler (its pods read ca.crt only at start), by name.
    assert config.extender_scheduler_deployment == "headroom-scheduler"
    assert {
        "apiGroups": ["apps"],
        "resources": ["deployments"],
        "resourceNames": ["headroom-scheduler"],
        "verbs": ["get", "patch"],
    } in rules


def test_on_without_the_webhook_the_chart_refuses_to_render() -> None:
    result = helm(
        "template",
        "headroom",
        str(CHART),
        "--set-json",
        f"scheduler={ON}",
        "--set-json",
        'webhook={"enabled": false}',
    )
    assert result.returncode != 0
    assert "scheduler.enabled needs webhook.enabled" in result.stderr


def test_on_the_schedulers_pods_match_none_of_the_operators_selectors() -> None:
    docs = render(f"scheduler={ON}", 'networkPolicy={"enabled": true}')
    scheduler = by_kind(docs, "Deployment")["headroom-scheduler"]
    labels = scheduler["spec"]["template"]["metadata"]["labels"]
    selectors = [
        by_kind(docs, "Deployment")["headroom"]["spec"]["selector"]["matchLabels"],
        by_kind(docs, "PodDisruptionBudget")["headroom"]["spec"]["selector"]["matchLabels"],
        by_kind(docs, "NetworkPolicy")["headroom"]["spec"]["podSelector"]["matchLabels"],
        *(s["spec"]["selector"] for s in by_kind(docs, "Service").values()),
    ]
    for selector in selectors:
        assert not selector.items() <= labels.items(), selector
    own = scheduler["spec"]["selector"]["matchLabels"]
    assert own.items() <= labels.items()
    # The extender's port is open to the scheduler's pods only.
    ingress = by_kind(docs, "NetworkPolicy")["headroom"]["spec"]["ingress"]
    [rule] = [r for r in ingress if r["ports"][0]["port"] == 9444]
    assert rule["from"] == [{"podSelector": {"matchLabels": own}}]
    # Its own Lease: the bootstrap role lets a scheduler update only kube-scheduler's.
    role = by_kind(docs, "Role")["headroom-scheduler"]
    assert {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["headroom-scheduler"],
        "verbs": ["get", "update"],
    } in role["rules"]
    bound = {
        b["roleRef"]["name"]
        for b in by_kind(docs, "ClusterRoleBinding").values()
        if b["subjects"][0]["name"] == "headroom-scheduler"
    }
    assert bound == {"system:kube-scheduler", "system:volume-scheduler"}


def test_on_every_object_is_taken_by_the_api_server(kubectl: Kubectl) -> None:
    kubectl("create", "namespace", NAMESPACE)  # or it is there already
    docs = render(f"scheduler={ON}", 'networkPolicy={"enabled": true}')
    ours = ("scheduler", "extender")
    objects = [d for d in docs if any(word in d["metadata"]["name"] for word in ours)]
    assert {d["kind"] for d in objects} >= {
        "ServiceAccount",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
    }
    result = kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(objects))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(objects), result.stdout


def test_on_the_operator_writes_and_renews_the_client_secret_with_only_the_charts_rbac(
    installed: None,
    control_plane: ControlPlane,
    tmp_path: Path,
    core: client.CoreV1Api,
    kubectl: Kubectl,
) -> None:
    """As the chart's ServiceAccount with ``scheduler.enabled``'s Role: the client Secret
    is created, and a broken one replaced (update, allowed by name); the scheduler's
    Deployment is restarted for its ca.crt (get, patch by name); nothing Forbidden."""
    [role] = [
        d
        for d in render(f"scheduler={ON}")
        if d["kind"] == "Role" and d["metadata"]["name"] == "headroom-webhook-cert"
    ]
    result = kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(role)
    )
    assert result.returncode == 0, result.stderr
    certificate = {
        "namespace": NAMESPACE,
        "secretName": "headroom-webhook-cert",
        "webhookConfiguration": None,
        "checkPeriod": "1s",
    }
    config = {
        "webhook": {"enabled": True, "host": "127.0.0.1", "port": 0, "certificate": certificate},
        "extenderPort": 0,
        "extenderHost": "127.0.0.1",
        "extenderClientSecret": "headroom-scheduler-client",
        "extenderSchedulerDeployment": "headroom-scheduler",
    }
    [deployment] = [
        d
        for d in render(f"scheduler={ON}")
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "headroom-scheduler"
    ]
    apps = client.AppsV1Api(core.api_client)
    apps.create_namespaced_deployment(NAMESPACE, deployment)
    operator = operator_as_service_account(control_plane, tmp_path, config).start()
    try:

        def written() -> dict[str, str]:
            try:
                secret = core.read_namespaced_secret("headroom-scheduler-client", NAMESPACE)
            except ApiException as error:
                if error.status == 404:
                    raise AssertionError("not written yet") from error
                raise
            assert set(secret.data) == {"tls.crt", "tls.key", "ca.crt"}
            data: dict[str, str] = secret.data
            return data

        first = eventually(written, timeout=30)
        core.patch_namespaced_secret(
            "headroom-scheduler-client",
            NAMESPACE,
            {"data": {"tls.crt": "YnJva2Vu"}},  # "broken"
        )

        def replaced() -> None:
            now = written()
            assert now["tls.crt"] not in (first["tls.crt"], "YnJva2Vu")

        eventually(replaced, timeout=30)

        def restarted_for_its_ca() -> None:
            trust = base64.b64decode(written()["ca.crt"])
            template = apps.read_namespaced_deployment("headroom-scheduler", NAMESPACE).spec
            annotations = template.template.metadata.annotations or {}
            assert (
                annotations.get("headroom.dev/extender-ca")
                == (hashlib.sha256(trust).hexdigest()[:16])
            )

        eventually(restarted_for_its_ca, timeout=30)
        tail = operator.tail(200)
        assert "Forbidden" not in tail
        assert 403 not in http_statuses(tail), tail
    finally:
        operator.stop()
        core.delete_namespaced_secret("headroom-scheduler-client", NAMESPACE)
        apps.delete_namespaced_deployment("headroom-scheduler", NAMESPACE)
