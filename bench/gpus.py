"""B9: admission per GPU device on 1,000 nodes × 8 GPUs, against RAM-only (issue 20).

In one run, on one local control plane, each with a fresh operator process:

- **B1**: N RAM-only reservations over the 20 small bench nodes, admissions per
  second (as ``bench/cluster.py``'s B1): the baseline the issue names;
- **plain**: N RAM-only reservations over 1,000 nodes without GPUs: admissions per
  second and the operator's RSS after them;
- **gpu**: the same 1,000 nodes labelled as GPU Feature Discovery labels a node with
  8 × 80 GiB GPUs, and N reservations of 10 GiB VRAM each (one device each, chosen
  by binpack): admissions per second and RSS, and a sample of statuses checked to
  carry their device.

Targets: gpu ≥ 0.9 × B1 admissions/s, gpu RSS ≤ 1.2 × plain RSS.

    python bench/gpus.py [--quick] [--json PATH]
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

import psutil
from cluster import ROOT, Bench, ns_path, say
from report import write_json

from headroom.kube.client import KubeClient
from headroom_dev.apply import install_crds
from headroom_dev.controlplane import ControlPlane
from headroom_dev.interrupts import stop_cleanly
from headroom_dev.nodes import create_node
from headroom_dev.operator import OperatorProcess

JSON = dict[str, Any]
GFD = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81920"}
CONFIG = {"limits": {"maxEntriesPerNode": 100_000}}


async def admissions_per_s(
    bench: Bench, client: KubeClient, operator: OperatorProcess, count: int, vram: int
) -> float:
    namespace = await bench.namespace(client)
    start = time.monotonic()
    await bench.create_many(client, namespace, count, 1, vram=vram)
    end = await bench.wait_decided(client, namespace, count, operator)
    if vram:
        items, _ = await client.list_all(ns_path(namespace))
        for item in items[:50]:
            status = item.get("status") or {}
            assert status.get("phase") == "Admitted", status
            assert [d["memoryMB"] for d in status.get("devices") or []] == [vram], status
    await bench.clean(client, namespace)
    return count / (end - start)


def rss_mb(operator: OperatorProcess) -> float:
    assert operator.popen is not None
    return float(psutil.Process(operator.popen.pid).memory_info().rss) / 2**20


async def run(args: argparse.Namespace) -> JSON:
    count = 500 if args.quick else 2000
    repeats = 1 if args.quick else 3
    result: JSON = {"id": "B9", "reservations": count, "nodes": args.nodes, "devices_per_node": 8}
    workdir = Path(tempfile.mkdtemp(prefix="headroom-bench-gpus-"))
    with ControlPlane() as plane:
        bench = Bench(plane, workdir, args.quick)
        install_crds(bench.api, sorted((ROOT / "crds").glob("*.yaml")))
        client = KubeClient(bench.credentials, connections=64)
        core = __import__("kubernetes").client.CoreV1Api(bench.api)
        try:
            bench.nodes = [f"bench-node-{i:02d}" for i in range(20)]
            for node in bench.nodes:
                create_node(core, node, memory="1Ti")
            big = [f"gpu-node-{i:04d}" for i in range(args.nodes)]
            for node in big:
                create_node(core, node, memory="1Ti")
            phases: list[tuple[str, list[str], int]] = [
                ("B1", bench.nodes, 0),
                ("plain", big, 0),
                ("gpu", big, 10 * 1024),
            ]
            for key, nodes, vram in phases:
                if key == "gpu":
                    for node in big:
                        core.patch_node(node, {"metadata": {"labels": GFD}})
                bench.nodes = nodes
                operator = bench.operator(CONFIG).start()
                rates = []
                for _ in range(repeats):
                    rates.append(await admissions_per_s(bench, client, operator, count, vram))
                result[key] = {"admissions_per_s": statistics.median(rates), "runs": rates}
                if key != "B1":
                    result[key]["rss_mb"] = rss_mb(operator)
                operator.stop()
                say(f"B9 {key}: {result[key]}")
                if args.json:
                    write_json(args.json, result)
        finally:
            bench.stop_operators()
            await client.close()
    b1, plain, gpu = result["B1"], result["plain"], result["gpu"]
    result["gpu_ratio_to_B1"] = gpu["admissions_per_s"] / b1["admissions_per_s"]
    result["gpu_ratio_to_plain"] = gpu["admissions_per_s"] / plain["admissions_per_s"]
    result["gpu_rss_ratio_to_plain"] = gpu["rss_mb"] / plain["rss_mb"]
    result["complete"] = True
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="500 reservations, one run each")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    if args.json:
        write_json(args.json, result)
    print(
        f"B9: gpu {result['gpu']['admissions_per_s']:.0f}/s = "
        f"{result['gpu_ratio_to_B1']:.2f} × B1 (target ≥ 0.9), "
        f"{result['gpu_ratio_to_plain']:.2f} × plain on the same nodes; "
        f"RSS {result['gpu']['rss_mb']:.0f} MiB = {result['gpu_rss_ratio_to_plain']:.2f} × plain "
        "(target ≤ 1.2)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(
        stop_cleanly(
            "bench/gpus.py",
            main,
            "its operators, kube-apiserver and etcd are stopped; the phases done are saved",
        )
    )
