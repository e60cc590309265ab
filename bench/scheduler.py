"""B12: claim pods placed by kube-scheduler through the extender, against the stock
scheduler alone and against the gate path, on the local control plane.

Nodes are Node objects without kubelets (``pods: 1000``, many CPUs), so what is timed is
scheduling, admission and binding, not containers starting. Two kube-schedulers run
beside the control plane's own, built from the same source, configured alike (one
profile, ``percentageOfNodesToScore: 100``, the same backoffs): ``stock-bench`` without
an extender, and ``headroom`` whose extender is the operator (filter, prioritize,
bind). At 100 and 1,000 nodes, three placements in turn, alternated per round:

- **stock**: plain pods for ``stock-bench``: create → bound;
- **extender**: claim pods for ``headroom``: create → bound (the reservation admitted
  and written before the Binding);
- **gate**: claim pods created behind the gate (as the webhook leaves them): the
  operator places, reserves, pins and ungates; the control plane's scheduler binds.

Each placement: ``paced`` pods at 20/s (create → bound p50/p99), then a ``burst``
created 16 at a time (pods bound per second, first create to last bound). Targets from
issue 30: extender ≥ 0.8 × stock pods/s, and ≤ +50 ms at p50.

Each burst also says what bounds it: the CPU milliseconds per pod of each process (the
operator, the API server, etcd, both schedulers; on 2 shared cores their sum is the
ceiling) and the API requests per pod by verb and resource (the API server's own count).

Both schedulers keep kube-scheduler's default API client rate, as deployed: 50 requests
per second after a burst of 100. It bounds the stock scheduler's Bindings (a burst of
200 is bound at about 99/s, whatever the machine); the extender's Bindings are posted by
the operator. ``--qps`` raises both schedulers' rate, to compare what the machine can do.
``--cpus N`` runs the whole bench (control plane, operator, schedulers, this process) on
the first N CPUs: the stock scheduler's rate is its client's, the extender's the
machine's CPU, so comparing N against all says how the ratio moves with cores.

    python bench/scheduler.py [--quick] [--qps N] [--cpus N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster import ROOT, Bench, bounded, persist, say
from cpu import Cpu
from gates import Timeline, ns_path_pods, percentiles, until, watch_pods
from report import write_json

from headroom.kube.client import KubeClient
from headroom_dev.apply import install_crds
from headroom_dev.controlplane import ControlPlane, free_port
from headroom_dev.interrupts import stop_cleanly
from headroom_dev.nodes import create_node
from headroom_dev.scheduler import HeadroomScheduler, client_files, extender_over_tls

JSON = dict[str, Any]
GATE = "headroom.dev/admission"
STOCK = "stock-bench"
RATE = 20.0


def pod(name: str, placement: str) -> JSON:
    metadata: JSON = {"name": name}
    spec: JSON = {
        "containers": [
            {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if placement == "stock":
        spec["schedulerName"] = STOCK
    else:
        metadata["labels"] = {"headroom.dev/claim": "true", "headroom.dev/owner": "true"}
        metadata["annotations"] = {"headroom.dev/ram": "1Mi"}
        if placement == "extender":
            spec["schedulerName"] = "headroom"
        else:  # behind the gate, as the webhook leaves it
            spec["schedulingGates"] = [{"name": GATE}]
    return {"metadata": metadata, "spec": spec}


async def make_nodes(core: Any, count: int, prefix: str) -> list[str]:
    names = [f"{prefix}-{i:04d}" for i in range(count)]

    def make(name: str) -> None:
        create_node(core, name, memory="1Ti")
        big = {"pods": "1000", "cpu": "1000"}
        core.patch_node_status(name, {"status": {"capacity": big, "allocatable": big}})
        core.patch_node(name, {"spec": {"taints": []}})

    await bounded([asyncio.to_thread(make, name) for name in names], 8)
    return names


async def placement_run(
    client: KubeClient,
    bench: Bench,
    placement: str,
    paced: int,
    burst: int,
    tag: str,
    pids: dict[str, int],
) -> JSON:
    namespace = await bench.namespace(client)
    timeline = Timeline()
    watcher = asyncio.create_task(watch_pods(client, namespace, timeline))
    await asyncio.sleep(0.3)
    try:
        bodies = [pod(f"{tag}-paced-{i:04d}", placement) for i in range(paced)]
        start = time.monotonic()

        async def one(index: int, item: JSON) -> None:
            await asyncio.sleep(max(0.0, start + index / RATE - time.monotonic()))
            name = item["metadata"]["name"]
            timeline.created[name] = time.monotonic()
            await persist(lambda: client.create(ns_path_pods(namespace), item), name, landed=409)

        await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
        names = [b["metadata"]["name"] for b in bodies]
        await until(lambda: all(n in timeline.bound for n in names), f"{tag} paced bound", 180)
        latency = percentiles(timeline.latencies(names, timeline.bound))

        bodies = [pod(f"{tag}-burst-{i:04d}", placement) for i in range(burst)]
        names = [b["metadata"]["name"] for b in bodies]

        async def create(item: JSON) -> None:
            timeline.created[item["metadata"]["name"]] = time.monotonic()
            await persist(lambda: client.create(ns_path_pods(namespace), item), "burst", landed=409)

        requests_before = await request_counts(bench.api)
        cpu = Cpu(pids)
        began = time.monotonic()
        await bounded([create(b) for b in bodies], 16)
        await until(lambda: all(n in timeline.bound for n in names), f"{tag} burst bound", 300)
        took = max(timeline.bound[n] for n in names) - began
        used = cpu.seconds()
        requests = await request_counts(bench.api)
        per_pod = {
            key: round((count - requests_before.get(key, 0)) / burst, 2)
            for key, count in sorted(requests.items())
            if (count - requests_before.get(key, 0)) / burst >= 0.05
        }
        return {
            **latency,
            "burst_pods_per_s": burst / took,
            "cpu_ms_per_pod": {name: round(s * 1000 / burst, 1) for name, s in used.items()},
            "requests_per_pod": per_pod,
        }
    finally:
        watcher.cancel()
        await clear_pods(client, namespace)  # first: a bound claim pod would be re-recorded
        await bench.clean(client, namespace)
        await persist(
            lambda: client.delete(f"/api/v1/namespaces/{namespace}"), "namespace", landed=404
        )


async def request_counts(api: Any) -> dict[str, float]:
    """The API server's requests so far by verb and resource (``apiserver_request_total``,
    summed over codes): the difference over a burst is what each placement writes."""

    def read() -> str:
        answer = api.call_api("GET", api.configuration.host + "/metrics")
        answer.read()
        return str(answer.data.decode())

    text = await asyncio.to_thread(read)
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        if not resource:
            continue
        key = f"{labels.get('verb', '?')} {resource}"
        counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


async def summaries_written(client: KubeClient, count: int) -> None:
    """Until the operator has written a NodeHeadroom for each of ``count`` nodes: a
    thousand new nodes are a thousand creations, which would be timed with the pods."""
    path = "/apis/headroom.dev/v1alpha1/nodeheadrooms"

    async def written() -> int:
        page = await client.request("GET", path, params={"limit": 1})
        items, remaining = page.get("items") or [], page["metadata"].get("remainingItemCount")
        return len(items) + int(remaining or 0)

    deadline = time.monotonic() + 300
    while await written() < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {count} NodeHeadrooms written in 300 s")
        await asyncio.sleep(1)


async def clear_pods(client: KubeClient, namespace: str) -> None:
    """Delete the run's pods at once (no kubelet would confirm a graceful deletion)."""
    path = ns_path_pods(namespace)
    await persist(lambda: client.request("DELETE", path, params={"gracePeriodSeconds": 0}), "pods")

    async def gone() -> bool:
        page = await client.request("GET", path, params={"limit": 1})
        return not page.get("items")

    deadline = time.monotonic() + 120
    while not await gone():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the pods of {namespace} were not deleted in 120 s")
        await asyncio.sleep(0.5)


