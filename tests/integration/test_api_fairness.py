"""API Priority and Fairness: the chart's FlowSchema and PriorityLevelConfiguration on a
real API server.

Every request the operator's roles allow, made as the operator's ServiceAccount, is
classified into the chart's FlowSchema and priority level (the API server says which in
each answer's headers); a request outside them is not. Then another ServiceAccount
floods Reservation creates while the operator's identity keeps writing statuses and
renewing a Lease: every one of the operator's requests is served, none refused with
429, all in its own level.

This module runs its own control plane with small in-flight limits, so that a flood
from one process on 2 cores keeps more requests in flight than the whole server has
seats. APF is on by default in kube-apiserver (the harness does not turn it off); an
answer without the classification headers fails the test. Identities are client
certificates (CN = user, O = groups): APF matches a ServiceAccount subject by its user
name, ``system:serviceaccount:<namespace>:<name>``.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from headroom_dev.controlplane import ControlPlane
from headroom_dev.process import kubectl_for
from tests.integration.apf_support import Answer, Identity, metric, probe, rate, run_all
from tests.integration.test_chart import (
    NAMESPACE,
    OPERATOR_GROUPS,
    OPERATOR_USER,
    SERVICE_ACCOUNT,
    render,
)
from tests.polling import eventually

INFLIGHT, MUTATING_INFLIGHT = 10, 5
FLOOD_THREADS, FLOOD_SECONDS, QUIET_SECONDS = 24, 8.0, 2.0
TENANT = "apf-tenant"
FLOODER = f"system:serviceaccount:{TENANT}:flooder"
FLOODER_GROUPS = ("system:serviceaccounts", f"system:serviceaccounts:{TENANT}")
MERGE = "application/merge-patch+json"
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class Level:
    name: str  # of the chart's FlowSchema and priority level
    flow_schema: str  # their uids
    priority_level: str
    operator: Identity


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    limits = (
        f"--max-requests-inflight={INFLIGHT}",
        f"--max-mutating-requests-inflight={MUTATING_INFLIGHT}",
    )
    with ControlPlane(apiserver_args=limits) as cp:
        yield cp


@pytest.fixture(scope="module")
def kubectl_on(plane: ControlPlane) -> Kubectl:
    return kubectl_for(plane.kubeconfig)


@pytest.fixture(scope="module")
def chart(
    plane: ControlPlane, kubectl_on: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """The chart (with leader election, so its Lease role too), applied as the admin,
    once the new resources' watch caches serve WATCHes."""
    docs = render("leaderElection.enabled=true")
    for namespace in (NAMESPACE, TENANT):
        assert kubectl_on("create", "namespace", namespace).returncode == 0
    applied = kubectl_on("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(docs))
    assert applied.returncode == 0, applied.stderr
    established = kubectl_on("wait", "--for=condition=Established", "crd", "--all")
    assert established.returncode == 0, established.stderr
    # Until a new resource's watch cache is initialized, a WATCH is answered 429
    # ("storage is (re)initializing") whatever APF says. The admin is exempt from APF.
    admin = Identity(plane, tmp_path_factory.mktemp("admin"), "admin", ("system:masters",))
    for crd in (d for d in docs if d["kind"] == "CustomResourceDefinition"):
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]

        def watch_served(group: str = group, plural: str = plural) -> None:
            answer = probe(admin, group, plural, "watch", "", TENANT)
            assert answer.status == 200, (plural, answer)

        eventually(watch_served)
    return docs


def uid(kubectl_on: Kubectl, kind: str, name: str) -> str:
    result = kubectl_on("get", kind, name, "-o", "json")
    assert result.returncode == 0, result.stderr
    value: str = json.loads(result.stdout)["metadata"]["uid"]
    return value


@pytest.fixture(scope="module")
def level(
    plane: ControlPlane,
    chart: list[dict[str, Any]],
    kubectl_on: Kubectl,
    tmp_path_factory: pytest.TempPathFactory,
) -> Level:
    (schema,) = [d for d in chart if d["kind"] == "FlowSchema"]
    name = schema["metadata"]["name"]
    ours = Level(
        name,
        uid(kubectl_on, "flowschemas.flowcontrol.apiserver.k8s.io", name),
        uid(kubectl_on, "prioritylevelconfigurations.flowcontrol.apiserver.k8s.io", name),
        Identity(plane, tmp_path_factory.mktemp("apf"), OPERATOR_USER, OPERATOR_GROUPS),
    )

    def classified() -> None:  # APF's config controller takes new objects in a moment
        answer = probe(ours.operator, "", "nodes", "list", "", NAMESPACE)
        assert answer.flow_schema == ours.flow_schema, answer

    eventually(classified)
    return ours


