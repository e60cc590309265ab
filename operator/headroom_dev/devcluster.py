"""``make dev``: a local control plane with demo nodes, for people to watch.

Starts kube-apiserver + etcd, installs the CRDs, creates a few nodes of
different sizes and prints the lines to paste into a shell to use ``kubectl``
against it. Stays up until Ctrl-C; ``--once`` checks the set-up and exits 0,
which is how the test suite proves the newcomer path works.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import threading
from pathlib import Path

from kubernetes import client

from headroom_dev.apply import api_client, install_crds
from headroom_dev.controlplane import ControlPlane, bin_dir
from headroom_dev.nodes import create_node

ROOT = Path(__file__).resolve().parents[2]
DEV_DIR = ROOT / ".dev"

#: name, memory, labels: a CPU box, a mid-size GPU node, a big GPU node.
DEMO_NODES: list[tuple[str, str, dict[str, str]]] = [
    ("cpu-small", "16Gi", {}),
    ("gpu-medium", "64Gi", {"nvidia.com/gpu.memory": "24576", "nvidia.com/gpu.count": "2"}),
    ("gpu-large", "256Gi", {"nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "8"}),
]


def _say(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--once", action="store_true", help="set up, check, and exit")
    args = parser.parse_args(argv)

    workdir = DEV_DIR / "cluster"
    shutil.rmtree(workdir, ignore_errors=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    with ControlPlane(workdir) as plane:
        kubeconfig = DEV_DIR / "kubeconfig"
        shutil.copy(plane.kubeconfig, kubeconfig)
        api = api_client(kubeconfig)
        crds = install_crds(api, sorted((ROOT / "crds").glob("*.yaml")))
        core = client.CoreV1Api(api)
        for name, memory, labels in DEMO_NODES:
            create_node(core, name, memory=memory, labels=labels)
        nodes = [n.metadata.name for n in core.list_node().items if n.metadata and n.metadata.name]
        _say(f"control plane up at {plane.url} (logs in {workdir})")
        _say(f"CRDs installed: {', '.join(crds)}")
        _say(f"demo nodes: {', '.join(nodes)}")
        _say("\nIn another shell:\n")
        _say(f"  export KUBECONFIG={kubeconfig}")
        _say(f"  export PATH={bin_dir()}:$PATH")
        _say("  kubectl get nodes,rsv,nodeheadrooms -A")
        if args.once:
            missing = {n for n, _, _ in DEMO_NODES} - set(nodes)
            if missing:
                _say(f"demo nodes missing: {sorted(missing)}")
                return 1
            _say("\n--once: set-up verified, shutting down")
            return 0
        _say("\nCtrl-C to stop.")
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
        _say("stopping control plane")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
