"""``kubectl headroom fit`` and ``summary`` with HeadroomQuotas on the real API server:
the quota, not the node, named as what refuses; a node outside a quota's nodeSelector
left out; a tenant who may not read quotas warned once, and served all the same.

What the governed namespace holds is held by real reservations on a node the
commands are not asked about, and the quota's status is the operator's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from headroom.api.constants import GROUP, VERSION
from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane
from headroom_dev.operator import OperatorProcess
from tests.integration.cli_checks import Cli, assert_one_line_error
from tests.integration.test_chart import Kubectl
from tests.integration.test_fit import headroom_status
from tests.polling import eventually

QUOTAS = "headroomquotas"


@pytest.fixture
def pools(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
) -> str:
    """Two nodes labelled ``quota-test=<tag>``, 16384 MiB to give each: ``<tag>-gpu``
    (pool=gpu) and ``<tag>-cpu`` (pool=cpu). Returns the tag."""
    tag = f"q-{uuid.uuid4().hex[:6]}"
    for pool in ("gpu", "cpu"):
        make_node(f"{tag}-{pool}", memory="17Gi", labels={"quota-test": tag, "pool": pool})
    make_node(f"{tag}-big", memory="129Gi")  # where what the quotas hold is held
    run_operator({"summaryInterval": "200ms"})

    def published() -> None:
        for pool in ("gpu", "cpu"):
            assert headroom_status(custom, f"{tag}-{pool}").get("allocatableRAMMB") == 16384

    eventually(published)
    return tag


@pytest.fixture
def quotas(
    custom: client.CustomObjectsApi, crds: list[str], pools: str
) -> Iterator[Callable[..., str]]:
    """``quota(namespace, held_mb, **spec)``: a HeadroomQuota governing ``namespace``, in
    which a reservation on ``<tag>-big`` holds ``held_mb`` of RAM, once the operator's
    status of the quota says so; deleted after the test."""
    created: list[str] = []

    def make(namespace: str, held_mb: int = 0, **spec: Any) -> str:
        name = f"team-{uuid.uuid4().hex[:6]}"
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "HeadroomQuota",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                **spec,
            },
        }
        custom.create_cluster_custom_object(GROUP, VERSION, QUOTAS, body)
        created.append(name)
        if held_mb:
            rsv.create(custom, namespace, f"held-{name}", f"{pools}-big", held_mb)
            assert rsv.wait_for(custom, namespace, f"held-{name}")["status"]["phase"] == (
                "Admitted"
            )

        def counted() -> None:
            status = custom.get_cluster_custom_object(GROUP, VERSION, QUOTAS, name).get("status")
            assert (status or {}).get("ramMB") == held_mb, status

        eventually(counted)
        return name

    yield make
    for name in created:
        custom.delete_cluster_custom_object(GROUP, VERSION, QUOTAS, name)


def test_fit_names_the_quota_that_refuses_and_summary_lists_it(
    cli: Cli,
    pools: str,
    quotas: Callable[..., str],
    namespace: str,
    custom: client.CustomObjectsApi,
) -> None:
    selector = f"quota-test={pools}"
    assert cli("fit", "--ram", "16384", "-l", selector).returncode == 0  # the nodes have room
    name = quotas(namespace, 56 * 1024, ramMB=64 * 1024)
    rsv.create(custom, namespace, "waits", f"{pools}-big", 16384, wait="10m")
    assert rsv.wait_for(custom, namespace, "waits", ("Queued",))["status"]["reason"] == (
        "QuotaExceeded"
    )

    def queued() -> None:
        status = custom.get_cluster_custom_object(GROUP, VERSION, QUOTAS, name)["status"]
        assert status.get("queued") == 1, status

    eventually(queued)
    refused = cli("fit", "--ram", "16384", "-l", selector)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert_one_line_error(
        refused,
        f"namespace {namespace} (quota {name}): holds 56 GiB of 64 GiB RAM; requested 16 GiB",
        "2 nodes have room for 16384 MiB RAM: the quota refuses, not the nodes",
    )
    fits = cli("fit", "--ram", "8192", "-l", selector, "-o", "json")  # what is left of it
    assert fits.returncode == 0, fits.stderr
    assert fits.stderr == ""
    assert sorted(room["node"] for room in json.loads(fits.stdout)) == [
        f"{pools}-cpu",
        f"{pools}-gpu",
    ]

    summary = cli("summary")
    assert summary.returncode == 0, summary.stderr
    section = summary.stdout.split("\n\n")[1].splitlines()
    assert section[0].split()[0] == "QUOTA"
    (row,) = [line.split() for line in section[1:] if line.split()[0] == name]
    assert row == [name, "57344/65536", "0/-", "1/-", "1", "false"]
    data = json.loads(cli("summary", "-o", "json").stdout)
    (mine,) = [quota for quota in data["quotas"] if quota["name"] == name]
    assert (mine["ramMB"], mine["ramLimitMB"], mine["namespaces"]) == (57344, 65536, [namespace])


def test_fit_leaves_out_the_nodes_outside_the_quotas_node_selector(
    cli: Cli, pools: str, quotas: Callable[..., str], namespace: str
) -> None:
    name = quotas(namespace, nodeSelector={"matchLabels": {"pool": "gpu"}})
    fits = cli("fit", "--ram", "1024", "-l", f"quota-test={pools}")
    assert fits.returncode == 0, fits.stderr
    assert [line.split()[0] for line in fits.stdout.splitlines()[1:]] == [f"{pools}-gpu"]
    refused = cli("fit", "--ram", "1024", "-l", f"quota-test={pools},pool=cpu")
    assert refused.returncode == 1
    assert_one_line_error(
        refused,
        f"{pools}-cpu: namespace {namespace} (quota {name}): node {pools}-cpu is outside "
        "spec.nodeSelector (pool=gpu)",
    )


def test_a_tenant_who_may_not_read_quotas_is_told_once_and_served(
    cli: Cli,
    pools: str,
    quotas: Callable[..., str],
    kubectl: Kubectl,
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
) -> None:
    """NodeHeadrooms readable, quotas not: fit warns once and lists the nodes by room;
    once the tenant may read quotas, the quota is what refuses."""
    user = f"tenant-{uuid.uuid4().hex[:6]}"
    roles = {
        f"{user}-nodes": "nodeheadrooms.headroom.dev",
        f"{user}-quotas": "headroomquotas.headroom.dev",
    }
    for role, resource in roles.items():
        created = kubectl(
            "create", "clusterrole", role, "--verb=get,list,watch", f"--resource={resource}"
        )
        assert created.returncode == 0, created.stderr
    try:
        bound = kubectl(
            "create", "clusterrolebinding", f"{user}-nodes", f"--clusterrole={user}-nodes",
            f"--user={user}",
        )  # fmt: skip
        assert bound.returncode == 0, bound.stderr
        tenant = control_plane.write_kubeconfig(tmp_path / "tenant.kubeconfig", user)
        name = quotas(namespace, 60 * 1024, ramMB=64 * 1024)
        selector = f"quota-test={pools}"

        def served_without_quotas() -> None:
            result = cli("fit", "--ram", "8192", "-l", selector, kubeconfig=tenant)
            assert result.returncode == 0, result.stderr
            (warning,) = result.stderr.splitlines()
            assert warning.startswith("Warning: HeadroomQuotas not readable"), warning
            assert "quotas not checked" in warning
            assert "headroom-quota-reader" in warning
            assert len(result.stdout.splitlines()) == 3  # the header and both nodes

        eventually(served_without_quotas)
        bound = kubectl(
            "create", "clusterrolebinding", f"{user}-quotas", f"--clusterrole={user}-quotas",
            f"--user={user}",
        )  # fmt: skip
        assert bound.returncode == 0, bound.stderr

        def refused_by_the_quota() -> None:
            result = cli("fit", "--ram", "8192", "-l", selector, kubeconfig=tenant)
            assert result.returncode == 1, result.stdout + result.stderr
            assert_one_line_error(
                result,
                f"namespace {namespace} (quota {name}): holds 60 GiB of 64 GiB RAM; "
                "requested 8 GiB",
            )

        eventually(refused_by_the_quota)
    finally:
        for role in roles:
            kubectl("delete", "clusterrolebinding", role, "--ignore-not-found")
            kubectl("delete", "clusterrole", role, "--ignore-not-found")
