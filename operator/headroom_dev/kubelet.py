"""A real node beside a :class:`~headroom_dev.controlplane.ControlPlane`: containerd + kubelet.

The operator has to be tested the way users run it: as a pod from the chart's
image, scheduled onto a node whose kubelet runs it, next to workload pods. There
is no Docker engine here, so no kind; ``hack/node/node.sh`` starts Debian's
containerd and runc, the CNI bridge plugin and a kubelet built from its Go module
(``hack/node/build.sh``), and this class drives it from Python: the node's
identity and RBAC, ``node.sh up``, the Node turning Ready, importing images, and
``node.sh down`` (which also cleans up after a crashed run). Why each odd setting
is there: docs/development/real-node.md.

The plane must run the controllers a node needs
(:data:`~headroom_dev.controllers.NODE_CONTROLLERS`): the node-lifecycle controller
lifts the not-ready taint every new Node gets, the job controller runs Jobs.
One node per machine (the bridge, the CRI's netns names and containerd 1.6's
``/run/containerd`` are machine-wide), and it needs root.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from headroom_dev.interrupts import hold_lock
from headroom_dev.process import ControlPlaneError, binary, https_get

if TYPE_CHECKING:
    from headroom_dev.controlplane import ControlPlane

REPO = Path(__file__).resolve().parents[2]
NODE_SH = REPO / "hack" / "node" / "node.sh"
BUILD = "make node"
CONTAINERD_SOCKET = "/run/headroom-node/containerd.sock"
NODE_ROOT = Path(os.environ.get("HEADROOM_NODE_ROOT", "/var/lib/headroom-node"))
NODE_LOG_DIR = "/var/lib/headroom-node/log"
KUBELET_PORT = 10250
KUBELET_SERVING_CERT = Path("/var/lib/headroom-node/kubelet/pki/kubelet.crt")

NODE_RBAC = {
    # The built-in role for kubelets, bound to their group. No Node authorizer or
    # NodeRestriction here: the harness's API server authorizes with RBAC alone.
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "headroom-dev:nodes"},
    "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:node",
    },
    "subjects": [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}
    ],
}


class NodeError(ControlPlaneError):
    """The node could not be started or stopped; the message says why."""


def run_tool(
    argv: list[str],
    *,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float,
    own_session: bool = False,
) -> str:
    """Run a command-line tool (node.sh, kubectl, helm, ctr, an image build); its
    stdout, or a :class:`NodeError` with the end of its stderr.

    ``own_session``: out of reach of a signal sent to the caller's process group, for
    a clean-up (``node.sh down``) that a second Ctrl-C must not cut short. If the
    caller is stopped (a signal raised here), the tool is asked to stop with SIGTERM
    and given :data:`TOOL_GRACE` seconds to clean up after itself (the image build
    unmounts its chroot) before it is killed."""
    what = " ".join(argv[:3])
    with subprocess.Popen(
        argv,
        stdin=None if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        start_new_session=own_session,
    ) as process:
        try:
            out, err = process.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired as error:
            process.kill()
            process.communicate()
            raise NodeError(f"{what} ...: no answer after {timeout:.0f}s") from error
        except BaseException:  # a stop (Stopped, KeyboardInterrupt): the tool stops too
            _end(process)
            raise
    if process.returncode != 0:
        raise NodeError(f"{what} ... exited {process.returncode}:\n{err[-3000:]}")
    return out


#: Seconds a tool has to finish its own clean-up once its caller stops.
TOOL_GRACE = 20.0


def _end(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.terminate()  # it may have had the signal already (its group's), no harm
    try:
        process.communicate(timeout=TOOL_GRACE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()


@contextlib.contextmanager
def hold_node() -> Iterator[None]:
    """The machine's one node for the block: a second driver (``make cluster`` in any
    checkout) refuses at once with :class:`~headroom_dev.interrupts.LockHeldError`
    instead of starting over, or tearing down, this one's node."""
    with hold_lock(NODE_ROOT):
        yield


