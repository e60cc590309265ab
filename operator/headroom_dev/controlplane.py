"""Start and stop a real kube-apiserver + etcd on loopback, and on request the controllers.

This follows controller-runtime's envtest (``pkg/internal/testing/controlplane``):
the same two binaries a cluster runs, with a generated CA, client-certificate
authentication and RBAC authorization, so that schema validation, the status
subresource, CEL rules, RBAC and watches behave exactly as in production.
By default there is no controller-manager, so the ServiceAccount admission plugin
is off and no garbage collector runs. ``ControlPlane(controllers=True)`` also
starts kube-controller-manager and kube-scheduler (:mod:`headroom_dev.controllers`)
and turns that admission plugin on, as a cluster has it.

Children get ``PR_SET_PDEATHSIG`` so that a killed test run cannot leave an
apiserver, etcd or controller behind, and :meth:`ControlPlane.stop` removes every
temp dir.
"""

from __future__ import annotations

import http.client
import shutil
import ssl
import tempfile
from pathlib import Path
from types import TracebackType

import yaml

from headroom.kube.client import Credentials
from headroom_dev.certs import CertificateAuthority, KeyPair, service_account_key_pem
from headroom_dev.controllers import DEFAULT_CONTROLLERS, Controllers
from headroom_dev.process import (
    DEFAULT_BIN_DIR,
    Child,
    ControlPlaneError,
    bin_dir,
    binary,
    free_port,
    https_get,
)

__all__ = [
    "DEFAULT_BIN_DIR",
    "ControlPlane",
    "ControlPlaneError",
    "bin_dir",
    "binary",
    "free_port",
]


SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
"""The `kubernetes` Service's ClusterIP: the first address of the service range."""
IN_CLUSTER_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc")


