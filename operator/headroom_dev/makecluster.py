"""``make cluster``: the chart on a real node on this machine, a demo, until Ctrl-C.

:class:`~headroom_dev.cluster.NodeCluster` brings up the control plane, the node and
the images; this installs the chart, applies the demo, prints the lines to paste
into another shell and stays up until stopped. ``--once`` runs the demo to its end,
checks every outcome and exits 0 (how the test suite proves the path works).

A SIGINT or SIGTERM at any phase, from a terminal or a script, and however many
follow it, tears down whatever had started (the node's kubelet and containerd, the
controllers, kube-apiserver and etcd), removes ``.cluster`` and says so in one line;
the exit code is 130 or 143. The handlers (:mod:`headroom_dev.interrupts`) only
record a signal: the handler this replaced set a ``threading.Event``, whose lock a
second signal re-entered, and the run hung for ever. The node is one per machine,
so a second ``make cluster``, from any checkout, refuses at once.

Only the standard library and :mod:`headroom_dev.interrupts` are imported at the
top: ``python -m headroom_dev.makecluster`` handles signals before the rest loads.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from headroom_dev.interrupts import StopOnSignals, run_holding, run_program

if TYPE_CHECKING:
    from headroom_dev.cluster import NodeCluster

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = ROOT / ".cluster"
LABEL = "make cluster"
#: What a stop leaves: nothing of the run's (said once, on the line a stop prints).
CLEANED = (
    "the kubelet, containerd, the controllers, kube-apiserver and etcd are stopped "
    f"and {CLUSTER_DIR.name} removed"
)


def _say(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None, signals: StopOnSignals | None = None) -> int:
    """``signals``: handlers already installed and armed (:func:`run_program`)."""
    if signals is None:
        signals = StopOnSignals()
        signals.arm()
    from headroom_dev.kubelet import hold_node  # after the handlers, on purpose

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--once", action="store_true", help="run the demo to its end and exit")
    args = parser.parse_args(argv)
    return run_holding(
        LABEL,
        hold_node(),
        lambda: _run(args.once, signals),
        signals,
        cleaned=CLEANED,
        when_held="stop that one first (Ctrl-C in its terminal), it tears its node down "
        "as it stops",
    )


def _run(once: bool, signals: StopOnSignals) -> int:
    from headroom_dev import cluster as node_cluster  # after the handlers, on purpose
    from headroom_dev.process import bin_dir

    stale = "6s" if once else "30s"
    with contextlib.ExitStack() as stack:
        # Unwound in reverse: the shield first, so that no later signal cuts the
        # clean-up short; then the node and the control plane; the directory last.
        # The node's stop is registered before it starts: a stop while it starts
        # tears down whatever part of it had started.
        stack.callback(shutil.rmtree, CLUSTER_DIR, ignore_errors=True)
        shutil.rmtree(CLUSTER_DIR, ignore_errors=True)  # a crashed run's (we hold the node)
        cluster = node_cluster.NodeCluster(CLUSTER_DIR / "plane")
        stack.callback(cluster.stop)
        stack.callback(signals.shield)
        cluster.start(_say)
        kubeconfig = CLUSTER_DIR / "kubeconfig"
        shutil.copy(cluster.plane.kubeconfig, kubeconfig)
        _say(f"control plane up at {cluster.plane.url}; node {cluster.node.name} Ready")
        _say(f"installing the chart: helm install {node_cluster.RELEASE}")
        took = cluster.install(node_cluster.demo_values(stale))
        _say(
            f"helm install {node_cluster.RELEASE} -n {node_cluster.RELEASE_NAMESPACE}: "
            f"operator Ready in {took:.1f}s"
        )
        _say("\nIn another shell:\n")
        _say(f"  export KUBECONFIG={kubeconfig}")
        _say(f"  export PATH={bin_dir()}:$PATH")
        _say(
            "  kubectl get pods,rsv -A -w   # the operator's log: kubectl logs -n "
            f"{node_cluster.RELEASE_NAMESPACE} deploy/{node_cluster.RELEASE} -f\n"
        )
        cluster.apply(node_cluster.demo(cluster, work_seconds=20 if once else 300))
        _say(
            f"demo applied in namespace {node_cluster.DEMO_NAMESPACE}: Job 'train' holds "
            f"2 GiB while it runs; 'forgotten' goes stale after {stale}; 'too-big' is rejected"
        )
        if once:
            return _check(cluster, deadline=time.monotonic() + 120)
        _say("\nCtrl-C to stop.")
        while True:  # until a signal raises Stopped
            time.sleep(3600)


def _check(cluster: NodeCluster, deadline: float) -> int:
    """The Job's claim is Admitted while it runs and gone after; the others as EXPECTED."""
    from headroom_dev.cluster import DEMO_NAMESPACE, EXPECTED, outcomes

    held = False
    seen: dict[str, tuple[str, str]] = {}
    while time.monotonic() < deadline:
        seen = outcomes(cluster)
        held = held or any(
            phase == "Admitted" for name, (phase, _) in seen.items() if name not in EXPECTED
        )
        job = cluster.get("job", "train", "-n", DEMO_NAMESPACE)
        done = (job.get("status") or {}).get("succeeded") == 1
        if held and done and seen == EXPECTED:
            for name, (phase, reason) in sorted(seen.items()):
                _say(f"  {name:<10} {phase:<10} {reason}")
            _say("  Job train: Succeeded; its claim was Admitted while it ran and released after")
            _say("--once: every demo outcome reached")
            return 0
        time.sleep(1)
    _say(f"--once: demo did not reach its outcomes: held={held} reservations={seen}")
    _say(cluster.diagnose(DEMO_NAMESPACE, "batch.kubernetes.io/job-name=train"))
    return 1


if __name__ == "__main__":
    # Run as the imported module, not as __main__: a light import (see above).
    sys.exit(run_program(LABEL, "headroom_dev.makecluster"))
