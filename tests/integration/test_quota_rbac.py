"""Who may write and read HeadroomQuotas: a tenant bound to the built-in ``edit`` role in
its namespace may claim memory there, may read quotas (the chart's ``quotaReaders``),
and may never write one; a platform admin (``quotaAdmins``) writes them, never their
status.

The chart's user roles are rendered with helm and applied to the real API server; the
people are client-certificate identities. This control plane runs no
kube-controller-manager, so nothing fills the built-in ``edit`` role from the roles
labelled ``aggregate-to-edit`` (it has no rules here): :func:`aggregated` does what the
clusterrole-aggregation controller does, for the length of a test, so that ``edit`` is
what a real cluster has, ``headroom-edit`` included (or not, with
``rbac.aggregateToEditRoles=false``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from headroom.api.constants import GROUP, VERSION
from headroom_dev import reservations as rsv
from headroom_dev.apply import api_client
from headroom_dev.controlplane import ControlPlane
from tests.integration.test_chart import Kubectl, render
from tests.polling import eventually

QUOTAS = "headroomquotas"
READER, ADMIN = "headroom-quota-reader", "headroom-quota-admin"
USER_ROLES = ("headroom-edit", "headroom-view", "headroom-nodeheadroom-reader", READER, ADMIN)
BINDINGS = (READER, ADMIN)


def quota(name: str, namespace: str, ram_mb: int = 4096) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HeadroomQuota",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "ramMB": ram_mb,
        },
    }


def once_allowed(call: Callable[[], Any]) -> Any:
    """``call()``, retried while it is forbidden: the authorizer's cache sees new roles
    and bindings within a moment."""

    def attempt() -> Any:
        try:
            return call()
        except client.ApiException as error:
            if error.status == 403:
                raise AssertionError(error.body) from None
            raise

    return eventually(attempt)


def status_of(error: pytest.ExceptionInfo[client.ApiException]) -> int:
    return int(error.value.status)


@pytest.fixture
def chart_user_roles(kubectl: Kubectl, crds: list[str]) -> Iterator[Callable[..., None]]:
    """Apply the chart's user ClusterRoles (and the quota bindings) rendered with values;
    afterwards the defaults again, and no quota binding."""

    def apply(*values: str) -> None:
        docs = [d for d in render(*values) if d["metadata"]["name"] in USER_ROLES]
        assert {d["kind"] for d in docs} <= {"ClusterRole", "ClusterRoleBinding"}
        result = kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(docs)
        )
        assert result.returncode == 0, result.stderr

    yield apply
    apply()  # headroom-edit aggregated again, as every other test expects
    for binding in BINDINGS:
        kubectl("delete", "clusterrolebinding", binding, "--ignore-not-found")


def aggregate_rules(roles: dict[str, dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The rules the clusterrole-aggregation controller gives ``name``: those of every
    ClusterRole its aggregationRule selects, each one aggregated in turn (the built-in
    view is labelled aggregate-to-edit, and edit aggregate-to-admin)."""
    role = roles[name]
    if not role.get("aggregationRule"):
        return list(role.get("rules") or [])
    selectors = [
        s.get("matchLabels") or {} for s in role["aggregationRule"]["clusterRoleSelectors"]
    ]
    rules: list[dict[str, Any]] = []
    for other, obj in sorted(roles.items()):
        labels = obj["metadata"].get("labels") or {}
        if other != name and any(labels.items() >= s.items() for s in selectors):
            rules += [r for r in aggregate_rules(roles, other) if r not in rules]
    return rules


@pytest.fixture
def aggregated(kubectl: Kubectl) -> Iterator[Callable[[str], list[dict[str, Any]]]]:
    """``aggregated("edit")``: fill a built-in role as the clusterrole-aggregation
    controller would (:func:`aggregate_rules`); its own rules come back afterwards."""
    saved: dict[str, list[dict[str, Any]]] = {}

    def aggregate(name: str) -> list[dict[str, Any]]:
        listed = json.loads(kubectl("get", "clusterroles", "-o", "json").stdout)["items"]
        roles = {r["metadata"]["name"]: r for r in listed}
        saved.setdefault(name, roles[name].get("rules") or [])
        rules = aggregate_rules(roles, name)
        patched = kubectl(
            "patch", "clusterrole", name, "--type=merge", "-p", json.dumps({"rules": rules})
        )
        assert patched.returncode == 0, patched.stderr
        return rules

    yield aggregate
    for name, rules in saved.items():
        kubectl("patch", "clusterrole", name, "--type=merge", "-p", json.dumps({"rules": rules}))


