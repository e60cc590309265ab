"""The Helm chart: lint, render, schema, apply to the real API server, and its RBAC.

The operator is run with nothing but the chart's ClusterRole (a client
certificate for the chart's ServiceAccount user), which proves the role is
sufficient; removing one rule breaks it, which proves that rule is necessary.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml
from kubernetes import client

from headroom.api.config import parse_config
from headroom.cli import _parser
from headroom_dev import reservations as rsv
from headroom_dev.apply import api_client
from headroom_dev.controlplane import ControlPlane, binary
from headroom_dev.logtext import http_statuses
from headroom_dev.operator import OperatorProcess
from tests.polling import eventually

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "headroom"
MANIFEST = ROOT / "manifests" / "headroom.yaml"
NAMESPACE, SERVICE_ACCOUNT = "headroom-system", "headroom"
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
CHART_DECISION_KEY = {
    "enabled": True,
    "namespace": NAMESPACE,
    "secretName": "headroom-decision-key",
    "create": True,  # no decisionKey.existingSecret
}
OPERATOR_GROUPS = ("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}")
Kubectl = Callable[..., CompletedProcess[str]]


def helm(*args: str) -> CompletedProcess[str]:
    return subprocess.run(
        [str(binary("helm", "make helm")), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def refused(value: str, named: str) -> None:
    """``helm template`` with ``key=<JSON>`` fails, and its error names ``named``."""
    result = helm("template", "hr", str(CHART), "--set-json", value)
    assert result.returncode != 0, value
    assert named in result.stderr, (value, result.stderr)


def render(*values: str) -> list[dict[str, Any]]:
    """Render with ``key=<JSON>`` values (as a user's values file would type them)."""
    argv = ["template", "headroom", str(CHART), "--namespace", NAMESPACE]
    for value in values:
        argv += ["--set-json", value]
    result = helm(*argv)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_helm_lint() -> None:
    result = helm("lint", str(CHART), "--strict")
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_render_is_the_committed_manifest() -> None:
    rendered = helm("template", "headroom", str(CHART), "--namespace", NAMESPACE).stdout
    committed = MANIFEST.read_text()
    assert committed.split("\n", 1)[1] == rendered, "manifests/ drifted: run `make generate`"


def test_default_render() -> None:
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in render())
    assert kinds == sorted(
        [
            "ClusterRole/headroom-edit",
            "ClusterRole/headroom-metrics-reader",
            "ClusterRole/headroom-nodeheadroom-reader",
            "ClusterRole/headroom-operator",
            "ClusterRole/headroom-quota-admin",
            "ClusterRole/headroom-quota-reader",
            "ClusterRole/headroom-view",
            "ClusterRoleBinding/headroom-operator",
            "ConfigMap/headroom-config",
            "Role/headroom-decision-key",
            "RoleBinding/headroom-decision-key",
            "CustomResourceDefinition/headroomquotas.headroom.dev",
            "CustomResourceDefinition/nodeheadrooms.headroom.dev",
            "CustomResourceDefinition/reservations.headroom.dev",
            "Deployment/headroom",
            "FlowSchema/headroom",
            "MutatingWebhookConfiguration/headroom",
            "PodDisruptionBudget/headroom",
            "PriorityLevelConfiguration/headroom",
            "Role/headroom-leader-election",
            "RoleBinding/headroom-leader-election",
            "Role/headroom-webhook-cert",
            "RoleBinding/headroom-webhook-cert",
            "Service/headroom-metrics",
            "Service/headroom-webhook",
            "ServiceAccount/headroom",
            "ValidatingWebhookConfiguration/headroom",
        ]
    )
    deployment = next(d for d in render() if d["kind"] == "Deployment")
    # HA by default: a standby, and a rollout that never takes a ready pod first.
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}