class ControlPlane:
    """etcd + kube-apiserver on free loopback ports, with an admin kubeconfig;
    with ``controllers=True`` also kube-controller-manager (running
    :data:`~headroom_dev.controllers.DEFAULT_CONTROLLERS`, or the controllers
    named instead of ``True``) and kube-scheduler. ``apiserver_args`` go after
    kube-apiserver's own flags (e.g. smaller ``--max-requests-inflight`` limits).

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        fsync: bool = False,
        controllers: bool | tuple[str, ...] = False,
        apiserver_args: tuple[str, ...] = (),
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="headroom-cp-")) if workdir is None else workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = self.workdir / "pki"
        self.pki.mkdir(exist_ok=True)
        self.etcd_data = self.workdir / "etcd"
        self.ca = CertificateAuthority()
        self.apiserver_port = free_port()
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.url = f"https://127.0.0.1:{self.apiserver_port}"
        self._fsync = fsync
        self._apiserver_args = apiserver_args
        self._write_pki()
        self.kubeconfig = self.write_kubeconfig(
            self.workdir / "admin.kubeconfig", "admin", ("system:masters",)
        )
        names = DEFAULT_CONTROLLERS if controllers is True else controllers or ()
        self.controllers = Controllers(self, names) if names else None
        self.etcd = Child("etcd", self._etcd_argv(), self.workdir / "etcd.log")
        self.apiserver = Child(
            "kube-apiserver", self._apiserver_argv(), self.workdir / "kube-apiserver.log"
        )

    # -- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> ControlPlane:
        try:
            self.start_etcd(timeout)
            self.start_apiserver(timeout)
            if self.controllers is not None:
                self.controllers.start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process and remove the work directory. Safe to call twice."""
        if self.controllers is not None:
            self.controllers.stop()
        self.apiserver.stop()
        self.etcd.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start_etcd(self, timeout: float = 60.0) -> None:
        self.etcd.start()
        self.etcd.wait_until(self._etcd_ready, timeout)

    def stop_etcd(self) -> None:
        self.etcd.stop()

    def start_apiserver(self, timeout: float = 60.0) -> None:
        self.apiserver.start()
        self.apiserver.wait_until(self._apiserver_ready, timeout)

    def stop_apiserver(self) -> None:
        self.apiserver.stop()

    # -- identities ------------------------------------------------------------------

    def admin_credentials(self) -> Credentials:
        """How the operator's own client reaches this control plane as its admin."""
        return Credentials(
            server=self.url,
            ca_file=str(self.pki / "ca.crt"),
            cert_file=str(self.pki / "admin.crt"),
            key_file=str(self.pki / "admin.key"),
        )

    def client_identity(self, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        return self.ca.client(user, groups)

    def write_kubeconfig(
        self, path: Path, user: str, groups: tuple[str, ...] = (), namespace: str = "default"
    ) -> Path:
        """Write a kubeconfig that authenticates as ``user`` in ``groups`` by client cert."""
        pair = self.ca.client(user, groups)
        directory = path.parent / f".{path.name}.d"
        directory.mkdir(exist_ok=True)
        cert, key = pair.write(directory, "client")
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "headroom-dev",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority": str(self.pki / "ca.crt"),
                    },
                }
            ],
            "users": [
                {"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}
            ],
            "contexts": [
                {
                    "name": "headroom-dev",
                    "context": {"cluster": "headroom-dev", "user": user, "namespace": namespace},
                }
            ],
            "current-context": "headroom-dev",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    # -- internals -------------------------------------------------------------------

    def _write_pki(self) -> None:
        (self.pki / "ca.crt").write_bytes(self.ca.cert_pem)
        # Pods on a real node (headroom_dev.node) reach the API server the in-cluster
        # way, at the `kubernetes` Service's ClusterIP and names; harmless without one.
        self.ca.serving("kube-apiserver", (SERVICE_IP,), IN_CLUSTER_NAMES).write(
            self.pki, "apiserver"
        )
        # The API server's identity towards kubelets (logs, exec, port-forward).
        self.ca.client("kube-apiserver-kubelet-client", ("system:masters",)).write(
            self.pki, "kubelet-client"
        )
        self.ca.client("admin", ("system:masters",)).write(self.pki, "admin")
        private, public = service_account_key_pem()
        (self.pki / "sa.key").write_bytes(private)
        (self.pki / "sa.key").chmod(0o600)
        (self.pki / "sa.pub").write_bytes(public)

    def _etcd_argv(self) -> list[str]:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        argv = [
            str(binary("etcd")),
            "--name=default",
            f"--data-dir={self.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--log-level=warn",
            "--quota-backend-bytes=8589934592",
        ]
        if not self._fsync:
            argv.append("--unsafe-no-fsync")
        return argv

    def _apiserver_argv(self) -> list[str]:
        pki = self.pki
        argv = [
            str(binary("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--cert-dir={pki}",
            f"--secure-port={self.apiserver_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://localhost",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            # There is no kube-proxy: the API server reaches a Service (the admission
            # webhook's) at one of its ready endpoints, read from EndpointSlices. In
            # v1.36 the same resolver is given to the webhook plugins
            # (cmd/kube-apiserver/app/server.go buildServiceResolver ->
            # controlplane/apiserver/config.go -> webhookinit.NewPluginInitializer).
            "--enable-aggregator-routing=true",
        ]
        if self.controllers is None:
            # It needs each namespace's default ServiceAccount, which only the
            # controller-manager creates.
            argv.append("--disable-admission-plugins=ServiceAccount")
        return argv + list(self._apiserver_args)

    def _etcd_ready(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.etcd_port, timeout=2)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        finally:
            conn.close()

    def ssl_context(self) -> ssl.SSLContext:
        """An SSL context that trusts the CA and presents the admin certificate."""
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return context

    def get(self, path: str) -> tuple[int, bytes]:
        """A raw admin GET against the API server (readiness, version)."""
        return https_get(self.apiserver_port, path, self.ssl_context())

    def _apiserver_ready(self) -> bool:
        status, _ = self.get("/readyz")
        return status == 200
