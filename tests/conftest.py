"""Shared fixtures.

The control plane is real (kube-apiserver + etcd from ``hack/controlplane``),
started once per test session on first use, so unit tests never pay for it.
Each test that needs the cluster gets its own namespace, deleted afterwards.
A control plane that cannot start fails the tests that need it, loudly.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from kubernetes import client
from xdist.scheduler import LoadScopeScheduling

from headroom_dev.apply import api_client as api_client_for
from headroom_dev.apply import install_crds
from headroom_dev.controlplane import ControlPlane
from headroom_dev.nodes import create_node
from headroom_dev.operator import OperatorProcess
from headroom_dev.process import kubectl_for

ROOT = Path(__file__).resolve().parent.parent
CRDS = ROOT / "crds"

# No per-example deadline: it is a timing assertion, and speed is measured in the
# benchmarks. On a fresh clone the first example also pays for compiling and importing
# (a property test failed once at 200 ms on a loaded machine for that alone).
settings.register_profile("headroom", deadline=None)
settings.load_profile("headroom")


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with ControlPlane() as cp:
        yield cp


@pytest.fixture(scope="session")
def controllers_plane() -> Iterator[ControlPlane]:
    """A separate control plane that also runs kube-controller-manager and
    kube-scheduler (garbage collector, ServiceAccounts and their tokens, namespace
    deletion, Deployments), for the tests that need them; the fast API-only
    ``control_plane`` stays what the rest use. Started on first use, once per
    session. Missing binaries fail these tests: ``make controllers`` builds them."""
    with ControlPlane(controllers=True) as cp:
        yield cp


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    api = api_client_for(control_plane.kubeconfig)
    yield api
    api.close()


@pytest.fixture(scope="session")
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.fixture
def make_namespace(core: client.CoreV1Api) -> Iterator[Callable[[], str]]:
    """Fresh namespaces for one test (a second tenant, say); cleaned up after it."""
    made: list[str] = []

    def make() -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        core.create_namespace({"metadata": {"name": name}})
        made.append(name)
        return name

    yield make
    for name in made:
        _clean_namespace(core, name)


@pytest.fixture
def namespace(make_namespace: Callable[[], str]) -> str:
    """A fresh namespace for one test."""
    return make_namespace()


def _clean_namespace(core: client.CoreV1Api, name: str) -> None:
    # Reservations go first, so an operator started by a later test does not
    # rebuild from this test's leftovers.
    try:
        client.CustomObjectsApi(core.api_client).delete_collection_namespaced_custom_object(
            "headroom.dev", "v1alpha1", name, "reservations"
        )
    except client.ApiException as error:
        if error.status != 404:  # 404: the CRDs were never installed in this session
            raise
    # Pods too: with no namespace controller here the namespace stays Terminating
    # (its name is unique, so that harms nothing), but its pods would stay and still
    # be owner pods for an operator started by a later test.
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name)


E2E_ID = "tests/e2e"  # node ids are relative to the root


class EndToEndInOneWorker(LoadScopeScheduling):
    """``make test``'s workers (pytest-xdist, ``-n``): every end-to-end test in one
    worker, in file order, first, since the machine has one real node and they share
    it (and ``make dev``'s and ``make cluster``'s directories); the rest spread over
    the others a module at a time (a module's fixtures are set up once), each worker
    with its own control plane. Most of a test's time is waiting on the API server
    and the operator, so they overlap well. (xdist's own ``loadgroup`` no longer
    groups with pytest 9: it renames items by a field pytest stopped reading.)"""

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(f"{E2E_ID}/"):
            return E2E_ID
        return super()._split_scope(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    if config.getvalue("dist") not in ("load", "loadscope"):
        return None  # a mode asked for by name (each, loadfile, ...): xdist's own
    config.option.loadscopereorder = False  # collection order: tests/e2e comes first
    return EndToEndInOneWorker(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test shows the end of each operator's log it started: a CI run keeps
    nothing else, and a timeout alone does not say what the operator was doing."""
    report: pytest.TestReport = yield
    if report.failed and call.when == "call":
        for number, process in enumerate(getattr(item, "headroom_operators", [])):
            report.sections.append((f"operator {number} log (end)", process.tail(150)))
    return report


@pytest.fixture
def run_operator(
    request: pytest.FixtureRequest, control_plane: ControlPlane, crds: list[str], tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    """Start the operator as a subprocess with a config; stopped after the test."""
    started: list[OperatorProcess] = []
    request.node.headroom_operators = started  # shown if the test fails

    def start(
        config: dict[str, Any] | None = None, wait_ready: bool = True, args: tuple[str, ...] = ()
    ) -> OperatorProcess:
        workdir = tmp_path / f"operator-{len(started)}"
        workdir.mkdir()
        process = OperatorProcess(control_plane.kubeconfig, workdir, config, args)
        started.append(process)
        return process.start(wait_ready=wait_ready)

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def make_node(core: client.CoreV1Api) -> Iterator[Callable[..., Any]]:
    """Create Nodes with a memory capacity; they are deleted after the test."""
    created: list[str] = []

    def make(name: str | None = None, *, memory: str = "32Gi", **kwargs: Any) -> Any:
        node_name = name or f"node-{uuid.uuid4().hex[:8]}"
        created.append(node_name)
        return create_node(core, node_name, memory=memory, **kwargs)

    yield make
    for name in created:
        try:
            core.delete_node(name)
        except client.ApiException as error:
            if error.status != 404:
                raise


@pytest.fixture(scope="session")
def crds(api_client: client.ApiClient) -> list[str]:
    """Install the generated CRDs and wait until the API server serves them."""
    return install_crds(api_client, sorted(CRDS.glob("*.yaml")))


@pytest.fixture(scope="session")
def kubectl(control_plane: ControlPlane) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the built kubectl as the admin: ``kubectl("get", "rsv", input=yaml_text)``."""
    return kubectl_for(control_plane.kubeconfig)