def test_non_default_render() -> None:
    docs = render(
        "config.limits.maxOvercommitRatio=1.5",
        'config.sweepPeriod="2s"',
        "dashboard.enabled=true",
        "serviceMonitor.enabled=true",
        "crds.install=false",
        "metrics.port=9090",
        'config.limits.gpuPolicy="spread"',
        "config.limits.maxVramOvercommitRatio=1.25",
        'config.gpus.draDrivers=["gpu.nvidia.com", "gpu.example.org"]',
    )
    kinds = {d["kind"] for d in docs}
    assert "CustomResourceDefinition" not in kinds
    assert "ServiceMonitor" in kinds
    config = yaml.safe_load(
        next(d for d in docs if d["metadata"]["name"] == "headroom-config")["data"]["config.yaml"]
    )
    assert config["limits"]["maxOvercommitRatio"] == 1.5
    assert config["metricsPort"] == 9090
    parsed = parse_config(yaml.safe_dump(config))
    assert parsed.limits.gpu_policy == "spread"
    assert parsed.limits.max_vram_overcommit_ratio == Fraction(5, 4)
    assert parsed.gpus.dra_drivers == ("gpu.nvidia.com", "gpu.example.org")
    dashboard = next(d for d in docs if d["metadata"]["name"] == "headroom-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_leader_election_render() -> None:
    docs = render("replicas=2", "leaderElection.enabled=true")
    by_kind = {d["kind"]: d for d in docs}
    lease_role = next(d for d in docs if d["metadata"]["name"] == "headroom-leader-election")
    assert lease_role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]
    assert by_kind["Deployment"]["spec"]["replicas"] == 2
    assert by_kind["Deployment"]["spec"]["strategy"]["type"] == "RollingUpdate"
    config = yaml.safe_load(
        next(d for d in docs if d["metadata"]["name"] == "headroom-config")["data"]["config.yaml"]
    )
    assert config["leaderElection"]["enabled"] is True
    labels = config["decisionKey"].pop("labels")  # the key's Secret is labelled as the release
    assert labels == by_kind["Deployment"]["metadata"]["labels"]
    assert config["decisionKey"] == CHART_DECISION_KEY
    single = render("replicas=1", "leaderElection.enabled=false")
    names = {f"{d['kind']}/{d['metadata']['name']}" for d in single}
    assert "Role/headroom-leader-election" not in names
    (deployment,) = [d for d in single if d["kind"] == "Deployment"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_high_availability_render() -> None:
    """Issue 23, item 1: a PDB, spread over nodes, away from GPU nodes, a priority class;
    and what replicas: 1 and replicas: 0 leave out."""
    docs = render()
    (pdb,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == {"matchLabels": selector}
    pod = deployment["spec"]["template"]["spec"]
    assert "priorityClassName" not in pod
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # one node still runs both
    assert spread["labelSelector"] == {"matchLabels": selector}
    (preferred,) = pod["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert preferred["preference"]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}
    ]

    docs = render(
        'priorityClassName="system-cluster-critical"',
        'affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": '
        '{"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", '
        '"values": ["system"]}]}]}}}',
        'topologySpread={"whenUnsatisfiable": "DoNotSchedule"}',
    )
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert list(pod["affinity"]["nodeAffinity"]) == [
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"

    single = render("replicas=1")  # leader election stays on: a rollout surges a standby
    kinds = {d["kind"] for d in single}
    assert "PodDisruptionBudget" not in kinds  # minAvailable 1 of 1 would block every drain
    (deployment,) = [d for d in single if d["kind"] == "Deployment"]
    assert "topologySpreadConstraints" not in deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"

    # A release kept beside another with no operator must not gate (and refuse) pods.
    idle = {d["kind"] for d in render("replicas=0")}
    assert "MutatingWebhookConfiguration" not in idle
    assert "PodDisruptionBudget" not in idle


def test_webhook_render() -> None:
    docs = render()
    by_name = {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}
    (webhook,) = by_name["MutatingWebhookConfiguration/headroom"]["webhooks"]
    assert webhook["clientConfig"] == {
        "service": {
            "name": "headroom-webhook",
            "namespace": NAMESPACE,
            "path": "/mutate-pods",
            "port": 443,
        }
    }  # no caBundle: the operator writes it, and helm upgrade leaves it alone
    assert webhook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["objectSelector"] == {"matchLabels": {"headroom.dev/claim": "true"}}
    assert webhook["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": [NAMESPACE, "kube-system"],
            }
        ]
    }
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["sideEffects"] == "None"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["matchPolicy"] == "Equivalent"
    assert webhook["reinvocationPolicy"] == "Never"
    assert webhook["timeoutSeconds"] == 5
    deployment = by_name["Deployment/headroom"]
    service = by_name["Service/headroom-webhook"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "webhook", "containerPort": 9443} in container["ports"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}} in volumes
    config = yaml.safe_load(by_name["ConfigMap/headroom-config"]["data"]["config.yaml"])
    assert config["webhook"] == {
        "enabled": True,
        "port": 9443,
        "drainDelay": "5s",  # a stopping replica answers while its endpoint goes
        "outlookTimeout": "1500ms",  # the API server waits 2s for the outlook
        "certificate": {
            "namespace": NAMESPACE,
            "secretName": "headroom-webhook-cert",
            "serviceName": "headroom-webhook",
            "webhookConfiguration": "headroom",
        },
    }
    assert by_name["Role/headroom-webhook-cert"]["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["headroom-webhook-cert"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    assert {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "resourceNames": ["headroom"],
        "verbs": ["get", "patch"],
    } in by_name["ClusterRole/headroom-operator"]["rules"]

    off = {f"{d['kind']}/{d['metadata']['name']}": d for d in render("webhook.enabled=false")}
    assert "MutatingWebhookConfiguration/headroom" not in off
    assert "ValidatingWebhookConfiguration/headroom" not in off
    assert "Service/headroom-webhook" not in off
    assert "Role/headroom-webhook-cert" not in off
    off_config = yaml.safe_load(off["ConfigMap/headroom-config"]["data"]["config.yaml"])
    assert off_config["webhook"]["enabled"] is False
    ignore = render('webhook.failurePolicy="Ignore"', "webhook.timeoutSeconds=2")
    (configuration,) = [d for d in ignore if d["kind"] == "MutatingWebhookConfiguration"]
    assert configuration["webhooks"][0]["failurePolicy"] == "Ignore"
    assert configuration["webhooks"][0]["timeoutSeconds"] == 2