def operator_rules(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(role name, rule) of every Role and ClusterRole bound to the operator's account."""
    bound = {
        d["roleRef"]["name"]
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
        in d["subjects"]
    }
    assert bound == {
        "headroom-operator",
        "headroom-decision-key",
        "headroom-webhook-cert",
        "headroom-leader-election",
    }
    return [
        (d["metadata"]["name"], rule)
        for d in docs
        if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"] in bound
        for rule in d["rules"]
    ]


def test_the_flow_schema_names_every_resource_of_the_operators_roles() -> None:
    docs = render("leaderElection.enabled=true")
    (schema,) = [d for d in docs if d["kind"] == "FlowSchema"]
    (plc,) = [d for d in docs if d["kind"] == "PriorityLevelConfiguration"]
    assert schema["spec"]["priorityLevelConfiguration"] == {"name": plc["metadata"]["name"]}
    (rule,) = schema["spec"]["rules"]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": "headroom", "namespace": NAMESPACE}}
    ]
    assert "nonResourceRules" not in rule
    covered = {
        (group, resource)
        for resource_rule in rule["resourceRules"]
        if resource_rule["verbs"] == ["*"]
        for group in resource_rule["apiGroups"]
        for resource in resource_rule["resources"]
    }
    needed = {
        (group, resource)
        for _, role_rule in operator_rules(docs)
        for group in role_rule["apiGroups"]
        for resource in role_rule["resources"]
    }
    assert needed <= covered, needed - covered
    # Before the built-in schemas that would take the account (service-accounts, 9000).
    assert schema["spec"]["matchingPrecedence"] < 9000
    assert plc["spec"]["type"] == "Limited"
    assert plc["spec"]["limited"]["limitResponse"]["type"] == "Queue"