async def run(args: argparse.Namespace) -> JSON:
    sizes = (100,) if args.quick else (100, 1000)
    rounds = 1 if args.quick else 2
    paced, burst = (40, 60) if args.quick else (100, 200)
    figures: JSON = {"paced": paced, "burst": burst, "rate_per_s": RATE, "rounds": rounds}
    figures["scheduler_qps"] = args.qps or "default (50, burst 100)"
    figures["cpus"] = len(os.sched_getaffinity(0))
    workdir = Path(tempfile.mkdtemp(prefix="headroom-b12-"))
    with ControlPlane(controllers=True) as plane:
        bench = Bench(plane, workdir, args.quick)
        install_crds(bench.api, sorted((ROOT / "crds").glob("*.yaml")))
        core = __import__("kubernetes").client.CoreV1Api(bench.api)
        client = KubeClient(bench.credentials, connections=64)
        port = free_port()
        operator = bench.operator(extender_over_tls(port, "default")).start()  # the chart's
        operator.wait_ready(body="ok")
        files = client_files(core, "default", workdir / "client")
        url = f"https://127.0.0.1:{port}"
        schedulers = [
            HeadroomScheduler(plane, url, qps=args.qps, client_tls=files).start(),
            HeadroomScheduler(
                plane, None, name="stock-bench", scheduler_name=STOCK, qps=args.qps
            ).start(),
        ]
        pids = {
            "operator": _pid(operator.popen),
            "headroom-scheduler": _pid(schedulers[0].child.popen),
        }
        pids["stock-scheduler"] = _pid(schedulers[1].child.popen)
        pids["kube-apiserver"] = _pid(plane.apiserver.popen)
        pids["etcd"] = _pid(plane.etcd.popen)
        made = 0
        try:
            for size in sizes:
                await make_nodes(core, size - made, f"b12-{size}")
                made = size
                await asyncio.sleep(2)  # the operator and schedulers see every node
                await summaries_written(client, size)  # before the first run, not during it
                results: dict[str, list[JSON]] = {"stock": [], "extender": [], "gate": []}
                for round_ in range(rounds):
                    order = ["stock", "extender", "gate"]
                    if round_ % 2:
                        order.reverse()
                    for placement in order:
                        tag = f"{placement[0]}{size}r{round_}"
                        result = await placement_run(
                            client, bench, placement, paced, burst, tag, pids
                        )
                        say(f"{size} nodes, {placement}: {result}")
                        results[placement].append(result)
                figures[f"nodes_{size}"] = summary(results)
        finally:
            for scheduler in schedulers:
                scheduler.stop()
            operator.stop()
            await client.close()
    return figures