def test_the_operator_role_reads_quotas_and_namespaces_and_writes_quota_status() -> None:
    (role,) = [
        d
        for d in render()
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "headroom-operator"
    ]
    rules = role["rules"]
    for rule in (
        {
            "apiGroups": ["headroom.dev"],
            "resources": ["headroomquotas"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": ["headroom.dev"], "resources": ["headroomquotas/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ):
        assert rule in rules, rule
    # Quotas are only read: no rule lets the operator write a quota's spec.
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    for rule in rules:
        if "headroomquotas" in rule["resources"] or "namespaces" in rule["resources"]:
            assert not writes & set(rule["verbs"]), rule


AGGREGATE = {
    "rbac.authorization.k8s.io/aggregate-to-edit": "true",
    "rbac.authorization.k8s.io/aggregate-to-admin": "true",
}


def _edit_role(*values: str) -> dict[str, Any]:
    (role,) = [d for d in render(*values) if d["metadata"]["name"] == "headroom-edit"]
    return role


def test_aggregation_into_edit_and_admin_is_a_value_on_by_default() -> None:
    on = _edit_role()["metadata"]["labels"]
    assert on.items() >= AGGREGATE.items()
    assert _edit_role("rbac.aggregateToEditRoles=true")["metadata"]["labels"] == on
    off = _edit_role("rbac.aggregateToEditRoles=false")
    assert not [key for key in off["metadata"]["labels"] if key.startswith("rbac.")]
    assert off["rules"] == _edit_role()["rules"]  # only the aggregation goes
    # headroom-view stays aggregated into view: the value is about write rights.
    (view,) = [
        d
        for d in render("rbac.aggregateToEditRoles=false")
        if d["metadata"]["name"] == "headroom-view"
    ]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"


QUOTA_VERBS = ["create", "update", "patch", "delete", "deletecollection", "get", "list", "watch"]


@pytest.mark.parametrize(
    ("value", "role", "verbs"),
    [
        ("quotaAdmins", "headroom-quota-admin", QUOTA_VERBS),
        ("quotaReaders", "headroom-quota-reader", ["get", "list", "watch"]),
    ],
)
def test_the_quota_roles_and_their_bindings(value: str, role: str, verbs: list[str]) -> None:
    subjects = {
        "groups": ["platform"],
        "users": ["alice"],
        "serviceAccounts": [{"namespace": "ml", "name": "sync"}],
    }
    docs = render(f"{value}={json.dumps(subjects)}")
    (cluster_role,) = [
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == role
    ]
    # Never the status: only the operator writes what a quota's namespaces hold.
    assert cluster_role["rules"] == [
        {"apiGroups": ["headroom.dev"], "resources": ["headroomquotas"], "verbs": verbs}
    ]
    assert not any(k.startswith("rbac.") for k in cluster_role["metadata"]["labels"])
    (binding,) = [
        d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == role
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role,
    }
    assert binding["subjects"] == [
        {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "platform"},
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"},
        {"kind": "ServiceAccount", "name": "sync", "namespace": "ml"},
    ]
    by_default = {f"{d['kind']}/{d['metadata']['name']}" for d in render()}
    assert f"ClusterRole/{role}" in by_default
    assert f"ClusterRoleBinding/{role}" not in by_default  # no subjects, no binding
    without_rbac = render("rbac.create=false", f"{value}={json.dumps(subjects)}")
    assert not [d for d in without_rbac if d["metadata"]["name"] == role]


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("config.limits.maxOvercommitRatio=-1", "maxOvercommitRatio"),
        ("config.limits.systemReserveMb=5", "systemReserveMb"),
        ("config.sweepPeriod=soon", "sweepPeriod"),
        ("config.ramSource=swap", "ramSource"),
        ("config.limits.gpuPolicy=pack", "gpuPolicy"),
        ("config.limits.maxVramOvercommitRatio=-1", "maxVramOvercommitRatio"),
        ("config.gpus.draDrivers[0]=GPU_NVIDIA", "/config/gpus/draDrivers/0"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("replicas=3,leaderElection.enabled=false", "replicas > 1 needs leaderElection"),
        ("replicas=6", "replicas"),
        ("podDisruptionBudget.minAvailable=2", "minAvailable must be below replicas"),
        ("podDisruptionBudget.maxUnavailable=1", "'maxUnavailable' not allowed"),
        ("topologySpread.whenUnsatisfiable=Never", "whenUnsatisfiable"),
        ("placement.avoidNodeLabels[0]=", "/placement/avoidNodeLabels/0"),
        ("metrics.port=0", "port"),
        ("logLevel=LOUD", "logLevel"),
        ("logFormat=xml", "logFormat"),
        ("nodeHeadroomReaders.groups=ml-team", "/nodeHeadroomReaders/groups"),
        ("nodeHeadroomReaders.users[0]=", "/nodeHeadroomReaders/users/0"),
        ("nodeHeadroomReaders.serviceAccounts[0].name=placer", "missing property 'namespace'"),
        ("nodeHeadroomReaders.serviceAccounts[0].namespace=ML", "/serviceAccounts/0/namespace"),
        ("nodeHeadroomReaders.teams[0]=ml", "'teams' not allowed"),
        ("quotaReaders.groups=ml-team", "/quotaReaders/groups"),
        ("quotaReaders.serviceAccounts[0].name=placer", "missing property 'namespace'"),
        ("quotaAdmins.users[0]=", "/quotaAdmins/users/0"),
        ("quotaAdmins.roles[0]=x", "'roles' not allowed"),
        ("rbac.aggregateToEditRoles=maybe", "aggregateToEditRoles"),
        ("webhook.failurePolicy=Sometimes", "failurePolicy"),
        ("webhook.timeoutSeconds=60", "timeoutSeconds"),
        ("webhook.tls=true", "'tls' not allowed"),
        ("apiPriority.nominalConcurrencyShares=0", "nominalConcurrencyShares"),
        ("apiPriority.lendablePercent=101", "lendablePercent"),
        ("apiPriority.matchingPrecedence=9500", "matchingPrecedence"),
        ("apiPriority.queuing.handSize=0", "handSize"),
        ("apiPriority.distinguisher=ByNamespace", "'distinguisher' not allowed"),
    ],
)
def test_schema_refuses_bad_values(value: str, complaint: str) -> None:
    result = helm("template", "headroom", str(CHART), "--set", value)
    assert result.returncode != 0
    assert complaint in result.stderr, result.stderr


@pytest.fixture
def installed(kubectl: Kubectl, crds: list[str]) -> Iterator[None]:
    """The rendered manifests, applied server-side to the real API server."""
    kubectl("create", "namespace", NAMESPACE)
    result = kubectl("apply", "--server-side", "--force-conflicts", "-f", str(MANIFEST))
    assert result.returncode == 0, result.stderr
    yield
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(MANIFEST))  # restore rules
    # Its Service has no endpoints here: left behind, the Fail-policy webhook would refuse
    # every opted-in pod that a later test creates.
    kubectl("delete", "mutatingwebhookconfiguration", "headroom", "--ignore-not-found")


