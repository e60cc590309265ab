"""B11: gated pods, on the local control plane with kube-scheduler, against plain pods.

The operator runs as a process with the webhook on (registered by URL, the chart's
configuration otherwise); the nodes are Node objects without a kubelet, so what is
timed is admission and placement, not containers starting. In one run:

- **plain**: N pods without the label, created at R/s: create → scheduled (bound);
- **gated**: N opted-in pods at R/s: the create call (the webhook's cost), create →
  ungated, create → scheduled;
- **burst**: M opted-in pods wait on a node a plain Reservation fills; that
  Reservation is deleted, and the ungates per second until all are ungated are
  compared with B0, the API server's bare create + status-patch rate (as in
  ``bench/cluster.py``), measured in the same run.

    python bench/gates.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster import ROOT, Bench, body, bounded, ns_path, persist, say
from report import write_json

from headroom.kube.client import KubeClient
from headroom_dev.apply import install_crds
from headroom_dev.controlplane import ControlPlane, free_port
from headroom_dev.interrupts import stop_cleanly
from headroom_dev.nodes import create_node
from headroom_dev.webhooks import PATH, gating_configuration

JSON = dict[str, Any]
GATE = "headroom.dev/admission"
WEBHOOK = "headroom-bench"


def pod(name: str, *, claim: str | None, node: str | None = None) -> JSON:
    metadata: JSON = {"name": name}
    if claim is not None:
        metadata["labels"] = {"headroom.dev/claim": "true"}
        metadata["annotations"] = {"headroom.dev/ram": claim}
        if node is not None:
            metadata["annotations"]["headroom.dev/node"] = node
    return {
        "metadata": metadata,
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


class Timeline:
    """When each pod was created, seen ungated, and seen bound (one pod watch)."""

    def __init__(self) -> None:
        self.created: dict[str, float] = {}
        self.ungated: dict[str, float] = {}
        self.bound: dict[str, float] = {}

    def saw(self, obj: JSON) -> None:
        name, now = obj["metadata"]["name"], time.monotonic()
        spec = obj.get("spec") or {}
        if name not in self.ungated and GATE not in [
            g["name"] for g in spec.get("schedulingGates") or []
        ]:
            self.ungated[name] = now
        if name not in self.bound and spec.get("nodeName"):
            self.bound[name] = now

    def latencies(self, names: list[str], what: dict[str, float]) -> list[float]:
        return [what[n] - self.created[n] for n in names if n in what and n in self.created]


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"p50_ms": statistics.median(ordered) * 1000, "p99_ms": p99 * 1000}


async def watch_pods(client: KubeClient, namespace: str, timeline: Timeline) -> None:
    version = (await client.list_page(ns_path_pods(namespace), limit=1))["metadata"][
        "resourceVersion"
    ]
    while True:
        async for event in client.watch(ns_path_pods(namespace), resource_version=version):
            obj = event.get("object") or {}
            version = (obj.get("metadata") or {}).get("resourceVersion", version)
            if event.get("type") in ("ADDED", "MODIFIED"):
                timeline.saw(obj)


def ns_path_pods(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/pods"
    return f"{base}/{name}" if name else base


async def create_paced(
    client: KubeClient, namespace: str, bodies: list[JSON], rate: float, timeline: Timeline
) -> list[float]:
    """Create at ``rate`` per second; the create calls' durations."""
    durations: list[float] = []
    start = time.monotonic()

    async def one(index: int, item: JSON) -> None:
        await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
        name = item["metadata"]["name"]
        began = timeline.created[name] = time.monotonic()
        await persist(lambda: client.create(ns_path_pods(namespace), item), name, landed=409)
        durations.append(time.monotonic() - began)

    await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
    return durations