def _pid(popen: Any) -> int:
    assert popen is not None, "a process of the bench is not running"
    return int(popen.pid)


def summary(results: dict[str, list[JSON]]) -> JSON:
    """Per placement the median of the rounds; the extender's and the gate's ratios."""

    def median(placement: str, key: str) -> float:
        values = sorted(r[key] for r in results[placement])
        return values[len(values) // 2] if len(values) % 2 else sum(values[-2:]) / 2

    out: JSON = {}
    for placement in results:
        out[placement] = {
            key: median(placement, key) for key in ("p50_ms", "p99_ms", "burst_pods_per_s")
        }
        first = results[placement][0]  # what bounds it: the first round's burst
        out[placement]["cpu_ms_per_pod"] = first["cpu_ms_per_pod"]
        out[placement]["requests_per_pod"] = first["requests_per_pod"]
    stock = out["stock"]
    for placement in ("extender", "gate"):
        out[placement]["ratio_to_stock"] = (
            out[placement]["burst_pods_per_s"] / stock["burst_pods_per_s"]
        )
        out[placement]["adds_p50_ms"] = out[placement]["p50_ms"] - stock["p50_ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--qps",
        type=float,
        help="both schedulers' API client rate (burst twice that); default: kube-scheduler's "
        "own, 50/s after a burst of 100, which bounds the stock scheduler's Bindings",
    )
    parser.add_argument(
        "--cpus",
        type=int,
        help="run everything on the first N CPUs (children inherit it; Go's GOMAXPROCS "
        "follows it); default: every CPU the bench may use",
    )
    args = parser.parse_args(argv)
    if args.cpus is not None:
        available = sorted(os.sched_getaffinity(0))
        if not 1 <= args.cpus <= len(available):
            parser.error(f"--cpus {args.cpus}: this machine lets the bench use {len(available)}")
        os.sched_setaffinity(0, available[: args.cpus])
    figures = asyncio.run(run(args))
    for key, value in figures.items():
        print(f"{key}: {value}")
    ok = all(
        figures[key]["extender"]["ratio_to_stock"] >= 0.8
        and figures[key]["extender"]["adds_p50_ms"] <= 50
        for key in figures
        if key.startswith("nodes_")
    )
    verdict = "met" if ok else "NOT met"
    print(f"B12 targets (extender ≥ 0.8 × stock pods/s, ≤ +50 ms p50): {verdict}")
    if args.json:
        write_json(args.json, {"b12": figures, "targets_met": ok})
    return 0


if __name__ == "__main__":
    sys.exit(
        stop_cleanly(
            "bench/scheduler.py",
            main,
            "its operator, schedulers, the controllers, kube-apiserver and etcd are stopped",
        )
    )