def test_the_values_of_api_priority() -> None:
    kinds = {"FlowSchema", "PriorityLevelConfiguration"}
    assert not [d for d in render("apiPriority.enabled=false") if d["kind"] in kinds]
    docs = render(
        'serviceAccount.name="ops"',
        "apiPriority.nominalConcurrencyShares=80",
        "apiPriority.lendablePercent=0",
        "apiPriority.matchingPrecedence=700",
    )
    (schema,) = [d for d in docs if d["kind"] == "FlowSchema"]
    (plc,) = [d for d in docs if d["kind"] == "PriorityLevelConfiguration"]
    assert schema["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["name"] == "ops"
    assert schema["spec"]["matchingPrecedence"] == 700
    assert plc["spec"]["limited"]["nominalConcurrencyShares"] == 80
    assert plc["spec"]["limited"]["lendablePercent"] == 0


def test_every_request_the_operators_roles_allow_goes_to_its_level(
    plane: ControlPlane, level: Level, chart: list[dict[str, Any]], kubectl_on: Kubectl
) -> None:
    answers: list[tuple[str, Answer]] = []
    for role, rule in operator_rules(chart):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    name = (rule.get("resourceNames") or ["apf-probe"])[0]
                    answer = probe(level.operator, group, resource, verb, name, NAMESPACE)
                    answers.append((f"{role}: {verb} {group}/{resource}", answer))
    assert len(answers) >= 30, answers
    for request, answer in answers:
        assert answer.flow_schema == level.flow_schema, (request, answer)
        assert answer.priority_level == level.priority_level, (request, answer)
        # The roles were applied: allowed (404, or 400 for an empty dry-run body), never refused.
        assert answer.status not in (401, 403, 429), (request, answer)
    metrics = plane.get("/metrics")[1].decode()
    rejected = metric(
        metrics, "apiserver_flowcontrol_rejected_requests_total", priority_level=level.name
    )
    assert rejected == 0
    # What the roles do not name (a ConfigMap) stays in the built-in schema of accounts.
    other = probe(level.operator, "", "configmaps", "list", "", NAMESPACE)
    assert other.status == 403, other
    assert other.flow_schema == uid(kubectl_on, "flowschemas", "service-accounts"), other


def status_write(namespace: str, names: list[str]) -> Callable[[Identity, int], Answer]:
    def write(identity: Identity, count: int) -> Answer:
        name = names[count % len(names)]
        path = f"/apis/headroom.dev/v1alpha1/namespaces/{namespace}/reservations/{name}/status"
        body = {"status": {"phase": "Pending", "message": f"write {count}"}}
        return identity.request("PATCH", path, body, MERGE)

    return write


def lease_renewal(identity: Identity, count: int) -> Answer:
    """GET and PUT of the Lease, as leader election renews it (the PUT is recorded)."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/headroom-apf"
    current = identity.request("GET", path)
    if current.status != 200:
        return current
    lease = json.loads(current.body)
    lease["spec"]["renewTime"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return identity.request("PUT", path, lease)


def reservation_create(identity: Identity, count: int) -> Answer:
    body = {
        "apiVersion": "headroom.dev/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": f"flood-{uuid.uuid4().hex[:12]}"},
        "spec": {"node": "flooded-node", "ramMB": 1},
    }
    path = f"/apis/headroom.dev/v1alpha1/namespaces/{TENANT}/reservations"
    return identity.request("POST", path, body)


def test_a_flood_by_another_account_does_not_starve_the_operators_writes(
    plane: ControlPlane, level: Level, kubectl_on: Kubectl
) -> None:
    # More flood in flight than the whole server has seats: its level must queue it.
    assert FLOOD_THREADS > INFLIGHT + MUTATING_INFLIGHT
    bound = kubectl_on(
        "create", "rolebinding", "flooder-edit", "-n", TENANT,
        "--clusterrole=headroom-edit", f"--serviceaccount={TENANT}:flooder",
    )  # fmt: skip
    assert bound.returncode == 0, bound.stderr
    names = [f"held-{i}" for i in range(16)]
    held = [
        {
            "apiVersion": "headroom.dev/v1alpha1",
            "kind": "Reservation",
            "metadata": {"name": name, "namespace": TENANT},
            "spec": {"node": "quiet-node", "ramMB": 1},
        }
        for name in names
    ]
    created = kubectl_on("apply", "-f", "-", input=yaml.safe_dump_all(held))
    assert created.returncode == 0, created.stderr
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "headroom-apf"},
        "spec": {"holderIdentity": "apf-test", "leaseDurationSeconds": 15},
    }
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
    assert level.operator.request("POST", leases, lease).status == 201
    flooder = Identity(plane, Path(plane.workdir) / "flooder", FLOODER, FLOODER_GROUPS)
    eventually(lambda: _created(reservation_create(flooder, 0)))
    workload_low = uid(kubectl_on, "prioritylevelconfigurations", "workload-low")
    before = plane.get("/metrics")[1].decode()

    writers_stop, flood_stop = threading.Event(), threading.Event()
    writers = [(level.operator.clone(), status_write(TENANT, names)) for _ in range(2)]
    writers.append((level.operator.clone(), lease_renewal))
    writer_threads, writer_results = run_all(writers, writers_stop)
    quiet_start = time.monotonic()
    time.sleep(QUIET_SECONDS)
    flood_start = time.monotonic()
    flood_jobs = [(flooder.clone(), reservation_create) for _ in range(FLOOD_THREADS)]
    flood_threads, flood_results = run_all(flood_jobs, flood_stop)
    time.sleep(FLOOD_SECONDS)
    flood_end = time.monotonic()
    flood_stop.set()
    for thread in flood_threads:
        thread.join(60)
    writers_stop.set()
    for thread in writer_threads:
        thread.join(60)
    assert not [t for t in writer_threads + flood_threads if t.is_alive()]
    after = plane.get("/metrics")[1].decode()

    ours = [s for samples in writer_results for s in samples]
    assert not [s for s in ours if s.answer is None], [s.error for s in ours if s.error][:5]
    for sample in ours:
        assert sample.answer is not None
        assert sample.answer.status == 200, sample  # never 429, never anything else
        assert sample.answer.flow_schema == level.flow_schema, sample
        assert sample.answer.priority_level == level.priority_level, sample
    for samples in writer_results:  # each writer was served while the flood ran
        assert rate(samples, flood_start, flood_end) > 0, samples[-5:]
    flood = [s for samples in flood_results for s in samples]
    assert not [s for s in flood if s.answer is None], [s.error for s in flood if s.error][:5]
    answers = [s.answer for s in flood if s.answer is not None]
    assert {a.status for a in answers} <= {201, 429}, {a.status for a in answers}
    assert {a.priority_level for a in answers} == {workload_low}
    created_count = sum(a.status == 201 for a in answers)
    assert created_count > 0

    def delta(metric_name: str, **labels: str) -> float:
        return metric(after, metric_name, **labels) - metric(before, metric_name, **labels)

    # The server's own count agrees: nothing in the operator's level was refused.
    assert delta("apiserver_flowcontrol_rejected_requests_total", priority_level=level.name) == 0
    wait = "apiserver_flowcontrol_request_wait_duration_seconds"
    levels = (level.name, "workload-low")
    mean_wait_ms = {
        n: round(
            1000
            * delta(f"{wait}_sum", priority_level=n, execute="true")
            / max(1.0, delta(f"{wait}_count", priority_level=n, execute="true")),
            1,
        )
        for n in levels
    }
    seats = {
        n: metric(after, "apiserver_flowcontrol_nominal_limit_seats", priority_level=n)
        for n in levels
    }
    status_rates = [rate(s, quiet_start, flood_start) for s in writer_results[:2]]
    print(
        f"\nseats {seats}; operator status writes/s quiet {sum(status_rates):.0f}, under the"
        f" flood {sum(rate(s, flood_start, flood_end) for s in writer_results[:2]):.0f};"
        f" lease renewals/s quiet {rate(writer_results[2], quiet_start, flood_start):.0f},"
        f" under the flood {rate(writer_results[2], flood_start, flood_end):.0f};"
        f" flood {created_count / (flood_end - flood_start):.0f} creates/s,"
        f" {sum(a.status == 429 for a in answers)} x 429;"
        f" mean wait in APF's queues (ms) {mean_wait_ms}"
    )


def _created(answer: Answer) -> None:
    assert answer.status == 201, answer  # RBAC's cache has the new RoleBinding