def test_rendered_manifests_apply_cleanly(installed: None, kubectl: Kubectl) -> None:
    result = kubectl(
        "get", "deployment,serviceaccount,configmap,service", "-n", NAMESPACE, "-o", "name"
    )
    assert "deployment.apps/headroom" in result.stdout
    assert "serviceaccount/headroom" in result.stdout
    roles = kubectl("get", "clusterroles", "-o", "name").stdout
    for role in (
        "headroom-operator",
        "headroom-edit",
        "headroom-view",
        "headroom-nodeheadroom-reader",
        "headroom-quota-admin",
        "headroom-quota-reader",
        "headroom-metrics-reader",
    ):
        assert f"clusterrole.rbac.authorization.k8s.io/{role}" in roles
    # API Priority and Fairness (cluster-scoped; tests/integration/test_api_fairness.py).
    for kind in ("flowschemas", "prioritylevelconfigurations"):
        result = kubectl("get", f"{kind}.flowcontrol.apiserver.k8s.io/headroom", "-o", "name")
        assert result.returncode == 0, result.stderr


def bind_headroom_edit(core: client.CoreV1Api, namespace: str, user: str) -> None:
    """Grant ``user`` the chart's headroom-edit role in ``namespace`` only."""
    client.RbacAuthorizationV1Api(core.api_client).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": f"{user}-headroom-edit"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "headroom-edit",
            },
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        },
    )


