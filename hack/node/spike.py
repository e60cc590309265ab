"""Feasibility spike for issue #12 item 2: one real node against the dev control plane.

Starts etcd + kube-apiserver with the project's harness, brings up containerd +
the kubelet with hack/node/node.sh, waits for the Node to be Ready, runs a
busybox pod on it (nodeName set: there is no scheduler), reads its logs, deletes
it, and tears everything down, printing what it measured. Needs root.

    cd <repo> && PYTHONPATH=operator .venv/bin/python hack/node/spike.py [--keep]

--keep leaves the pod running and prints the KUBECONFIG line, then waits for
Ctrl-C (the control plane dies with this process) and tears down.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from headroom_dev.controlplane import ControlPlane, binary

HERE = Path(__file__).resolve().parent
NODE = socket.gethostname()  # resolves to 127.0.0.1 here; see node.sh


SERVICE_IP = "10.0.0.1"  # first address of the harness's --service-cluster-ip-range


class NodeControlPlane(ControlPlane):
    """The harness's control plane plus what a node needs: the API server reaches
    the kubelet with a client certificate, and pods reach the API server at the
    `kubernetes` Service's ClusterIP (its serving certificate names it)."""

    def _write_pki(self) -> None:
        super()._write_pki()
        names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "localhost"]
        # The harness has no SAN parameter yet; the spike signs its own serving cert.
        self.ca._sign(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
            ExtendedKeyUsageOID.SERVER_AUTH,
            [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", SERVICE_IP)]
            + [x509.DNSName(n) for n in names],
        ).write(self.pki, "apiserver")

    def _apiserver_argv(self) -> list[str]:
        self.ca.client("kube-apiserver-kubelet-client", ("system:masters",)).write(
            self.pki, "kubelet-client"
        )
        # The harness disables ServiceAccount admission (no pod of its own runs);
        # a pod on a real node gets its token the normal way, through TokenRequest.
        no_sa = "--disable-admission-plugins=ServiceAccount"
        argv = [a for a in super()._apiserver_argv() if a != no_sa]
        return [
            *argv,
            f"--kubelet-client-certificate={self.pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={self.pki / 'kubelet-client.key'}",
        ]


def kubectl(cp: ControlPlane, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run(
        [str(binary("kubectl")), f"--kubeconfig={cp.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def wait(what: str, check: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(0.2)
    raise TimeoutError(f"{what} not true after {timeout:.0f}s")


def node_ready(cp: ControlPlane) -> bool:
    try:
        node = json.loads(kubectl(cp, "get", "node", NODE, "-o", "json"))
    except RuntimeError:
        return False
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", [])
    )


def pod_phase(cp: ControlPlane, name: str) -> str:
    return kubectl(cp, "get", "pod", name, "-o", "jsonpath={.status.phase}")


def pod_ready(cp: ControlPlane, name: str) -> bool:
    path = '{.status.conditions[?(@.type=="Ready")].status}'
    return kubectl(cp, "get", "pod", name, "-o", f"jsonpath={path}") == "True"


POD = """
apiVersion: v1
kind: Pod
metadata: {name: hello}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: hello
    image: localhost/headroom/busybox:1
    imagePullPolicy: Never
    command:
    - sh
    - -c
    - |
      echo hello from $(hostname) $(ip -4 -o addr show eth0 | awk '{print $4}')
      head -1 /proc/self/cgroup
      echo ready > /tmp/index.html
      exec httpd -f -p 8080 -h /tmp
    readinessProbe:
      httpGet: {path: /index.html, port: 8080}
      periodSeconds: 1
    livenessProbe:
      exec: {command: [test, -f, /tmp/index.html]}
      periodSeconds: 2
    resources:
      requests: {memory: 16Mi, cpu: 10m}
      limits: {memory: 32Mi}
"""

CLIENT = """
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  nodeName: %s
  restartPolicy: Never
  containers:
  - name: client
    image: localhost/headroom/kubectl:1
    imagePullPolicy: Never
    command:
    - sh
    - -c
    - |
      ls /var/run/secrets/kubernetes.io/serviceaccount
      kubectl auth whoami -o jsonpath='{.status.userInfo.username}{"\\n"}'
      kubectl get --raw /readyz; echo
"""

# What kube-controller-manager would have made (item 1): the namespace's default
# ServiceAccount and the root CA ConfigMap that every projected token volume mounts.
SA = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: default}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: kube-root-ca.crt, namespace: default}
data:
  ca.crt: |
%s
"""

RBAC = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: headroom-dev:nodes}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:node}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: system:nodes}
"""


def in_cluster_check(cp: ControlPlane) -> dict[str, str]:
    """What an in-cluster client in the pod would do: read KUBERNETES_SERVICE_HOST/PORT
    from its environment and call the API server there over TLS. busybox has no TLS
    client, so curl runs on the host inside the pod's network namespace."""
    env = dict(
        line.split("=", 1)
        for line in kubectl(cp, "exec", "hello", "--", "env").splitlines()
        if line.startswith("KUBERNETES_SERVICE_")
    )
    (netns,) = [p.name for p in Path("/run/netns").glob("cni-*")]  # the only pod
    url = f"https://{env['KUBERNETES_SERVICE_HOST']}:{env['KUBERNETES_SERVICE_PORT']}/readyz"
    pki = cp.pki
    out = subprocess.run(
        ["ip", "netns", "exec", netns, "curl", "-sS", "--max-time", "5",
         "--cacert", str(pki / "ca.crt"), "--cert", str(pki / "admin.crt"),
         "--key", str(pki / "admin.key"), url],
        capture_output=True, text=True,
    )  # fmt: skip
    return {"url": url, "answer": (out.stdout + out.stderr).strip()}


def in_cluster_client(cp: ControlPlane) -> dict[str, object]:
    """A pod that is an in-cluster client: the project's kubectl with its mounted
    ServiceAccount token, reaching the API server at the Service's ClusterIP."""
    images = subprocess.run(
        ["bash", str(HERE / "images.sh"), "kubectl"], check=True, capture_output=True, text=True
    ).stdout.split()
    subprocess.run(
        ["ctr", "--address", "/run/headroom-node/containerd.sock", "-n", "k8s.io",
         "images", "import", *images],
        check=True, capture_output=True,
    )  # fmt: skip
    t = time.monotonic()
    kubectl(cp, "apply", "-f", "-", stdin=CLIENT % NODE)
    took = wait("client pod done", lambda: pod_phase(cp, "client") in ("Succeeded", "Failed"), 60)
    return {
        "phase": pod_phase(cp, "client"),
        "create -> done s": round(took, 2),
        "logs": kubectl(cp, "logs", "client").strip().splitlines(),
        "wall s": round(time.monotonic() - t, 2),
    }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    keep = "--keep" in sys.argv
    # SIGTERM tears down like Ctrl-C (the node's processes run in their own session
    # and outlive this one otherwise; `hack/node/node.sh down` cleans up after a kill -9).
    signal.signal(signal.SIGTERM, _interrupt)
    figures: dict[str, object] = {}
    cp = NodeControlPlane()
    t = time.monotonic()
    cp.start()
    figures["control plane start s"] = round(time.monotonic() - t, 2)
    try:
        kubelet_kc = cp.write_kubeconfig(
            cp.workdir / "kubelet.kubeconfig", f"system:node:{NODE}", ("system:nodes",)
        )
        kubectl(cp, "apply", "-f", "-", stdin=RBAC)
        ca = (cp.pki / "ca.crt").read_text()
        kubectl(cp, "apply", "-f", "-", stdin=SA % "\n".join("    " + x for x in ca.splitlines()))
        env = {
            **os.environ,
            "HEADROOM_NODE_CLIENT_CA": str(cp.pki / "ca.crt"),
            "HEADROOM_NODE_APISERVER_PORT": str(cp.apiserver_port),
            "HEADROOM_NODE_SERVICE_IP": SERVICE_IP,
        }
        t = time.monotonic()
        subprocess.run(
            ["bash", str(HERE / "node.sh"), "up", str(kubelet_kc), NODE], check=True, env=env
        )
        figures["node.sh up s (containerd + images + kubelet healthz)"] = round(
            time.monotonic() - t, 2
        )
        figures["Node Ready s (from node.sh up)"] = round(
            time.monotonic() - t + wait("Node Ready", lambda: node_ready(cp), 120), 2
        )
        node = json.loads(kubectl(cp, "get", "node", NODE, "-o", "json"))
        figures["node capacity"] = node["status"]["capacity"]
        figures["node allocatable"] = node["status"]["allocatable"]
        figures["node info"] = {
            k: node["status"]["nodeInfo"][k]
            for k in ("kubeletVersion", "containerRuntimeVersion", "kernelVersion", "osImage")
        }
        figures["node addresses"] = node["status"]["addresses"]
        figures["node taints"] = node["spec"].get("taints")
        figures["MemTotal (/proc/meminfo)"] = Path("/proc/meminfo").read_text().splitlines()[0]

        t = time.monotonic()
        kubectl(cp, "apply", "-f", "-", stdin=POD % NODE)
        figures["pod Running s (create -> Running)"] = round(
            wait("pod Running", lambda: pod_phase(cp, "hello") == "Running", 120), 2
        )
        figures["pod Ready s (create -> readiness probe passed)"] = round(
            time.monotonic() - t + wait("pod Ready", lambda: pod_ready(cp, "hello"), 60), 2
        )
        wait("pod logs", lambda: "hello" in kubectl(cp, "logs", "hello"), 30)
        figures["pod logs"] = kubectl(cp, "logs", "hello").strip().splitlines()
        figures["pod ip"] = kubectl(cp, "get", "pod", "hello", "-o", "jsonpath={.status.podIP}")
        figures["in-cluster path"] = in_cluster_check(cp)
        figures["in-cluster kubectl pod"] = in_cluster_client(cp)
        if keep:
            print(json.dumps(figures, indent=2), flush=True)
            print(f"export KUBECONFIG={cp.kubeconfig}  # Ctrl-C tears down", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        t = time.monotonic()
        kubectl(cp, "delete", "pod", "hello", "client", "--wait=true", "--timeout=60s")
        figures["pod delete s (kubectl delete --wait)"] = round(time.monotonic() - t, 2)
    finally:
        t = time.monotonic()
        subprocess.run(["bash", str(HERE / "node.sh"), "down"], check=False)
        figures["node.sh down s"] = round(time.monotonic() - t, 2)
        cp.stop()
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