async def until(check: Any, what: str, bound: float) -> None:
    deadline = time.monotonic() + bound
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached in {bound:.0f}s")
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace) -> JSON:
    count, burst, rate = (60, 30, 20.0) if args.quick else (200, 100, 20.0)
    figures: JSON = {"pods": count, "burst": burst, "rate_per_s": rate}
    workdir = Path(tempfile.mkdtemp(prefix="headroom-b8-"))
    with ControlPlane(controllers=True) as plane:
        bench = Bench(plane, workdir, args.quick)
        install_crds(bench.api, sorted((ROOT / "crds").glob("*.yaml")))
        core = __import__("kubernetes").client.CoreV1Api(bench.api)
        admission = __import__("kubernetes").client.AdmissionregistrationV1Api(bench.api)
        nodes = [f"b8-{i}" for i in range(4)] + ["b8-burst"]
        for node in nodes:
            memory = "101Gi" if node == "b8-burst" else "1Ti"
            create_node(core, node, memory=memory)
            core.patch_node_status(
                node, {"status": {"capacity": {"pods": "1000"}, "allocatable": {"pods": "1000"}}}
            )
            core.patch_node(node, {"spec": {"taints": []}})  # Ready, as node-lifecycle leaves it
        bench.nodes = nodes[:4]
        client = KubeClient(bench.credentials, connections=64)
        port = free_port()
        webhook = {
            "enabled": True,
            "host": "127.0.0.1",
            "port": port,
            "certificate": {
                "namespace": "default",
                "extraNames": ["127.0.0.1"],
                "webhookConfiguration": WEBHOOK,
            },
        }
        admission.create_mutating_webhook_configuration(
            gating_configuration(WEBHOOK, f"https://127.0.0.1:{port}{PATH}")
        )
        operator = bench.operator({"webhook": webhook}).start()
        try:
            warm, measured = await bench.namespace(client), await bench.namespace(client)
            await bench.b0_ceiling(client, warm, 100)  # the first requests are slow
            b0 = await bench.b0_ceiling(client, measured, 400)
            for namespace in (warm, measured):  # B0's reservations would fill the nodes' caps
                await bench.clean(client, namespace)
            figures["b0_per_s"] = b0
            say(f"B0 {b0:.0f}/s")
            timeline = Timeline()
            pods_ns = await bench.namespace(client)
            watcher = asyncio.create_task(watch_pods(client, pods_ns, timeline))
            await asyncio.sleep(0.5)

            plain = [pod(f"plain-{i:04d}", claim=None) for i in range(count)]
            plain_calls = await create_paced(client, pods_ns, plain, rate, timeline)
            names = [p["metadata"]["name"] for p in plain]
            await until(lambda: all(n in timeline.bound for n in names), "plain pods bound", 120)
            figures["plain"] = {
                "create_call": percentiles(plain_calls),
                "create_to_scheduled": percentiles(timeline.latencies(names, timeline.bound)),
            }
            say(f"plain: {figures['plain']}")

            gated = [pod(f"gated-{i:04d}", claim="1Mi") for i in range(count)]
            gated_calls = await create_paced(client, pods_ns, gated, rate, timeline)
            names = [p["metadata"]["name"] for p in gated]
            await until(lambda: all(n in timeline.bound for n in names), "gated pods bound", 180)
            figures["gated"] = {
                "create_call": percentiles(gated_calls),
                "create_to_ungated": percentiles(timeline.latencies(names, timeline.ungated)),
                "create_to_scheduled": percentiles(timeline.latencies(names, timeline.bound)),
            }
            say(f"gated: {figures['gated']}")

            blocker = body("blocker", "b8-burst", 100 * 1024)
            await persist(lambda: client.create(ns_path(pods_ns), blocker), "blocker", landed=409)
            waiting = [pod(f"burst-{i:04d}", claim="1Gi", node="b8-burst") for i in range(burst)]
            await bounded(
                [
                    persist(
                        lambda b=b: client.create(ns_path_pods(pods_ns), b), "burst", landed=409
                    )
                    for b in waiting
                ],
                16,
            )
            names = [p["metadata"]["name"] for p in waiting]

            async def phases() -> list[str]:
                listed = await client.list_page(ns_path(pods_ns), limit=1000)
                return [
                    f"{r['metadata']['name']}:{(r.get('status') or {}).get('phase')}"
                    for r in listed["items"]
                    if r["metadata"]["name"].startswith(("burst-", "blocker"))
                ]

            deadline = time.monotonic() + 120
            while sum(p.endswith(":Queued") for p in await phases()) < burst:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the burst did not all queue: {await phases()}")
                await asyncio.sleep(0.2)
            released = time.monotonic()
            await client.delete(ns_path(pods_ns, "blocker"))
            await until(lambda: all(n in timeline.ungated for n in names), "burst ungated", 120)
            took = max(timeline.ungated[n] for n in names) - released
            figures["burst"] = {"seconds": took, "ungates_per_s": burst / took}
            figures["burst"]["ratio_to_b0"] = figures["burst"]["ungates_per_s"] / b0
            say(f"burst: {figures['burst']}")
            watcher.cancel()
        finally:
            operator.stop()
            await client.close()
    plain_p50 = figures["plain"]["create_to_scheduled"]["p50_ms"]
    gated_p50 = figures["gated"]["create_to_scheduled"]["p50_ms"]
    figures["gating_adds_p50_ms"] = gated_p50 - plain_p50
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    figures = asyncio.run(run(args))
    for key, value in figures.items():
        print(f"{key}: {value}")
    ok = figures["gating_adds_p50_ms"] <= 50 and figures["burst"]["ratio_to_b0"] >= 0.5
    print(
        f"B11 targets (gating adds ≤ 50 ms at p50; burst ≥ 0.5 × B0): {'met' if ok else 'NOT met'}"
    )
    if args.json:
        write_json(args.json, {"b8": figures, "targets_met": ok})
    return 0


if __name__ == "__main__":
    sys.exit(
        stop_cleanly(
            "bench/gates.py",
            main,
            "its operator, the controllers, kube-apiserver and etcd are stopped",
        )
    )