def operator_as_service_account(
    control_plane: ControlPlane, tmp_path: Path, config: dict[str, Any]
) -> OperatorProcess:
    kubeconfig = control_plane.write_kubeconfig(
        tmp_path / "operator.kubeconfig", OPERATOR_USER, OPERATOR_GROUPS
    )
    workdir = tmp_path / f"op-{uuid.uuid4().hex[:6]}"
    workdir.mkdir()
    return OperatorProcess(kubeconfig, workdir, config)


def test_operator_runs_with_only_the_charts_rbac(
    installed: None,
    control_plane: ControlPlane,
    tmp_path: Path,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    node = f"rbac-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    operator = operator_as_service_account(
        control_plane,
        tmp_path,
        {
            "limits": {"heartbeatStaleWindow": "2s"},
            "sweepPeriod": "1s",
            "reclaimedRetention": "1s",
            "decisionKey": CHART_DECISION_KEY,
        },
    ).start()
    try:
        rsv.create(custom, namespace, "fits", node, 2048)
        rsv.create(custom, namespace, "too-big", node, 4096)
        assert rsv.wait_for(custom, namespace, "fits")["status"]["phase"] == "Admitted"
        assert rsv.wait_for(custom, namespace, "too-big")["status"]["phase"] == "Rejected"
        # Stale after 2 s: reclaimed (status), then deleted (delete), with Events (create).
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and rsv.list_all(custom, namespace):
            time.sleep(0.2)
        assert [i["metadata"]["name"] for i in rsv.list_all(custom, namespace)] == ["too-big"]
        reasons = {e.reason for e in core.list_namespaced_event(namespace).items}
        assert {"Fits", "InsufficientRAM", "HeartbeatStale"} <= reasons
        summary = custom.get_cluster_custom_object(
            "headroom.dev", "v1alpha1", "nodeheadrooms", node
        )
        assert summary["status"]["totalRAMMB"] == 5120
        assert "Forbidden" not in operator.tail(200)
    finally:
        operator.stop()


