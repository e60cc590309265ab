"""The operator the way users run it, on a real node on this machine (``make cluster``).

The control plane with its controllers and scheduler, a real node (containerd +
kubelet, :mod:`headroom_dev.kubelet`), the operator's image built without a
Docker engine (``hack/image/build.sh``) and imported into the node, and the chart
installed with ``helm install``: the operator runs as a pod with its ServiceAccount
and in-cluster config. The demo is a Job that holds memory through ``headroom
hold`` and heartbeats from inside its container, a reservation too big for the
node, and one whose owner never heartbeats. ``make cluster`` itself, which prints
the lines to paste into another shell and stays up until Ctrl-C, is
:mod:`headroom_dev.makecluster`.

The tests on a node (tests/e2e/test_on_node.py) use :class:`NodeCluster` too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from headroom.api.constants import OWNER_LABEL
from headroom_dev.controllers import NODE_CONTROLLERS
from headroom_dev.controlplane import ControlPlane, binary
from headroom_dev.kubelet import KubeletNode, NodeError, run_tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "headroom"
RELEASE, RELEASE_NAMESPACE = "headroom", "headroom-system"
NODE_IMAGES = ("pause", "busybox", "kubectl")


def operator_image() -> str:
    """The chart's default image reference: what ``hack/image/build.sh`` names its image."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"


def build_images() -> list[Path]:
    """Build (or reuse from the cache) every image the node runs; their OCI archives."""
    archives = []
    for argv in (
        ["bash", str(ROOT / "hack/node/images.sh"), *NODE_IMAGES],
        ["bash", str(ROOT / "hack/image/build.sh")],
    ):
        archives += [Path(line) for line in run_tool(argv, timeout=1800).split()]
    return archives


class NodeCluster:
    """Control plane + controllers + one real node with every image imported."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.plane = ControlPlane(workdir, controllers=NODE_CONTROLLERS)
        self.node = KubeletNode(self.plane)
        self.image = operator_image()
        self.figures: dict[str, float] = {}

    def start(self, say: Callable[[str], object] = lambda _: None) -> NodeCluster:
        """``say`` is told each phase before it begins (``make cluster`` prints them)."""
        say("building the images (or reusing them from the cache)")
        archives = build_images()  # before anything runs: a failed build leaves nothing
        try:
            began = time.monotonic()
            say("starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler")
            self.plane.start()
            self.figures["control plane up s"] = time.monotonic() - began
            say(f"starting the node {self.node.name} (containerd and the kubelet)")
            self.node.start()
            self.figures["node Ready s"] = self.node.ready_seconds or 0.0
            say(f"importing {len(archives)} images into the node")
            began = time.monotonic()
            for archive in archives:
                self.node.import_image(archive)
            self.figures["images imported s"] = time.monotonic() - began
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the node, then the control plane. Safe to call twice, and at any phase."""
        try:
            self.node.stop()
        finally:
            self.plane.stop()

    def __enter__(self) -> NodeCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- helm and kubectl ------------------------------------------------------------

    def helm(self, *args: str, timeout: float = 300) -> str:
        return run_tool(
            [str(binary("helm", "make helm")), f"--kubeconfig={self.plane.kubeconfig}", *args],
            timeout=timeout,
        )

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        return self.node.kubectl(*args, stdin=stdin, timeout=timeout)

    def install(self, values: dict[str, Any], *, upgrade: bool = False) -> float:
        """``helm install`` (or ``upgrade``) the chart with ``values``; seconds until
        the operator's Deployment is Ready (helm --wait)."""
        path = self.plane.workdir / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        began = time.monotonic()
        verb = ["upgrade", "--reuse-values"] if upgrade else ["install", "--create-namespace"]
        try:
            self.helm(
                *verb, RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "-f", str(path),
                "--wait", "--timeout", "180s",
            )  # fmt: skip
        except NodeError as error:
            raise NodeError(f"{error}\n{self.diagnose(RELEASE_NAMESPACE)}") from None
        return time.monotonic() - began

    def diagnose(self, namespace: str, selector: str = "app.kubernetes.io/name=headroom") -> str:
        """What a person would look at first: the pods, their events, the last logs."""
        out = []
        for argv in (
            ("get", "pods", "-A", "-o", "wide"),
            ("describe", "pods", "-n", namespace),
            ("logs", "-n", namespace, "-l", selector, "--tail=40"),
        ):
            try:
                out.append(f"$ kubectl {' '.join(argv)}\n{self.kubectl(*argv)}")
            except NodeError as error:
                out.append(f"$ kubectl {' '.join(argv)}\n{error}")
        return "\n".join(out)[-8000:]

    def apply(self, manifest: str | list[dict[str, Any]]) -> str:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump_all(manifest)
        return self.kubectl("apply", "-f", "-", stdin=text)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))