@pytest.fixture
def quotas(custom: client.CustomObjectsApi, crds: list[str]) -> Iterator[list[str]]:
    """Names of quotas to delete after the test (they are cluster-scoped)."""
    names: list[str] = []
    yield names
    for name in names:
        try:
            custom.delete_cluster_custom_object(GROUP, VERSION, QUOTAS, name)
        except client.ApiException as error:
            if error.status != 404:
                raise


def person(
    control_plane: ControlPlane, tmp_path: Path, user: str, *groups: str
) -> client.CustomObjectsApi:
    config = control_plane.write_kubeconfig(tmp_path / f"{user}.kubeconfig", user, groups)
    return client.CustomObjectsApi(api_client(config))


def bind_edit(kubectl: Kubectl, namespace: str, group: str, role: str = "edit") -> None:
    """The usual grant of a team in its namespace: a RoleBinding to a ClusterRole."""
    result = kubectl(
        "create", "rolebinding", f"{group}-{role}", f"--clusterrole={role}", f"--group={group}",
        "-n", namespace,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_a_tenant_with_edit_reads_quotas_and_cannot_write_them(
    control_plane: ControlPlane,
    chart_user_roles: Callable[..., None],
    aggregated: Callable[[str], list[dict[str, Any]]],
    kubectl: Kubectl,
    custom: client.CustomObjectsApi,
    quotas: list[str],
    namespace: str,
    tmp_path: Path,
) -> None:
    team, outsider = f"ml-{uuid.uuid4().hex[:6]}", f"web-{uuid.uuid4().hex[:6]}"
    chart_user_roles(f"quotaReaders={json.dumps({'groups': [team]})}")
    edit = aggregated("edit")
    # headroom-edit is in edit (aggregateToEditRoles is on by default); quotas are not.
    assert any(r["resources"] == ["reservations"] and "create" in r["verbs"] for r in edit)
    assert not [r for r in edit if "headroomquotas" in r.get("resources", [])]
    bind_edit(kubectl, namespace, team)
    bind_edit(kubectl, namespace, outsider)  # edit too, but not a quota reader
    name = f"team-{uuid.uuid4().hex[:8]}"
    quotas.append(name)
    custom.create_cluster_custom_object(GROUP, VERSION, QUOTAS, quota(name, namespace))
    tenant = person(control_plane, tmp_path, "tenant", team)
    other = person(control_plane, tmp_path, "other", outsider)

    # edit works: the tenant claims memory in its namespace (the authorizer's cache
    # sees the new rules and bindings within a moment).
    once_allowed(lambda: rsv.create(tenant, namespace, "mine", "some-node", 512))

    def reads() -> None:
        assert (
            tenant.get_cluster_custom_object(GROUP, VERSION, QUOTAS, name)["spec"]["ramMB"] == 4096
        )
        listed = tenant.list_cluster_custom_object(GROUP, VERSION, QUOTAS)["items"]
        assert name in [q["metadata"]["name"] for q in listed]

    once_allowed(reads)

    attempts: dict[str, Callable[[], object]] = {
        "create": lambda: tenant.create_cluster_custom_object(
            GROUP, VERSION, QUOTAS, quota(f"mine-{uuid.uuid4().hex[:6]}", namespace, 1 << 30)
        ),
        "patch": lambda: tenant.patch_cluster_custom_object(
            GROUP, VERSION, QUOTAS, name, {"spec": {"ramMB": 1 << 30}}
        ),
        "replace": lambda: tenant.replace_cluster_custom_object(
            GROUP,
            VERSION,
            QUOTAS,
            name,
            {
                **quota(name, namespace, 1 << 30),
                "metadata": custom.get_cluster_custom_object(GROUP, VERSION, QUOTAS, name)[
                    "metadata"
                ],
            },
        ),
        "patch status": lambda: tenant.patch_cluster_custom_object_status(
            GROUP, VERSION, QUOTAS, name, {"status": {"ramMB": 0, "vramMB": 0, "entries": 0}}
        ),
        "delete": lambda: tenant.delete_cluster_custom_object(GROUP, VERSION, QUOTAS, name),
        "delete collection": lambda: tenant.delete_collection_cluster_custom_object(
            GROUP, VERSION, QUOTAS
        ),
    }
    for what, attempt in attempts.items():
        with pytest.raises(client.ApiException) as refused:
            attempt()
        assert status_of(refused) == 403, what
        assert "headroomquotas" in str(refused.value.body), what
    unchanged = custom.get_cluster_custom_object(GROUP, VERSION, QUOTAS, name)
    assert unchanged["spec"]["ramMB"] == 4096
    assert [q["metadata"]["name"] for q in custom.list_cluster_custom_object(
        GROUP, VERSION, QUOTAS
    )["items"]].count(name) == 1  # fmt: skip

    # Reading comes from quotaReaders, not from edit: an editor who is not listed reads none.
    rsv.create(other, namespace, "theirs", "some-node", 512)  # edit works for them too
    for read in (
        lambda: other.list_cluster_custom_object(GROUP, VERSION, QUOTAS),
        lambda: other.get_cluster_custom_object(GROUP, VERSION, QUOTAS, name),
    ):
        with pytest.raises(client.ApiException) as hidden:
            read()
        assert status_of(hidden) == 403


def test_quota_admins_write_quotas_but_not_their_status(
    control_plane: ControlPlane,
    chart_user_roles: Callable[..., None],
    custom: client.CustomObjectsApi,
    quotas: list[str],
    namespace: str,
    tmp_path: Path,
) -> None:
    platform = f"platform-{uuid.uuid4().hex[:6]}"
    chart_user_roles(f"quotaAdmins={json.dumps({'groups': [platform]})}")
    admin = person(control_plane, tmp_path, "platform-admin", platform)
    name = f"team-{uuid.uuid4().hex[:8]}"
    quotas.append(name)
    once_allowed(
        lambda: admin.create_cluster_custom_object(GROUP, VERSION, QUOTAS, quota(name, namespace))
    )
    admin.patch_cluster_custom_object(GROUP, VERSION, QUOTAS, name, {"spec": {"ramMB": 8192}})
    assert admin.get_cluster_custom_object(GROUP, VERSION, QUOTAS, name)["spec"]["ramMB"] == 8192
    with pytest.raises(client.ApiException) as status:
        admin.patch_cluster_custom_object_status(
            GROUP, VERSION, QUOTAS, name, {"status": {"ramMB": 0, "vramMB": 0, "entries": 0}}
        )
    assert status_of(status) == 403
    # Quotas only: no right on reservations anywhere comes with the role.
    with pytest.raises(client.ApiException) as claim:
        rsv.create(admin, namespace, "sneaky", "some-node", 512)
    assert status_of(claim) == 403
    admin.delete_cluster_custom_object(GROUP, VERSION, QUOTAS, name)
    with pytest.raises(client.ApiException) as gone:
        custom.get_cluster_custom_object(GROUP, VERSION, QUOTAS, name)
    assert status_of(gone) == 404


def test_without_aggregation_edit_does_not_claim_memory(
    control_plane: ControlPlane,
    chart_user_roles: Callable[..., None],
    aggregated: Callable[[str], list[dict[str, Any]]],
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
) -> None:
    """``rbac.aggregateToEditRoles=false``: editors claim nothing until bound to headroom-edit."""
    chart_user_roles("rbac.aggregateToEditRoles=false")
    for role in ("edit", "admin"):
        rules = aggregated(role)
        headroom = [r for r in rules if "headroom.dev" in r.get("apiGroups", [])]
        assert headroom, role  # headroom-view, through view, still reads
        assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in headroom), role
    team = f"ml-{uuid.uuid4().hex[:6]}"
    bind_edit(kubectl, namespace, team)
    tenant = person(control_plane, tmp_path, "editor", team)

    # edit grants the rest (its built-in rules) already
    once_allowed(lambda: client.CoreV1Api(tenant.api_client).list_namespaced_config_map(namespace))
    with pytest.raises(client.ApiException) as refused:
        rsv.create(tenant, namespace, "mine", "some-node", 512)
    assert status_of(refused) == 403
    bind_edit(kubectl, namespace, team, role="headroom-edit")  # the grant, per namespace
    once_allowed(lambda: rsv.create(tenant, namespace, "mine", "some-node", 512))