class KubeletNode:
    """containerd + the kubelet on this machine, registered with ``plane`` as a Node.

    Named after the machine's hostname: the API server reaches a kubelet (logs,
    exec) by the Node's Hostname address, which resolves to 127.0.0.1 here, where
    the kubelet listens. Use as a context manager, or :meth:`start` and :meth:`stop`.
    """

    def __init__(self, plane: ControlPlane, name: str | None = None) -> None:
        self.plane = plane
        self.name = name or socket.gethostname()
        self.ready_seconds: float | None = None
        self.started = False

    # -- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> KubeletNode:
        if os.geteuid() != 0:
            raise NodeError("a real node needs root (containerd, runc, the CNI bridge, iptables)")
        kubelet = binary("kubelet", BUILD)
        kubeconfig = self.plane.write_kubeconfig(
            self.plane.workdir / "kubelet.kubeconfig", f"system:node:{self.name}", ("system:nodes",)
        )
        self.kubectl("apply", "-f", "-", stdin=json.dumps(NODE_RBAC))
        env = {
            **os.environ,
            "HEADROOM_NODE_KUBELET": str(kubelet),
            # The API server presents kubelet-client.crt from this CA (logs, exec).
            "HEADROOM_NODE_CLIENT_CA": str(self.plane.pki / "ca.crt"),
            # Pods reach the API server at the `kubernetes` Service's ClusterIP.
            "HEADROOM_NODE_APISERVER_PORT": str(self.plane.apiserver_port),
        }
        began = time.monotonic()
        self.started = True  # from here on, stop() has something to clean
        try:
            self._node_sh("up", str(kubeconfig), self.name, env=env, timeout=timeout)
            self._wait(self.ready, began + timeout, "Ready")
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop the kubelet and containerd and clean everything up. Safe to call twice."""
        if self.started:
            # In its own session: the second signal of a Ctrl-C pressed twice (or a
            # script's SIGINT then SIGTERM) reaches the whole group, and must not kill
            # the clean-up half-way.
            self._node_sh("down", timeout=180, own_session=True)
            self.started = False

    def __enter__(self) -> KubeletNode:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- what tests do with it -------------------------------------------------------

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive into the node's containerd (there is no registry)."""
        run_tool(
            [
                "ctr",
                "--address",
                CONTAINERD_SOCKET,
                "-n",
                "k8s.io",
                "images",
                "import",
                str(archive),
            ],
            timeout=300,
        )

    def stats_summary(self) -> dict[str, Any]:
        """The kubelet's /stats/summary (pods' memory and CPU), asked as the API server
        asks it, with its kubelet client certificate. (Through the API server's node
        proxy it is refused: the Node's address is loopback, which the proxy does not
        allow.)"""
        context = ssl.create_default_context(cafile=str(KUBELET_SERVING_CERT))
        context.check_hostname = False  # self-signed for the hostname; pinned by cafile
        pki = self.plane.pki
        context.load_cert_chain(str(pki / "kubelet-client.crt"), str(pki / "kubelet-client.key"))
        status, body = https_get(KUBELET_PORT, "/stats/summary", context)
        if status != 200:
            raise NodeError(f"kubelet /stats/summary: HTTP {status}: {body[:300]!r}")
        summary: dict[str, Any] = json.loads(body)
        return summary

    def ready(self) -> bool:
        status, body = self.plane.get(f"/api/v1/nodes/{self.name}")
        if status != 200:
            return False
        node = json.loads(body)
        conditions = node.get("status", {}).get("conditions", [])
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        # The not-ready taint goes when the node-lifecycle controller sees Ready;
        # before that the scheduler places nothing here.
        tainted = any(
            t.get("key") == "node.kubernetes.io/not-ready" for t in node["spec"].get("taints", [])
        )
        return ready and not tainted

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        return run_tool(
            [str(binary("kubectl")), f"--kubeconfig={self.plane.kubeconfig}", *args],
            stdin=stdin,
            timeout=timeout,
        )

    # -- internals -------------------------------------------------------------------

    def _node_sh(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float,
        own_session: bool = False,
    ) -> str:
        return run_tool(
            ["bash", str(NODE_SH), *args], env=env, timeout=timeout, own_session=own_session
        )

    def _wait(self, check: Callable[[], bool], deadline: float, what: str) -> None:
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise NodeError(
            f"Node {self.name} not {what} in time; the kubelet's log: {NODE_LOG_DIR}/kubelet.log"
        )