# -- the demo -------------------------------------------------------------------------

DEMO_NAMESPACE = "demo"
WORKER = "worker"


#: Values for the demo's release: a short stale window so that the demo moves, and the
#: demo's ServiceAccount may read NodeHeadrooms (the claim library heartbeats at a third
#: of a node's staleWindowSeconds when it can read it).
def demo_values(stale: str) -> dict[str, Any]:
    return {
        "config": {
            "limits": {"heartbeatStaleWindow": stale},
            "sweepPeriod": "2s",
            "reclaimedRetention": "10m",
        },
        "nodeHeadroomReaders": {"serviceAccounts": [{"namespace": DEMO_NAMESPACE, "name": WORKER}]},
    }


def worker_access(namespace: str) -> list[dict[str, Any]]:
    """A namespace whose ServiceAccount ``worker`` may claim memory (headroom-edit)."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": WORKER, "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "worker-claims", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "headroom-edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": WORKER, "namespace": namespace}],
        },
    ]


def claiming_pod_spec(image: str, node: str, script: str, ram_mb: int) -> dict[str, Any]:
    """A pod spec whose container holds ``ram_mb`` on ``node`` while ``script`` runs,
    through ``headroom hold`` (the claim is owned by the pod, heartbeated by hold)."""
    return {
        "serviceAccountName": WORKER,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "work",
                "image": image,
                "imagePullPolicy": "Never",
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                ],
                "command": [
                    "headroom",
                    "hold",
                    "--node",
                    node,
                    "--ram",
                    str(ram_mb),
                    "--owner-pod",
                    "$(POD_NAME)",
                    "--",
                    "sh",
                    "-c",
                    script,
                ],
                "resources": {
                    "requests": {"memory": "64Mi", "cpu": "10m"},
                    "limits": {"memory": "256Mi"},
                },
            }
        ],
    }


def demo(cluster: NodeCluster, work_seconds: int) -> list[dict[str, Any]]:
    node = cluster.node.name
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": DEMO_NAMESPACE},
        "spec": {
            "backoffLimit": 0,
            "template": {
                # An owner pod carries this label, or its claim is Rejected OwnerPodNotLabelled.
                "metadata": {"labels": {OWNER_LABEL: "true"}},
                "spec": claiming_pod_spec(
                    cluster.image,
                    node,
                    f'echo "holding $HEADROOM_RESERVATION"; sleep {work_seconds}',
                    2048,
                ),
            },
        },
    }

    def reservation(name: str, ram_mb: int, description: str) -> dict[str, Any]:
        return {
            "apiVersion": "headroom.dev/v1alpha1",
            "kind": "Reservation",
            "metadata": {"name": name, "namespace": DEMO_NAMESPACE},
            "spec": {"node": node, "ramMB": ram_mb, "description": description},
        }

    return [
        *worker_access(DEMO_NAMESPACE),
        job,
        reservation("too-big", 1 << 24, "16 TiB: more than this node has"),
        reservation("forgotten", 512, "its owner never heartbeats"),
    ]


#: name -> (phase, reason) the demo's standalone reservations reach.
EXPECTED = {
    "too-big": ("Rejected", "InsufficientRAM"),
    "forgotten": ("Reclaimed", "HeartbeatStale"),
}


def outcomes(cluster: NodeCluster) -> dict[str, tuple[str, str]]:
    items = cluster.get("reservations.headroom.dev", "-n", DEMO_NAMESPACE)["items"]
    return {
        i["metadata"]["name"]: (
            (i.get("status") or {}).get("phase", ""),
            (i.get("status") or {}).get("reason", ""),
        )
        for i in items
    }