def test_the_webhook_certificate_works_with_only_the_charts_rbac(
    installed: None,
    control_plane: ControlPlane,
    tmp_path: Path,
    core: client.CoreV1Api,
    kubectl: Kubectl,
) -> None:
    """As the chart's ServiceAccount: the Secret is created (or read) in the release
    namespace, the caBundle of the chart's configuration is patched, nothing is Forbidden."""
    webhook = {
        "enabled": True,
        "host": "127.0.0.1",
        "port": 0,
        "certificate": {
            "namespace": NAMESPACE,
            "secretName": "headroom-webhook-cert",
            "serviceName": "headroom-webhook",
            "webhookConfiguration": "headroom",
            "checkPeriod": "1s",
        },
    }
    operator = operator_as_service_account(control_plane, tmp_path, {"webhook": webhook})
    operator.start()
    try:
        secret = core.read_namespaced_secret("headroom-webhook-cert", NAMESPACE)
        admission = client.AdmissionregistrationV1Api(core.api_client)

        def published() -> None:
            configuration = admission.read_mutating_webhook_configuration("headroom")
            assert configuration.webhooks[0].client_config.ca_bundle == secret.data["ca-bundle.crt"]

        eventually(published)
        tail = operator.tail(200)
        assert "Forbidden" not in tail
        # A status, not the digits of a port or a time ("127.0.0.1:44039", ",403" once).
        assert 403 not in http_statuses(tail), tail
    finally:
        operator.stop()
    # An upgrade re-applies the chart without a caBundle: with the operator stopped, the
    # one it wrote survives both a three-way merge (as helm upgrade does) and server-side
    # apply, since neither the old nor the new manifest mentions it.
    for argv in (["apply"], ["apply", "--server-side", "--force-conflicts"]):
        result = kubectl(*argv, "-f", str(MANIFEST))
        assert result.returncode == 0, result.stderr
        published()


@pytest.mark.parametrize(
    "resource",
    [
        "reservations/status",
        "reservations",
        "resourceslices",
        "resourceclaims",
        "headroomquotas",
        "namespaces",
    ],
)
def test_a_rule_is_necessary(
    installed: None,
    control_plane: ControlPlane,
    tmp_path: Path,
    kubectl: Kubectl,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
    resource: str,
) -> None:
    role = json.loads(kubectl("get", "clusterrole", "headroom-operator", "-o", "json").stdout)
    kept = [r for r in role["rules"] if r["resources"] != [resource]]
    assert len(kept) == len(role["rules"]) - 1
    role["rules"] = kept
    result = kubectl("replace", "-f", "-", input=json.dumps(role))
    assert result.returncode == 0, result.stderr
    node = f"rbac-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")
    operator = operator_as_service_account(control_plane, tmp_path, {}).start(wait_ready=False)
    try:
        rsv.create(custom, namespace, "undecidable", node, 1024)
        with pytest.raises(TimeoutError):
            rsv.wait_for(custom, namespace, "undecidable", timeout=5)
        tail = operator.tail(200)
        assert 403 in http_statuses(tail) or "forbidden" in tail.lower(), tail
    finally:
        operator.stop()


def test_a_tenant_with_headroom_edit_is_confined(
    installed: None,
    control_plane: ControlPlane,
    tmp_path: Path,
    kubectl: Kubectl,
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    other = f"t-other-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": other}})
    bind_headroom_edit(core, namespace, "tenant")
    tenant = client.CustomObjectsApi(
        api_client(control_plane.write_kubeconfig(tmp_path / "tenant.kubeconfig", "tenant"))
    )

    rsv.create(tenant, namespace, "mine", "some-node", 512)
    beat = {
        "metadata": {
            "annotations": {
                "headroom.dev/heartbeat": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            }
        }
    }
    tenant.patch_namespaced_custom_object(
        "headroom.dev", "v1alpha1", namespace, "reservations", "mine", beat
    )
    with pytest.raises(client.ApiException) as forged:
        tenant.patch_namespaced_custom_object_status(
            "headroom.dev",
            "v1alpha1",
            namespace,
            "reservations",
            "mine",
            {"status": {"phase": "Admitted", "reason": "Fits"}},
        )
    assert forged.value.status == 403
    with pytest.raises(client.ApiException) as elsewhere:
        rsv.create(tenant, other, "theirs", "some-node", 512)
    assert elsewhere.value.status == 403
    with pytest.raises(client.ApiException) as listing:
        tenant.list_namespaced_custom_object("headroom.dev", "v1alpha1", other, "reservations")
    assert listing.value.status == 403
    rsv.delete(tenant, namespace, "mine")
    assert rsv.list_all(custom, namespace) == []


