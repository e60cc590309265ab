"""The local control plane is a real, pinned, RBAC-enforcing Kubernetes API."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from kubernetes import client

from headroom_dev.apply import api_client
from headroom_dev.controlplane import ControlPlane, ControlPlaneError, binary
from tests.polling import eventually

ROOT = Path(__file__).resolve().parents[2]


def pinned_kubernetes_version() -> str:
    go_mod = (ROOT / "hack/controlplane/kubernetes/go.mod").read_text()
    match = re.search(r"^require k8s\.io/kubernetes (v\S+)$", go_mod, re.MULTILINE)
    assert match, "hack/controlplane/kubernetes/go.mod does not pin k8s.io/kubernetes"
    return match.group(1)


def test_server_reports_the_pinned_version(control_plane: ControlPlane) -> None:
    status, body = control_plane.get("/version")
    assert status == 200
    version = json.loads(body)
    assert version["gitVersion"] == pinned_kubernetes_version()
    assert (version["major"], version["minor"]) == tuple(
        pinned_kubernetes_version().lstrip("v").split(".")[:2]
    )


def test_namespaces_and_nodes_with_status(
    core: client.CoreV1Api, namespace: str, make_node: Callable[..., Any]
) -> None:
    assert core.read_namespace(namespace).status.phase == "Active"
    make_node("cp-node-a", memory="64Gi", allocatable="63Gi", labels={"pool": "gpu"})
    node = core.read_node("cp-node-a")
    assert node.status.capacity["memory"] == "64Gi"
    assert node.status.allocatable["memory"] == "63Gi"
    assert node.metadata.labels["pool"] == "gpu"


def test_rbac_denies_then_allows_an_unprivileged_user(
    control_plane: ControlPlane, core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = control_plane.write_kubeconfig(tmp_path / "alice.kubeconfig", "alice", ("dev",))
    alice = client.CoreV1Api(api_client(kubeconfig))

    with pytest.raises(client.ApiException) as denied:
        alice.list_namespaced_config_map(namespace)
    assert denied.value.status == 403
    message = json.loads(denied.value.body)["message"]
    assert 'User "alice" cannot list resource "configmaps"' in message

    rbac = client.RbacAuthorizationV1Api(core.api_client)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "cm-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "alice-cm-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "cm-reader",
            },
            "subjects": [
                {"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}
            ],
        },
    )

    def allowed() -> None:
        # The RBAC authorizer reads bindings from an informer: a grant lands a moment
        # after the create returns (seen on CI: 403 right after the binding).
        try:
            alice.list_namespaced_config_map(namespace)
        except client.ApiException as error:
            if error.status == 403:
                raise AssertionError("still denied") from error
            raise

    eventually(allowed, timeout=10)
    # The grant is namespaced: still denied elsewhere.
    with pytest.raises(client.ApiException) as elsewhere:
        alice.list_namespaced_config_map("default")
    assert elsewhere.value.status == 403


def gone(pid: int) -> bool:
    """No process with this pid runs (a reaped or zombie child counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_teardown_leaves_no_process_and_no_directory() -> None:
    plane = ControlPlane().start()
    pids = [p.popen.pid for p in (plane.etcd, plane.apiserver) if p.popen]
    workdir = plane.workdir
    assert len(pids) == 2
    assert all(psutil.pid_exists(pid) for pid in pids)
    plane.stop()
    assert not workdir.exists()
    for pid in pids:
        assert gone(pid), f"process {pid} still runs: {psutil.Process(pid).cmdline()}"


def test_teardown_after_a_failing_body_still_cleans_up() -> None:
    seen: dict[str, object] = {}

    def failing_body() -> None:
        with ControlPlane() as plane:
            assert plane.apiserver.popen is not None
            seen["workdir"], seen["pid"] = plane.workdir, plane.apiserver.popen.pid
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing_body()
    workdir, pid = seen["workdir"], seen["pid"]
    assert isinstance(workdir, Path)
    assert isinstance(pid, int)
    assert not workdir.exists()
    assert gone(pid)


def test_controllers_are_opt_in_and_stop_with_the_plane() -> None:
    plane = ControlPlane(controllers=True).start()
    assert plane.controllers is not None
    children = (plane.etcd, plane.apiserver, *plane.controllers.children)
    pids = [p.popen.pid for p in children if p.popen]
    workdir = plane.workdir
    assert len(pids) == 4
    assert all(psutil.pid_exists(pid) for pid in pids)
    plane.stop()
    assert not workdir.exists()
    for pid in pids:
        assert gone(pid), f"process {pid} still runs: {psutil.Process(pid).cmdline()}"
    assert ControlPlane().controllers is None  # the default stays API-only


def test_a_missing_controller_binary_fails_loudly_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("etcd", "kube-apiserver"):  # everything but the controllers
        (tmp_path / name).symlink_to(binary(name))
    monkeypatch.setenv("HEADROOM_BIN_DIR", str(tmp_path))
    plane = ControlPlane(controllers=True)
    with pytest.raises(
        ControlPlaneError, match=r"kube-controller-manager not found.*make controllers"
    ):
        plane.start()
    assert not plane.workdir.exists()
    assert not plane.apiserver.running


def test_the_controllers_run_are_the_ones_named() -> None:
    named = ("garbage-collector-controller", "node-lifecycle-controller")
    plane = ControlPlane(controllers=named)
    try:
        assert plane.controllers is not None
        argv = plane.controllers._controller_manager_argv()
        assert f"--controllers={','.join(named)}" in argv
        assert ControlPlane(plane.workdir / "x", controllers=()).controllers is None
    finally:
        plane.stop()
