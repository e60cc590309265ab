"""The chart with ``scheduler.enabled``: a second kube-scheduler whose extender is the
operator (preview, docs/tasks/schedule-pods.md).

Rendered and read here, and applied to the real API server (server-side dry run), so
every object is one the API server takes. That the rendered scheduler configuration
runs in the real kube-scheduler and binds through the operator is in
``tests/e2e/test_scheduler_extender.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from subprocess import CompletedProcess
from typing import Any

import yaml

from headroom.api.config import parse_config
from tests.integration.test_chart import NAMESPACE, render

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
    assert extender["urlPrefix"] == f"http://headroom-extender.{NAMESPACE}.svc:9444"
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
