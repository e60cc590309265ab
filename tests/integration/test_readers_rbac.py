"""Who may read headroom: a tenant bound by the RoleBinding of docs/operations/install.md
(RBAC), and the chart's ``nodeHeadroomReaders`` value that grants the cluster-scoped
NodeHeadrooms.

The chart's user roles are rendered with helm and applied to the real API server;
the tenant and the placement ServiceAccount are client-certificate identities.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from headroom_dev.controlplane import ControlPlane
from tests.integration.cli_checks import Cli, assert_one_line_error
from tests.integration.test_chart import Kubectl, render
from tests.polling import eventually

READER = "headroom-nodeheadroom-reader"
USER_ROLES = ("headroom-edit", "headroom-view", READER)
READER_RULES = [
    {
        "apiGroups": ["headroom.dev"],
        "resources": ["nodeheadrooms"],
        "verbs": ["get", "list", "watch"],
    }
]


def readers_value(**subjects: object) -> str:
    return f"nodeHeadroomReaders={json.dumps(subjects)}"


def test_the_readers_value_renders_one_binding_with_its_subjects() -> None:
    docs = render(
        readers_value(
            groups=["ml-team"],
            users=["alice"],
            serviceAccounts=[{"namespace": "ml", "name": "placer"}],
        )
    )
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == READER)
    assert role["rules"] == READER_RULES
    binding = next(
        d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == READER
    )
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": READER,
    }
    assert binding["subjects"] == [
        {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "ml-team"},
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"},
        {"kind": "ServiceAccount", "name": "placer", "namespace": "ml"},
    ]
    by_default = {f"{d['kind']}/{d['metadata']['name']}" for d in render()}
    assert f"ClusterRole/{READER}" in by_default
    assert f"ClusterRoleBinding/{READER}" not in by_default  # no subjects, no binding
    without_rbac = render("rbac.create=false", readers_value(groups=["ml-team"]))
    assert not [d for d in without_rbac if d["metadata"]["name"] == READER]


@pytest.fixture
def chart_user_roles(kubectl: Kubectl, crds: list[str]) -> Iterator[Callable[..., None]]:
    """Apply the chart's user ClusterRoles (and the readers' binding) rendered with values."""

    def apply(*values: str) -> None:
        docs = [d for d in render(*values) if d["metadata"]["name"] in USER_ROLES]
        assert {d["kind"] for d in docs} <= {"ClusterRole", "ClusterRoleBinding"}
        result = kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(docs)
        )
        assert result.returncode == 0, result.stderr

    yield apply
    kubectl("delete", "clusterrolebinding", READER, "--ignore-not-found")


def test_a_tenant_reads_what_it_may_and_says_what_it_may_not(
    cli: Cli,
    scene: str,
    chart_user_roles: Callable[..., None],
    kubectl: Kubectl,
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
) -> None:
    chart_user_roles()
    team = f"ml-team-{uuid.uuid4().hex[:6]}"
    granted = kubectl(  # the doc's grant, verbatim but for the names
        "create", "rolebinding", "ml-headroom", "--clusterrole=headroom-edit", f"--group={team}",
        "-n", namespace,
    )  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    tenant = control_plane.write_kubeconfig(tmp_path / "tenant.kubeconfig", "tenant", (team,))
    placer_user = f"system:serviceaccount:{namespace}:placer"
    placer = control_plane.write_kubeconfig(
        tmp_path / "placer.kubeconfig",
        placer_user,
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
    )

    def reserved() -> None:
        result = cli(
            "reserve",
            "--node",
            scene,
            "--ram",
            "1024",
            "--name",
            "mine",
            "--wait",
            kubeconfig=tenant,
        )
        assert result.returncode == 0, result.stderr

    eventually(reserved)  # the RoleBinding reaches the authorizer's cache

    nodes = cli("nodes", kubeconfig=tenant)
    assert nodes.returncode == 4, nodes.stdout
    assert_one_line_error(
        nodes,
        "cannot list NodeHeadrooms",
        "forbidden",
        "headroom-nodeheadroom-reader",
        "nodeHeadroomReaders",
    )
    assert cli("nodes", kubeconfig=placer).returncode == 4

    summary = cli("summary", "-o", "json", kubeconfig=tenant)
    assert summary.returncode == 0, summary.stderr
    warnings = summary.stderr.splitlines()
    assert len(warnings) == 3, summary.stderr
    assert "NodeHeadrooms not readable" in warnings[0]
    assert READER in warnings[0]
    assert f'counting namespace "{namespace}" only' in warnings[1]
    assert "HeadroomQuotas not readable" in warnings[2]  # no quotaReaders binding either
    assert "headroom-quota-reader" in warnings[2]
    data = json.loads(summary.stdout)
    assert data["quotas"] is None
    assert data["scope"] == "namespace"
    assert data["nodes"] is None
    assert (data["activeEntries"], data["totalReservedMB"]) == (2, 6144 + 1024)
    assert data["reservations"]["Admitted"] == 2

    why = cli("why", "mine", kubeconfig=tenant)
    assert why.returncode == 0, why.stderr
    assert "Phase:   Admitted" in why.stdout
    assert "<not readable>" in why.stdout.split("Events:")[1]
    assert len(why.stderr.splitlines()) == 1
    assert f'Events in namespace "{namespace}" are not readable' in why.stderr
    assert 'built-in "view" role' in why.stderr

    # The doc's way to events: the built-in view role. There is no aggregation
    # controller here, so bind the role it aggregates from (view's own rules).
    viewer = kubectl(
        "create", "rolebinding", "ml-view", "--clusterrole=system:aggregate-to-view",
        f"--group={team}", "-n", namespace,
    )  # fmt: skip
    assert viewer.returncode == 0, viewer.stderr

    def events_shown() -> None:
        result = cli("why", "mine", kubeconfig=tenant)
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        assert "Fits" in result.stdout.split("Events:")[1]

    eventually(events_shown)

    chart_user_roles(
        readers_value(groups=[team], serviceAccounts=[{"namespace": namespace, "name": "placer"}])
    )

    def nodes_shown(kubeconfig: Path) -> None:
        result = cli("nodes", kubeconfig=kubeconfig)
        assert result.returncode == 0, result.stderr
        assert any(line.split()[0] == scene for line in result.stdout.splitlines()[1:]), (
            result.stdout
        )

    eventually(lambda: nodes_shown(tenant))
    eventually(lambda: nodes_shown(placer))
    summary = cli("summary", "-o", "json", kubeconfig=tenant)
    assert summary.returncode == 0, summary.stderr
    warnings = summary.stderr.splitlines()
    assert len(warnings) == 2, summary.stderr
    assert "counting namespace" in warnings[0]  # reservations: still its namespace only
    assert "HeadroomQuotas not readable" in warnings[1]  # quotas: still not bound
    data = json.loads(summary.stdout)
    assert data["nodes"] >= 1
    assert data["withoutNodeHeadroom"]["entries"] == 0
