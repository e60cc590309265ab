"""``make dev``: a local control plane, the operator and a demo to watch.

Starts kube-apiserver + etcd, installs the CRDs, creates nodes of different
sizes, runs the operator and applies a demo: reservations that fit, one that is
rejected with its numbers, one whose owner never heartbeats (reclaimed as
HeartbeatStale), one that expires, one kept alive by heartbeats, and one over
the demo namespace's HeadroomQuota. It prints
the lines to paste into another shell to watch it with ``kubectl``, and stays up
until Ctrl-C. A SIGINT or SIGTERM at any moment, from a terminal or a script,
stops the operator, kube-apiserver and etcd, removes ``.dev/cluster`` and says so
in one line (exit 130 or 143); a second run while one holds ``.dev`` refuses
(:mod:`headroom_dev.interrupts`). ``--once`` runs the demo to its end, checks every outcome, and
exits 0, which is how the test suite proves the newcomer path works.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.apply import api_client, install_crds
from headroom_dev.controlplane import ControlPlane, bin_dir
from headroom_dev.interrupts import StopOnSignals, hold_lock, run_holding
from headroom_dev.nodes import create_node
from headroom_dev.operator import OperatorProcess

ROOT = Path(__file__).resolve().parents[2]
DEV_DIR = ROOT / ".dev"
NAMESPACE = "demo"

#: name, memory, labels: a CPU box, a mid-size GPU node, a big GPU node.
DEMO_NODES: list[tuple[str, str, dict[str, str]]] = [
    ("cpu-small", "16Gi", {}),
    ("gpu-medium", "64Gi", {"nvidia.com/gpu.memory": "24576", "nvidia.com/gpu.count": "2"}),
    ("gpu-large", "256Gi", {"nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "8"}),
]

#: name -> (phase, reason) the demo must reach.
EXPECTED = {
    "train-42": ("Admitted", "Fits"),
    "notebook": ("Admitted", "Fits"),
    "heartbeating": ("Admitted", "Fits"),
    "too-big": ("Rejected", "InsufficientRAM"),
    "forgotten": ("Reclaimed", "HeartbeatStale"),
    "short-lived": ("Reclaimed", "Expired"),
    "over-quota": ("Rejected", "QuotaExceeded"),
}
#: The demo namespace's HeadroomQuota: 48 GiB of RAM, of which the others hold 34.
QUOTA = {
    "apiVersion": "headroom.dev/v1alpha1",
    "kind": "HeadroomQuota",
    "metadata": {"name": "demo-team"},
    "spec": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
        "ramMB": 49152,
        "description": "the demo namespace may hold 48 GiB of RAM in all",
    },
}

#: Reservations whose owner is alive; "short-lived" too, so that it ends by expiry,
#: not by going stale first.
HEARTBEATING = ("train-42", "notebook", "heartbeating", "short-lived")


def _say(text: str) -> None:
    print(text, flush=True)


def _rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def apply_demo(custom: client.CustomObjectsApi, expiry: timedelta) -> None:
    expires = _rfc3339(datetime.now(UTC) + expiry)
    beat = {"headroom.dev/heartbeat": _rfc3339(datetime.now(UTC))}
    demo = [
        rsv.reservation("train-42", "gpu-medium", 8192, 16000, description="fine-tune run 42"),
        rsv.reservation("notebook", "cpu-small", 4096, owner={"surface": "notebook"}),
        rsv.reservation("too-big", "cpu-small", 32768, description="will not fit: 16 GiB node"),
        rsv.reservation("forgotten", "gpu-large", 16384, description="owner never heartbeats"),
        rsv.reservation("short-lived", "gpu-large", 4096, expiresAt=expires),
        rsv.reservation("heartbeating", "gpu-medium", 2048, description="kept alive by make dev"),
        rsv.reservation(
            "over-quota", "gpu-large", 16384, description="fits the node, not the quota (48 GiB)"
        ),
    ]
    for body in demo:
        if body["metadata"]["name"] in HEARTBEATING:
            body["metadata"]["annotations"] = beat
        custom.create_namespaced_custom_object(
            "headroom.dev", "v1alpha1", NAMESPACE, "reservations", body
        )


def heartbeat(custom: client.CustomObjectsApi) -> None:
    beat = {"metadata": {"annotations": {"headroom.dev/heartbeat": _rfc3339(datetime.now(UTC))}}}
    for name in HEARTBEATING:
        with contextlib.suppress(client.ApiException):
            custom.patch_namespaced_custom_object(
                "headroom.dev", "v1alpha1", NAMESPACE, "reservations", name, beat
            )


def outcomes(custom: client.CustomObjectsApi) -> dict[str, tuple[str, str]]:
    return {
        i["metadata"]["name"]: (
            (i.get("status") or {}).get("phase", ""),
            (i.get("status") or {}).get("reason", ""),
        )
        for i in rsv.list_all(custom, NAMESPACE)
    }


def main(argv: list[str] | None = None, signals: StopOnSignals | None = None) -> int:
    """``signals``: handlers already installed and armed (:mod:`headroom_dev.dev`)."""
    if signals is None:
        signals = StopOnSignals()
        signals.arm()  # from here on, a signal at any moment stops cleanly
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--once", action="store_true", help="run the demo to its end and exit")
    args = parser.parse_args(argv)
    return run_holding(
        "make dev",
        hold_lock(DEV_DIR),
        lambda: _run(args.once, signals),
        signals,
        cleaned=_CLEANED,
        when_held="stop that one first (Ctrl-C in its terminal), it removes its cluster "
        "as it stops",
    )


#: What a stop leaves: nothing of the run's (said once, on the line a stop prints).
_CLEANED = f"the operator, kube-apiserver and etcd are stopped and {DEV_DIR.name}/cluster removed"


def _run(once: bool, signals: StopOnSignals) -> int:
    stale, expiry = (
        # --once: 8 s of life leaves room for a slow first admission on a busy machine
        # (one decided after its expiry is, rightly, Rejected AlreadyExpired).
        (timedelta(seconds=4), timedelta(seconds=8))
        if once
        else (timedelta(seconds=30), timedelta(seconds=45))
    )
    workdir = DEV_DIR / "cluster"
    with contextlib.ExitStack() as stack:
        # Unwound in reverse: the shield first, so no second signal cuts the clean-up
        # short; then the operator, the control plane, and the directory last.
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
        _say(f"starting etcd and kube-apiserver in {workdir}")
        plane = stack.enter_context(ControlPlane(workdir))
        kubeconfig = DEV_DIR / "kubeconfig"
        shutil.copy(plane.kubeconfig, kubeconfig)
        api = api_client(kubeconfig)
        crds = install_crds(api, sorted((ROOT / "crds").glob("*.yaml")))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        for name, memory, labels in DEMO_NODES:
            create_node(core, name, memory=memory, labels=labels)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        custom.create_cluster_custom_object("headroom.dev", "v1alpha1", "headroomquotas", QUOTA)
        operator = OperatorProcess(
            kubeconfig,
            workdir,
            {
                "limits": {"heartbeatStaleWindow": f"{int(stale.total_seconds())}s"},
                "sweepPeriod": "2s",
                "reclaimedRetention": "10m",
            },
        )
        stack.callback(operator.stop)  # before start: a stop while it starts stops it too
        stack.callback(signals.shield)
        _say("starting the operator")
        # A leader that has rebuilt its ledger: the demo's outcomes rest on its
        # reservations being decided in the order they are created, which only the
        # watch keeps; a rebuild that lists them orders one second's creations by name.
        operator.start().wait_ready(body="ok")
        _say(f"control plane up at {plane.url}; CRDs: {', '.join(crds)}")
        _say(f"operator running (log: {operator.log}; metrics: {operator.metrics_url})")
        _say(f"demo nodes: {', '.join(n for n, _, _ in DEMO_NODES)}")
        _say("\nIn another shell:\n")
        _say(f"  export KUBECONFIG={kubeconfig}")
        tools = f"{bin_dir()}:{Path(sys.executable).parent}"  # kubectl; kubectl-headroom
        _say(f"  export PATH={tools}:$PATH")
        _say("  kubectl get rsv,nodeheadrooms,headroomquotas -A -w\n")
        apply_demo(custom, expiry)
        _say(
            f"demo applied in namespace {NAMESPACE}: 'forgotten' goes stale after "
            f"{stale.seconds}s, 'short-lived' expires after {expiry.seconds}s"
        )
        if once:
            return _check(custom, deadline=time.monotonic() + 60)
        _say("\nCtrl-C to stop.")
        while True:  # until a signal raises Stopped
            time.sleep(stale.total_seconds() / 3)
            heartbeat(custom)


def _check(custom: client.CustomObjectsApi, deadline: float) -> int:
    seen: dict[str, tuple[str, str]] = {}
    while time.monotonic() < deadline:
        heartbeat(custom)
        seen = outcomes(custom)
        if seen == EXPECTED:
            for name, (phase, reason) in sorted(seen.items()):
                _say(f"  {name:<14} {phase:<10} {reason}")
            _say("--once: every demo outcome reached")
            return 0
        time.sleep(0.5)
    _say(f"--once: demo did not reach its outcomes: {seen}")
    return 1


if __name__ == "__main__":  # make dev runs headroom_dev.dev, which calls main
    sys.exit(main())