def test_r4_no_path_forges_an_admission(
    installed: None,
    control_plane: ControlPlane,
    tmp_path: Path,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    """Tenants cannot write a status at all; a status written by anyone else without
    the operator's decision stamp is not trusted on rebuild and is decided again."""
    bind_headroom_edit(core, namespace, "mallory")
    mallory_config = control_plane.write_kubeconfig(tmp_path / "mallory.kubeconfig", "mallory")
    mallory = client.CustomObjectsApi(api_client(mallory_config))
    node = f"r4-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="5Gi")  # limit 4096
    config = {"decisionKey": {"enabled": True, "namespace": "default"}}
    operator = run_operator(config)
    rsv.create(custom, namespace, "first", node, 3000)
    assert rsv.wait_for(custom, namespace, "first")["status"]["phase"] == "Admitted"
    forged = {
        "phase": "Admitted",
        "reason": "Fits",
        "message": "trust me",
        "decisionID": "x",
        "decisionStamp": "0" * 40,
    }

    # Create with status, or apply with status: the status subresource drops it.
    body = {**rsv.reservation("with-status", node, 3000), "status": forged}
    mallory.create_namespaced_custom_object(
        "headroom.dev", "v1alpha1", namespace, "reservations", body
    )
    applied = subprocess.run(
        [
            str(binary("kubectl")),
            f"--kubeconfig={mallory_config}",
            "apply",
            "--server-side",
            "-n",
            namespace,
            "-f",
            "-",
        ],
        input=yaml.safe_dump({**rsv.reservation("applied", node, 3000), "status": forged}),
        capture_output=True,
        text=True,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    for name in ("with-status", "applied"):
        assert rsv.wait_for(custom, namespace, name)["status"]["phase"] == "Rejected"
    with pytest.raises(client.ApiException) as patched:  # patch /status: forbidden
        mallory.patch_namespaced_custom_object_status(
            "headroom.dev", "v1alpha1", namespace, "reservations", "with-status", {"status": forged}
        )
    assert patched.value.status == 403

    # Someone with status rights but not the key writes Admitted while the operator is down.
    operator.stop()
    custom.patch_namespaced_custom_object_status(
        "headroom.dev", "v1alpha1", namespace, "reservations", "with-status", {"status": forged}
    )
    run_operator(config)
    rsv.create(custom, namespace, "honest", node, 1000)  # fits only if the forgery is ignored
    assert rsv.wait_for(custom, namespace, "honest")["status"]["phase"] == "Admitted"
    status = rsv.wait_for(custom, namespace, "with-status", ("Rejected",))["status"]
    assert status["decisionStamp"] != forged["decisionStamp"]
    reasons = {e.reason for e in core.list_namespaced_event(namespace).items}
    assert "UntrustedStatus" in reasons


def test_the_container_runs_the_images_entrypoint_with_the_charts_args() -> None:
    """What the kubelet runs is the Dockerfile's ENTRYPOINT followed by the chart's args;
    together they must be one valid command (a `run` in both was `headroom run run`)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.MULTILINE)
    assert entrypoint
    (deployment,) = [d for d in render() if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "command" not in container  # the image's ENTRYPOINT stays
    program, *argv = json.loads(entrypoint.group(1)) + container["args"]
    assert program == "headroom"
    args = _parser("headroom", with_run=True).parse_args(argv)  # SystemExit(2) if not
    assert args.config == "/etc/headroom/config.yaml"
    assert (args.log_level, args.log_format) == ("INFO", "text")
