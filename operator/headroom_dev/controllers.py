"""kube-controller-manager and kube-scheduler beside a :class:`ControlPlane` (opt-in).

The API-only plane starts in seconds and is enough for most tests. Tests that need
what a cluster's controllers do (the garbage collector deleting a NodeHeadroom with
its Node, ServiceAccounts and their tokens, namespace deletion, Deployments making
ReplicaSets) ask for these too: ``ControlPlane(controllers=True)``.

They run the way kubeadm runs them: each with its own client certificate from the
plane's CA (``system:kube-controller-manager`` and ``system:kube-scheduler``, the
users the built-in RBAC bindings name), each controller with its own ServiceAccount
credentials, the plane's service-account private key and root CA, leader election
off (there is one replica), and a serving certificate from the plane's CA on a free
127.0.0.1 port whose ``/healthz`` says when they are up.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from headroom_dev.process import Child, binary, free_port, https_get

if TYPE_CHECKING:
    from headroom_dev.controlplane import ControlPlane

BUILD = "make controllers"

DEFAULT_CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    # Publishes kube-root-ca.crt, which pods' projected ServiceAccount tokens mount.
    "root-ca-certificate-publisher-controller",
    "deployment-controller",
    "replicaset-controller",
)
"""Not ``*``: the node-lifecycle controller would taint the kubelet-less Nodes that
tests create as unreachable, and most others have nothing to do here. A plane with
a real kubelet wants it added (it also lifts the not-ready taint that every new
Node gets, without which kube-scheduler places nothing there)."""

NODE_CONTROLLERS = (
    *DEFAULT_CONTROLLERS,
    "node-lifecycle-controller",
    "job-controller",
    "endpointslice-controller",
    # A PodDisruptionBudget's status (disruptionsAllowed), which every eviction reads.
    "disruption-controller",
)
"""For a plane with a real kubelet (:mod:`headroom_dev.kubelet`): the node-lifecycle
controller lifts the not-ready taint once the kubelet reports Ready, and Jobs run;
EndpointSlices are what the API server's ``--enable-aggregator-routing`` resolver
reads to reach the admission webhook's Service on a ready operator pod."""


class Controllers:
    """kube-controller-manager + kube-scheduler for one control plane."""

    def __init__(self, plane: ControlPlane, controllers: tuple[str, ...] = DEFAULT_CONTROLLERS):
        self.plane = plane
        self.enabled = controllers
        self.controller_manager_port = free_port()
        self.scheduler_port = free_port()
        work, pki = plane.workdir, plane.pki
        for name in ("kube-controller-manager", "kube-scheduler"):
            plane.ca.serving(name).write(pki, name)
        self._kcm_kubeconfig = plane.write_kubeconfig(
            work / "kube-controller-manager.kubeconfig", "system:kube-controller-manager"
        )
        self._scheduler_kubeconfig = plane.write_kubeconfig(
            work / "kube-scheduler.kubeconfig", "system:kube-scheduler"
        )
        # The argv (and so the binary lookup) waits for start(): a missing binary then
        # fails inside ControlPlane.start(), whose clean-up removes the work directory.
        self.controller_manager = Child(
            "kube-controller-manager", [], work / "kube-controller-manager.log"
        )
        self.scheduler = Child("kube-scheduler", [], work / "kube-scheduler.log")

    def start(self, timeout: float = 60.0) -> None:
        self.controller_manager.argv = self._controller_manager_argv()
        self.scheduler.argv = self._scheduler_argv()
        self.controller_manager.start()
        self.scheduler.start()
        self.controller_manager.wait_until(
            lambda: self._healthy(self.controller_manager_port), timeout
        )
        self.scheduler.wait_until(lambda: self._healthy(self.scheduler_port), timeout)
        if "serviceaccount-controller" in self.enabled:
            # /healthz answers before the controllers have synced; the default
            # namespace's ServiceAccount appearing says they act.
            self.controller_manager.wait_until(self._default_service_account, timeout)

    def stop(self) -> None:
        self.scheduler.stop()
        self.controller_manager.stop()

    @property
    def children(self) -> tuple[Child, Child]:
        return self.controller_manager, self.scheduler

    def _healthy(self, port: int) -> bool:
        status, _ = https_get(port, "/healthz", self.plane.ssl_context())
        return status == 200

    def _default_service_account(self) -> bool:
        status, _ = self.plane.get("/api/v1/namespaces/default/serviceaccounts/default")
        return status == 200

    def _common_argv(self, name: str, kubeconfig: Path, port: int) -> list[str]:
        pki = self.plane.pki
        return [
            str(binary(name, BUILD)),
            f"--kubeconfig={kubeconfig}",
            # Delegated authn/authz of their own endpoints, through the API server.
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--client-ca-file={pki / 'ca.crt'}",
            # That CA is all: looking up the rest would ask for a front-proxy CA
            # this API server does not have, and log an error every second.
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={pki / f'{name}.crt'}",
            f"--tls-private-key-file={pki / f'{name}.key'}",
            "--leader-elect=false",
        ]

    def _controller_manager_argv(self) -> list[str]:
        pki = self.plane.pki
        name = "kube-controller-manager"
        return [
            *self._common_argv(name, self._kcm_kubeconfig, self.controller_manager_port),
            f"--controllers={','.join(self.enabled)}",
            "--use-service-account-credentials=true",
            # Signs the tokens the API server verifies with its --service-account-key-file.
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
        ]

    def _scheduler_argv(self) -> list[str]:
        name = "kube-scheduler"
        return self._common_argv(name, self._scheduler_kubeconfig, self.scheduler_port)
