"""Fixtures of the command-line tests: run ``kubectl headroom`` as any identity."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from headroom.api.constants import GROUP, VERSION
from headroom.client import Connection, from_kubeconfig
from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane, binary
from headroom_dev.operator import OperatorProcess
from headroom_dev.webhooks import OUTLOOK_PATH, outlook_configuration
from tests.integration.cli_checks import Cli, Hold
from tests.integration.metrics_access_support import Accounts
from tests.integration.stand_in import DeviceAdmitter
from tests.integration.test_webhook import Gate
from tests.polling import eventually

VENV_BIN = Path(sys.executable).parent
#: The outlook webhook's timeoutSeconds, as the chart has it.
OUTLOOK_TIMEOUT_SECONDS = 2


@pytest.fixture
def admission(api_client: client.ApiClient) -> client.AdmissionregistrationV1Api:
    return client.AdmissionregistrationV1Api(api_client)


@pytest.fixture
def outlook(admission: client.AdmissionregistrationV1Api, namespace: str) -> Iterator[Gate]:
    """The Reservations' validating configuration, sent to ``gate.port`` on loopback,
    beside the pods' mutating one of the same name, as the chart has them; the operator
    keeps the caBundle of both (``webhookConfiguration`` names them)."""
    gate = Gate(admission, namespace, "kube-system")
    gate.register()
    admission.create_validating_webhook_configuration(
        outlook_configuration(
            gate.name,
            f"https://127.0.0.1:{gate.port}{OUTLOOK_PATH}",
            timeout_seconds=OUTLOOK_TIMEOUT_SECONDS,
        )
    )
    yield gate
    admission.delete_validating_webhook_configuration(gate.name)
    admission.delete_mutating_webhook_configuration(gate.name)


@pytest.fixture
def cli(control_plane: ControlPlane, namespace: str) -> Cli:
    """``cli("nodes", via="kubectl", kubeconfig=path)``: the admin in the test's namespace
    unless another kubeconfig is given."""

    def run(
        *args: str, via: str = "module", kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        config = kubeconfig or control_plane.kubeconfig
        common = ["--kubeconfig", str(config), "-n", namespace]
        argv = {
            "module": [sys.executable, "-m", "headroom"],
            "script": [str(VENV_BIN / "kubectl-headroom")],
            "kubectl": [str(binary("kubectl")), "headroom"],
        }[via]
        env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
        return subprocess.run(
            [*argv, *args, *common],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
            env=env,
        )

    return run


@pytest.fixture
def hold(control_plane: ControlPlane, namespace: str) -> Hold:
    """The argv of ``hold`` as the admin in the test's namespace, the command after ``--``."""

    def argv(*flags: str, command: list[str], via: str = "module") -> list[str]:
        prefix = {
            "module": [sys.executable, "-m", "headroom"],
            "kubectl": [str(binary("kubectl")), "headroom"],
        }[via]
        common = ["--kubeconfig", str(control_plane.kubeconfig), "-n", namespace]
        return [*prefix, "hold", *common, *flags, "--", *command]

    return argv


@pytest.fixture
def scene(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> str:
    """A node with 8192 MiB to give and 4096 MiB of VRAM, 6144 + 1024 of it held by "held"."""
    node = f"cli-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="9Gi", labels={"nvidia.com/gpu.memory": "4096"})  # limit 8192
    run_operator()
    rsv.create(custom, namespace, "held", node, 6144, 1024)
    rsv.wait_for(custom, namespace, "held")
    return node


#: The operator's config for claim tests: a stale window short enough that a claim whose
#: heartbeats stopped is reclaimed within the test.
FAST_STALE = {"limits": {"heartbeatStaleWindow": "3s"}, "sweepPeriod": "200ms"}


@pytest.fixture
def connection(control_plane: ControlPlane, namespace: str) -> Connection:
    """The claim library's connection: the admin, in the test's namespace."""
    return from_kubeconfig(str(control_plane.kubeconfig), namespace=namespace)


@pytest.fixture
def claim_node(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
) -> str:
    """A node with 8192 MiB to give and 4096 MiB of VRAM; the operator runs with a 3 s
    stale window."""
    node = f"claim-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="9Gi", labels={"nvidia.com/gpu.memory": "4096"})  # limit 8192
    run_operator(FAST_STALE)

    def summarized() -> None:  # as for any node that has been there a while
        listed = custom.list_cluster_custom_object(GROUP, VERSION, "nodeheadrooms")["items"]
        known = [
            (h.get("status") or {}).get("capacityKnown")  # created, status not written yet
            for h in listed
            if h["metadata"]["name"] == node
        ]
        assert known == [True], known

    eventually(summarized)
    return node


@pytest.fixture
def device_admitter(
    custom: client.CustomObjectsApi, namespace: str, crds: list[str]
) -> Iterator[DeviceAdmitter]:
    """No operator: a stand-in admits each claim of the namespace on two GPU UUIDs
    (``tests.integration.stand_in``)."""
    admitter = DeviceAdmitter(custom, namespace)
    admitter.start()
    yield admitter
    admitter.stop()


@pytest.fixture
def accounts(core: client.CoreV1Api, namespace: str) -> Iterator[Accounts]:
    """ServiceAccounts of the test's namespace, and a metrics-reader role to grant them."""
    made = Accounts(core, namespace)
    yield made
    made.remove()
