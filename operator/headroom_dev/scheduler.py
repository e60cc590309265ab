"""A second, stock kube-scheduler whose extender is Headroom (issue 30, being built).

The shape the chart is to deploy (``docs/development/design-scheduler-extender.md``):
one profile, ``schedulerName: headroom``, scoring every node, short backoffs, and one
extender with ``nodeCacheCapable: true``. Here on loopback (HTTPS with a client
certificate, as the chart's, or plain HTTP), beside a
:class:`ControlPlane` started with ``controllers=True`` (whose own kube-scheduler keeps
scheduling every other pod), with the identity ``system:kube-scheduler``.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from headroom_dev.controllers import BUILD
from headroom_dev.process import Child, binary, free_port, https_get

if TYPE_CHECKING:
    from headroom_dev.controlplane import ControlPlane

NAME = "headroom-scheduler"
SCHEDULER_NAME = "headroom"
#: The Secret the operator writes the scheduler's client certificate into (the chart's).
CLIENT_SECRET = "headroom-scheduler-client"


def extender_over_tls(port: int, namespace: str) -> dict[str, Any]:
    """The operator config that serves the extender on loopback's ``port`` as the chart
    does: HTTPS with the webhook's certificate (its Secret in ``namespace``, shared by
    replicas; no webhook configuration is kept), answering only the client certificate
    the operator writes into :data:`CLIENT_SECRET`."""
    return {
        "extenderPort": port,
        "extenderHost": "127.0.0.1",
        "extenderClientSecret": CLIENT_SECRET,
        "webhook": {
            "enabled": True,
            "host": "127.0.0.1",
            "port": free_port(),
            "certificate": {
                "namespace": namespace,
                "secretName": "headroom-webhook-cert",
                "extraNames": ["127.0.0.1"],
                "webhookConfiguration": None,
            },
        },
    }


def client_files(
    core: client.CoreV1Api, namespace: str, directory: Path, timeout: float = 30.0
) -> Path:
    """The client Secret's files in ``directory``, as the scheduler's pod mounts them,
    once the operator has written the Secret."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            secret = core.read_namespaced_secret(CLIENT_SECRET, namespace)
            break
        except ApiException as error:
            if error.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    directory.mkdir(exist_ok=True)
    for key, value in (secret.data or {}).items():
        (directory / key).write_bytes(base64.b64decode(value))
    return directory


class HeadroomScheduler:
    def __init__(
        self,
        plane: ControlPlane,
        extender_url: str | None,
        *,
        name: str = NAME,
        scheduler_name: str = SCHEDULER_NAME,
        config: dict[str, Any] | None = None,
        qps: float | None = None,
        client_tls: Path | None = None,
    ) -> None:
        """``name``: of its files and certificate; a second one beside the first is
        another name (both unelected: each schedules every ``headroom`` pod).
        ``extender_url`` None: the same scheduler without the extender (a benchmark's
        baseline), under another ``scheduler_name``. ``config``: a whole
        KubeSchedulerConfiguration instead (the chart's), run as it is but for what only
        this machine has: its client connection, no leader election (the harness's
        identity may hold only the Lease kube-scheduler), and ``extender_url``. ``qps``:
        its API client's rate (burst twice that); None: kube-scheduler's default, 50
        requests per second after a burst of 100, which bounds its Bindings. ``client_tls``:
        a directory with the operator's client Secret's files (``tls.crt``, ``tls.key``,
        ``ca.crt``), for an ``https://`` ``extender_url``."""
        self.plane, self.port = plane, free_port()
        work, pki = plane.workdir, plane.pki
        plane.ca.serving(name).write(pki, name)
        kubeconfig = plane.write_kubeconfig(work / f"{name}.kubeconfig", "system:kube-scheduler")
        self.config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)}
            | ({"qps": qps, "burst": int(2 * qps)} if qps is not None else {}),
            "leaderElection": {"leaderElect": False},
            "podInitialBackoffSeconds": 1,
            "podMaxBackoffSeconds": 5,
            "profiles": [{"schedulerName": scheduler_name, "percentageOfNodesToScore": 100}],
        }
        tls: dict[str, Any] = {}
        if client_tls is not None:
            files = {"certFile": "tls.crt", "keyFile": "tls.key", "caFile": "ca.crt"}
            tls = {
                "enableHTTPS": True,
                "tlsConfig": {field: str(client_tls / f) for field, f in files.items()},
            }
        if config is not None:
            self.config = {
                **config,
                "clientConnection": self.config["clientConnection"],
                "leaderElection": self.config["leaderElection"],
                "extenders": [
                    {**extender, "urlPrefix": extender_url, **tls}
                    for extender in config.get("extenders") or []
                ],
            }
        elif extender_url is not None:
            self.config["extenders"] = [
                {
                    "urlPrefix": extender_url,
                    "filterVerb": "filter",
                    "prioritizeVerb": "prioritize",
                    "bindVerb": "bind",
                    "weight": 1,
                    "nodeCacheCapable": True,
                    "httpTimeout": "5s",
                    **tls,
                }
            ]
        config_file = work / f"{name}.yaml"
        config_file.write_text(yaml.safe_dump(self.config))
        self.child = Child(name, [], work / f"{name}.log")
        self._argv = [
            "--config",
            str(config_file),
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--tls-cert-file={pki / f'{name}.crt'}",
            f"--tls-private-key-file={pki / f'{name}.key'}",
        ]

    def start(self, timeout: float = 60.0) -> HeadroomScheduler:
        self.child.argv = [str(binary("kube-scheduler", BUILD)), *self._argv]
        self.child.start()
        self.child.wait_until(self._healthy, timeout)
        return self

    def stop(self) -> None:
        self.child.stop()

    def _healthy(self) -> bool:
        status, _ = https_get(self.port, "/healthz", self.plane.ssl_context())
        return status == 200
