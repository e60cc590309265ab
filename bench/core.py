"""B5: pure ledger reserve+release pairs per second at 100 and at 100,000 active entries.

The same loop runs against a ledger that already holds N entries; the ratio of
the two rates shows whether the cost depends on the size (it must not: the
ledger keeps per-node aggregates instead of summing on each call).

B5-gpu: the same pairs with 10 GiB of VRAM on nodes with 8 × 80 GiB GPU devices,
each admitted per device (issue 20), as a ratio to the RAM-only pairs at 100.

B5-outside: B5-gpu's pairs on nodes where GPUs are also held outside Headroom (issue
30): on each node a device-plugin pod holds one GPU whole and a DRA ResourceClaim
consumes 20 GiB of another, as a ratio to B5-gpu.

    python bench/core.py [--pairs 200000] [--repeats 5] [--json PATH]

Each row is printed, and the JSON file rewritten atomically, as soon as it is
measured; if the second one raises, the file keeps the first plus an ``errors``
entry and the exit status is 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from report import write_json

from headroom.api.gpus import GpuDevice
from headroom.api.limits import Limits
from headroom.ledger import Entry, Ledger, Owner
from headroom.ledger.external import DraClaim
from headroom_dev.interrupts import stop_cleanly

NODES = 100
T0 = datetime(2026, 12, 2, tzinfo=UTC)


def gpus_of(node: str) -> tuple[GpuDevice, ...]:
    return tuple(GpuDevice(f"GPU-{node}-{i}", 80 * 1024, ref=f"d/{node}/{i}") for i in range(8))


def filled(active: int, *, gpus: bool = False, outside: bool = False) -> Ledger:
    ledger = Ledger(Limits(max_entries_per_node=10**6, heartbeat_stale_window=timedelta(days=1)))
    for i in range(NODES):
        node = f"node-{i}"
        ledger.set_node_capacity(node, 1 << 30, 8 * 80 * 1024 if gpus else None)
        if gpus:
            ledger.set_node_devices(node, gpus_of(node))
        if outside:
            ledger.set_device_plugin_pod(("cuda", node), node, 1)
            ledger.set_resource_claim(("dra", node), DraClaim({f"d/{node}/1": 20 * 1024}))
    owner = Owner()
    for i in range(active):
        entry = Entry(f"held/{i}", f"node-{i % NODES}", 1, T0, T0, owner=owner)
        assert ledger.reserve(entry, T0).admitted
    return ledger


def pairs_per_second(ledger: Ledger, pairs: int, *, vram_mb: int = 0) -> float:
    owner = Owner()
    entries = [
        Entry(f"bench/{i}", f"node-{i % NODES}", 64, T0, T0, vram_mb=vram_mb, owner=owner)
        for i in range(pairs)
    ]
    reserve, release = ledger.reserve, ledger.release
    start = time.perf_counter()
    for entry in entries:
        reserve(entry, T0)
        release(entry.id)
    return pairs / (time.perf_counter() - start)


def measure(
    active: int, pairs: int, repeats: int, *, gpus: bool = False, outside: bool = False
) -> dict[str, float]:
    ledger = filled(active, gpus=gpus, outside=outside)
    vram = 10 * 1024 if gpus else 0
    rates = [pairs_per_second(ledger, pairs, vram_mb=vram) for _ in range(repeats)]
    return {
        "active": active,
        "median": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {"id": "B5"}
    print(f"{'active entries':>15} {'pairs/s (median)':>18} {'min':>10} {'max':>10}", flush=True)
    phases = (("small", 100), ("large", 100_000), ("gpu", 100), ("outside", 100))
    for key, active in phases:
        try:
            gpus, outside = key in ("gpu", "outside"), key == "outside"
            row = measure(active, args.pairs, args.repeats, gpus=gpus, outside=outside)
        except Exception as error:
            traceback.print_exc()
            result["errors"] = [
                {
                    "phase": f"B5 at {active:,} entries",
                    "exception": f"{type(error).__name__}: {error}",
                    "traceback": traceback.format_exc(),
                }
            ]
            if args.json:
                write_json(args.json, result)
            return 1
        result[key] = row
        print(
            f"{row['active']:>15,} {row['median']:>18,.0f} {row['min']:>10,.0f} "
            f"{row['max']:>10,.0f}",
            flush=True,
        )
        if args.json:
            write_json(args.json, result)
    result["ratio"] = ratio = result["small"]["median"] / result["large"]["median"]
    print(f"ratio (100 / 100,000): {ratio:.2f}  (target ≤ 1.5; ≥ 200,000 pairs/s)")
    result["gpu_ratio"] = gpu = result["gpu"]["median"] / result["small"]["median"]
    print(f"B5-gpu: per-device pairs on 8 × 80 GiB nodes / RAM-only pairs: {gpu:.2f}")
    result["outside_ratio"] = held = result["outside"]["median"] / result["gpu"]["median"]
    print(f"B5-outside: with GPUs held outside Headroom / B5-gpu: {held:.2f}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(stop_cleanly("bench/core.py", main, "nothing was running beside it"))
