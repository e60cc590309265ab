"""B8: noisy neighbour (issue 22). Does one tenant's load slow another's decisions?

One run, one local control plane, one operator throughout. After B0 (measured as
``bench/cluster.py`` does, by its own code: a warm-up, then the bare create + status
patch ceiling), a *control* tenant (namespace ``b8-control``, node ``b8-control``,
which nobody else uses) creates one 1 MiB reservation every 100 ms, in three phases:

- **quiet**: nothing else happens;
- **storm**: another namespace's admitted reservations (300, on 10 nodes of their
  own) are given new ``headroom.dev/heartbeat`` annotation values, round-robin, at
  a steady rate (300 patches/s; as many as the API server takes, 32 in flight), for
  the stale window (30 s) and 2 s more, the control tenant creating throughout: a
  heartbeat the operator failed to see in time would show as a reclaim; there must
  be none;
- **flood**: another namespace creates 3,000 reservations as fast as 16 concurrent
  creators can, over 20 nodes of their own; the control tenant creates until the
  flood is all decided. The flood must end within the stale window, or its own
  reservations are reclaimed in it (``flood_reclaimed``, reported; 0 expected).

Each control create is timed by a plain watch of the control namespace (not the
operator's): *the API server's part* is from sending the create until the watch sees
it (ADDED); *the operator's part* is from then until the watch sees a
``status.phase``. Per phase: p50/p99 of both (and of the total). Targets, on the
operator's part at p99: storm <= 2 x max(quiet, 25 ms), flood <= 3 x max(quiet,
25 ms). The flood's own admission rate (3,000 / first create -> last decision seen)
is given as a ratio to B0 (target >= 0.5). Per phase also the CPU of the operator,
kube-apiserver, etcd and this bench (psutil; % of one core over the phase).

``--profile DIR``: py-spy records the operator through each phase (raw collapsed
stacks, ``DIR/b8-<phase>.txt``) and the run summarizes where its CPU went: self time
by area (JSON, aiohttp, TLS, asyncio, logging, each operator module) and by function,
the areas anywhere in the stack (inclusive; those under every sample left out) and
the operator's functions inclusive (``DIR/b8-<phase>.summary.txt``, and in the JSON).
py-spy samples at 200 Hz; samples whose leaf is a wait (epoll, an idle worker thread)
are left out, since py-spy lets many through as busy. py-spy is not a dev dependency
(``pip install py-spy`` into the venv); it needs ptrace (root, or CAP_SYS_PTRACE).
``make bench PROFILE=1`` passes ``--profile bench/results/profile``.

Only the API and the operator's /metrics endpoint are used, nothing inside the
operator. Operator settings: ``heartbeatStaleWindow: 30s`` (quick: 15 s; short, so
that the storm can show a reclaim at all), ``heartbeatWriteFraction: 1``
(``status.lastHeartbeat`` rewritten at most once a window per reservation: 10 writes/s
for 300, one per 30 beats, where the default 5 min x 0.25 would give one per 75),
``maxEntriesPerNode: 100000``.
Each control reservation is deleted as soon as its decision is seen, so that none
goes stale (and is reclaimed, a GET and a status write) during a later phase; each
phase starts once the operator has no Event left to post, plus 2 s. The CPU shares
include ``machine`` (every process) and ``others`` (the machine less ours): a phase
with a high ``others`` was measured beside someone else's load.

    python bench/fairness.py [--quick] [--json PATH] [--profile DIR]

``--quick``: 50 control creates in the quiet, a storm of 150 reservations at 150/s
for 17 s, a flood of 1,000, B0 once (50 s on 2 cores); else 150, 300 at 300/s for
32 s, 3,000, B0 three times (1.5 min). The flood's control samples are few (about
70 in the full run, 20 quick): its p99 is close to its maximum.

Every client here, the operator included, uses the harness's admin identity
(``system:masters``), which API Priority and Fairness exempts: B8 measures the
operator's own fairness, not the chart's FlowSchema.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from cluster import (
    PROGRESS_S,
    Bench,
    PhaseWatch,
    Results,
    Run,
    body,
    check_alive,
    every,
    ns_path,
    persist,
    say,
    until,
)
from cpu import Cpu
from report import table

from headroom.kube.client import KubeClient
from headroom.kube.transport import ApiError
from headroom_dev.interrupts import stop_cleanly
from headroom_dev.nodes import create_node
from headroom_dev.operator import OperatorProcess

JSON = dict[str, Any]
HEARTBEAT = "headroom.dev/heartbeat"  # headroom.api.constants.HEARTBEAT_ANNOTATION
CONTROL, STORM, FLOOD = "b8-control", "b8-storm", "b8-flood"
CONTROL_PERIOD_S = 0.1  # one control create every 100 ms
FLOOR_MS = 25.0  # the targets' floor for the quiet p99
STORM_IN_FLIGHT = 32
FLOOD_CREATORS = 16
SETTLE_S = 2.0
PROFILE_HZ = 200
PYSPY = Path(sys.executable).with_name("py-spy")  # not a dev dependency: pip install py-spy
ENTRY = ("/headroom/cli/", "/headroom/__main__.py")  # frames under every sample
# Leaf frames where the operator waits, not computes: py-spy's idle detection lets
# many of these through (measured: 8 in 10 samples while psutil showed 4 % CPU).
WAITING = {
    ("EpollSelector.select", "selectors.py"),
    ("_worker", "thread.py"),
    ("Condition.wait", "threading.py"),
    ("Event.wait", "threading.py"),
    ("Thread._wait_for_tstate_lock", "threading.py"),
}


@dataclass(frozen=True)
class Sizes:
    control: int  # control creates in the quiet and storm phases (the flood: while it lasts)
    storm: int  # the storm's reservations
    storm_rate: float  # heartbeat patches per second
    flood: int  # the flood's reservations
    window_s: int  # heartbeatStaleWindow; the storm lasts 2 s longer

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        return cls(50, 150, 150, 1000, 15) if quick else cls(150, 300, 300, 3000, 30)

    def config(self) -> JSON:
        limits = {"maxEntriesPerNode": 100_000, "heartbeatStaleWindow": f"{self.window_s}s"}
        return {"limits": limits, "heartbeatWriteFraction": 1}


def quantiles(values: list[float]) -> JSON:
    """p50 and p99 in ms (and the max and count) of ``values`` in seconds."""
    if len(values) < 2:
        return {"count": len(values)}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {
        "count": len(values),
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


class Profiler:
    """py-spy recording one process through a phase (raw collapsed stacks), or nothing."""

    def __init__(self, directory: Path | None, pid: int, phase: str) -> None:
        self.popen: subprocess.Popen[bytes] | None = None
        self.path = directory / f"b8-{phase}.txt" if directory else None
        if directory is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        argv = [str(PYSPY), "record", "--pid", str(pid), "--format", "raw", "--full-filenames"]
        argv += ["--rate", str(PROFILE_HZ), "-o", str(self.path)]
        log = (directory / f"b8-{phase}.py-spy.log").open("wb")
        self.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(0.5)  # attached before the phase's load starts

    def stop(self) -> JSON | None:
        """Stop recording; the summary of what was recorded."""
        if self.popen is None or self.path is None:
            return None
        self.popen.send_signal(signal.SIGINT)
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        if not self.path.exists():
            return {"error": f"py-spy wrote no {self.path.name} (see its .py-spy.log)"}
        summary = summarize(self.path.read_text())
        self.path.with_suffix(".summary.txt").write_text(render_summary(summary))
        return summary


def area(frame: str) -> str:
    """Which part of the program a py-spy frame ``function (file:line)`` is in."""
    function, _, where = frame.rpartition(" (")
    path = where.rsplit(":", 1)[0]
    if "/headroom/" in path:
        return "headroom/" + path.split("/headroom/", 1)[1]
    for name, marker in (
        ("json", "/json/"),
        ("aiohttp", "/aiohttp/"),
        ("yarl/multidict", "/yarl/"),
        ("yarl/multidict", "/multidict/"),
        ("TLS (ssl)", "/ssl.py"),
        ("asyncio", "/asyncio/"),
        ("logging", "/logging/"),
        ("kopf", "/kopf/"),
        ("pydantic", "/pydantic"),
        ("kubernetes client", "/kubernetes/"),
        ("prometheus/metrics", "prometheus"),
    ):
        if marker in path:
            return name
    return f"other: {Path(path).name or function}"


def summarize(raw: str, top: int = 12) -> JSON:
    """Shares of py-spy's raw output (``frame;frame;... count`` per line, root first):
    self time by area and by function, and the operator's own functions inclusive."""
    total = waiting = 0
    by_area: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if " (" in f]
        if not frames:
            continue
        leaf = frames[-1]
        function, _, where = leaf.rpartition(" (")
        if (function, Path(where.rsplit(":", 1)[0]).name) in WAITING:
            waiting += count
            continue
        total += count
        by_area[area(leaf)] += count
        by_function[_short(leaf)] += count
        frames = [f for f in frames if not any(e in f for e in ENTRY)]
        for function in {_short(f) for f in frames if "/headroom/" in f}:
            inclusive[function] += count
        for name in {area(f) for f in frames}:
            areas[name] += count

    def shares(counter: Counter[str], most: int = top) -> list[tuple[str, float]]:
        return [(k, round(v / total * 100, 1)) for k, v in counter.most_common(most)]

    return {
        "samples": total,
        "waiting_samples": waiting,
        "self_by_area_pct": shares(by_area),
        "self_by_function_pct": shares(by_function),
        "operator_inclusive_pct": shares(inclusive),
        "inclusive_by_area_pct": shares(Counter({a: n for a, n in areas.items() if n < total})),
    }


def _short(frame: str) -> str:
    """``function (file:line)`` -> ``function (pkg/file.py)``, without the line."""
    function, _, where = frame.rpartition(" (")
    path = where.rsplit(":", 1)[0]
    if "/headroom/" in path:
        path = "headroom/" + path.split("/headroom/", 1)[1]
    elif "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    else:
        path = "/".join(Path(path).parts[-2:])
    return f"{function} ({path})"


def render_summary(summary: JSON) -> str:
    if "samples" not in summary:
        return str(summary)
    out = [
        f"{summary['samples']:,} samples at {PROFILE_HZ} Hz on CPU "
        f"({summary.get('waiting_samples', 0):,} more waiting, left out)"
    ]
    for key, title in (
        ("self_by_area_pct", "self time by area"),
        ("self_by_function_pct", "self time by function"),
        ("operator_inclusive_pct", "operator functions, inclusive"),
        ("inclusive_by_area_pct", "areas anywhere in the stack (inclusive)"),
    ):
        out.append(f"\n{title}:")
        out += [f"  {share:5.1f} %  {name}" for name, share in summary.get(key, [])]
    return "\n".join(out) + "\n"


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class Fairness(Run):
    """B0 by :meth:`Run.baseline`, then B8's three phases with one operator."""

    operator_process: OperatorProcess

    def __init__(self, args: argparse.Namespace, results: Results) -> None:
        args.only = set()
        super().__init__(args, results)
        self.sizes = Sizes.of(args.quick)
        self.profile_dir: Path | None = args.profile

    async def phases(self) -> None:
        await self.baseline()
        await self.b8()
        self.results.begin("end")
        self.results.complete()

    async def b8(self) -> None:
        bench, client, sizes = self.bench, self.client, self.sizes
        self.results.begin("B8 set-up")
        core = __import__("kubernetes").client.CoreV1Api(bench.api)
        self.storm_nodes = [f"b8-storm-{i}" for i in range(10)]
        self.flood_nodes = [f"b8-flood-{i:02d}" for i in range(20)]
        for node in [CONTROL, *self.storm_nodes, *self.flood_nodes]:
            create_node(core, node, memory="1Ti")
        for name in (CONTROL, STORM, FLOOD):
            ns: JSON = {"metadata": {"name": name}}
            await persist(partial(client.create, "/api/v1/namespaces", ns), name, landed=409)
        operator = bench.operator(sizes.config()).start()
        self.operator_process = operator
        assert operator.popen is not None
        assert bench.plane.apiserver.popen is not None
        assert bench.plane.etcd.popen is not None
        self.pids = {
            "operator": operator.popen.pid,
            "kube-apiserver": bench.plane.apiserver.popen.pid,
            "etcd": bench.plane.etcd.popen.pid,
            "bench": os.getpid(),
        }
        self.control_client = KubeClient(bench.credentials, connections=8)
        self.watch = await PhaseWatch.start(bench.credentials, client, ns_path(CONTROL))
        self.results.figure(
            "B8",
            sizes=vars(sizes),
            control_period_ms=CONTROL_PERIOD_S * 1000,
        )
        try:
            for phase in ("quiet", "storm", "flood"):
                self.results.begin(f"B8 {phase}")
                await self.settle()
                figures = await getattr(self, phase)()
                self.results.data.setdefault("B8", {}).setdefault("phases", {})[phase] = figures
                self.ratios()
                self.results.figure("B8")
                print(phase_table(self.results.data["B8"]), flush=True)
            self.results.finish("B8")
        finally:
            await self.watch.stop()
            await self.control_client.close()
            operator.stop()

    def ratios(self) -> None:
        """The headline ratios, from the phases measured so far."""
        b8 = self.results.data["B8"]
        phases = b8.get("phases", {})
        quiet = phases.get("quiet", {}).get("operator", {}).get("p99_ms")
        if quiet is None:
            return
        base = max(quiet, FLOOR_MS)
        b8["operator_p99_base_ms"] = base
        for phase, target in (("storm", 2.0), ("flood", 3.0)):
            p99 = phases.get(phase, {}).get("operator", {}).get("p99_ms")
            if p99 is not None:
                b8[f"{phase}_operator_p99_ratio"] = round(p99 / base, 2)
                b8[f"{phase}_target"] = target
        flood = phases.get("flood", {}).get("flood_admissions_per_s")
        if flood is not None:
            b0 = statistics.median(self.results.data["B0"]["creates_patches_per_s"])
            b8["flood_ratio_to_B0"] = round(flood / b0, 3)

    async def settle(self) -> None:
        """Start every phase from the same quiet: no Event left to post, then 2 s."""
        operator = self.operator_process

        async def quiet() -> tuple[bool, str]:
            events = await Bench.metric(operator, "headroom_events_queued", -1)
            return events == 0, f"{events:,.0f} Events queued"

        await until("B8: operator quiet", quiet, within=300, period=0.2, operator=operator)
        await asyncio.sleep(SETTLE_S)

    # -- the control tenant ----------------------------------------------------------------

    async def control(self, phase: str, enough: asyncio.Event | None = None) -> JSON:
        """Control creates every 100 ms: ``sizes.control`` of them, or with ``enough``
        until it is set (at least 10); then until each one's decision is seen. The
        figures of the API server's part, the operator's and the total.

        Each control reservation is deleted once its decision is seen (a short claim):
        kept, it would go stale after the window and its reclaim (a GET and a
        status write) would load a later phase."""
        client, watch = self.control_client, self.watch
        sent: dict[str, float] = {}
        requests: list[asyncio.Future[JSON]] = []
        released: set[str] = set()

        def release() -> None:
            for key in [k for k in sent if k in watch.decided and k not in released]:
                released.add(key)
                path = ns_path(CONTROL, key.split("/", 1)[1])
                requests.append(asyncio.ensure_future(self.delete(client, path)))

        start = time.monotonic()
        i = 0
        while (enough is None and i < self.sizes.control) or (
            enough is not None and (not enough.is_set() or i < 10) and i < 10 * self.sizes.control
        ):
            await asyncio.sleep(max(0.0, start + i * CONTROL_PERIOD_S - time.monotonic()))
            release()
            name = f"{phase}-{i:04d}"
            rsv = body(name, CONTROL, 1)
            sent[f"{CONTROL}/{name}"] = time.monotonic()
            requests.append(
                asyncio.ensure_future(
                    persist(partial(client.create, ns_path(CONTROL), rsv), name, landed=409)
                )
            )
            i += 1
        await watch.wait(
            lambda: all(n in watch.decided for n in sent), f"B8 {phase}: control decisions", 120
        )
        seconds = time.monotonic() - start
        release()
        await asyncio.gather(*requests)
        check_alive(self.operator_process)
        api = [watch.added[n] - sent[n] for n in sent]
        operator = [watch.decided[n] - watch.added[n] for n in sent]
        total = [watch.decided[n] - sent[n] for n in sent]
        phases = Counter(watch.phases[n] for n in sent)
        return {
            "api": quantiles(api),
            "operator": quantiles(operator),
            "total": quantiles(total),
            "control_phases": dict(phases),
            "control_seconds": round(seconds, 2),
            # Each create in order: [sent (s from the phase's start), API ms, operator ms].
            "samples": [
                [round(sent[n] - start, 3), round(a * 1000, 2), round(o * 1000, 2)]
                for n, a, o in zip(sent, api, operator, strict=True)
            ],
        }

    @staticmethod
    async def delete(client: KubeClient, path: str) -> JSON:
        try:
            return await persist(partial(client.delete, path), path)
        except ApiError as error:
            if error.not_found:
                return {}
            raise

    # -- the phases ------------------------------------------------------------------------

    async def quiet(self) -> JSON:
        cpu, profiler = Cpu(self.pids), Profiler(self.profile_dir, self.pids["operator"], "quiet")
        figures = await self.control("quiet")
        figures["cpu_pct"] = cpu.percent()
        figures["profile"] = profiler.stop()
        return figures

    async def storm(self) -> JSON:
        bench, client, sizes = self.bench, self.client, self.sizes
        everywhere, bench.nodes = bench.nodes, self.storm_nodes
        try:
            await bench.create_many(client, STORM, sizes.storm, 1, prefix="s")
        finally:
            bench.nodes = everywhere
        await bench.wait_decided(client, STORM, sizes.storm, self.operator_process)
        await self.settle()

        names = [f"s{i:05d}" for i in range(sizes.storm)]
        patches = 0
        stop = asyncio.Event()

        async def beat(name: str) -> None:
            nonlocal patches
            patch = {"metadata": {"annotations": {HEARTBEAT: now_rfc3339()}}}
            await persist(lambda: client.merge_patch(ns_path(STORM, name), patch), name)
            patches += 1

        async def storm() -> float:
            gate = asyncio.Semaphore(STORM_IN_FLIGHT)
            tasks: set[asyncio.Task[None]] = set()
            begin = time.monotonic()
            i = 0
            while not stop.is_set():
                await asyncio.sleep(max(0.0, begin + i / sizes.storm_rate - time.monotonic()))
                await gate.acquire()
                task = asyncio.create_task(beat(names[i % len(names)]))
                task.add_done_callback(lambda _t: gate.release())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
            await asyncio.gather(*tasks)
            return time.monotonic() - begin

        cpu, profiler = Cpu(self.pids), Profiler(self.profile_dir, self.pids["operator"], "storm")
        storming = asyncio.create_task(storm())
        # Longer than the stale window: a heartbeat missed would end in a reclaim.
        over = asyncio.get_running_loop().call_later(sizes.window_s + 2, stop.set)
        await asyncio.sleep(1.0)  # the storm is under way before the first control create
        try:
            figures = await self.control("storm", stop)
        finally:
            over.cancel()
        figures["cpu_pct"] = cpu.percent()
        figures["profile"] = profiler.stop()
        stop.set()
        seconds = await storming
        items, _ = await client.list_all(ns_path(STORM))
        storm_phases = Counter((i.get("status") or {}).get("phase") for i in items)
        figures.update(
            storm_seconds=round(seconds, 1),
            storm_patches=patches,
            storm_patches_per_s=round(patches / seconds, 1),
            storm_phases=dict(storm_phases),
            reclaimed=storm_phases.get("Reclaimed", 0),
        )
        # Gone before the flood: silent from now on, they would be reclaimed during it.
        count, took = await bench.clean(client, STORM)
        say(f"B8: the storm's {count:,} reservations deleted in {took:.1f} s")
        return figures

    async def flood(self) -> JSON:
        bench, client, sizes = self.bench, self.client, self.sizes
        watch = await PhaseWatch.start(bench.credentials, client, ns_path(FLOOD))
        enough = asyncio.Event()
        cpu, profiler = Cpu(self.pids), Profiler(self.profile_dir, self.pids["operator"], "flood")
        start = time.monotonic()

        async def flood() -> tuple[float, float]:
            everywhere, bench.nodes = bench.nodes, self.flood_nodes
            try:
                await bench.create_many(
                    client, FLOOD, sizes.flood, 1, concurrency=FLOOD_CREATORS, prefix="f"
                )
            finally:
                bench.nodes = everywhere
            created = time.monotonic()
            try:
                async with every(
                    PROGRESS_S,
                    lambda: f"B8 flood: {watch.count(f'{FLOOD}/'):,} of {sizes.flood:,} decided",
                ):
                    decided = await watch.wait(
                        lambda: watch.count(f"{FLOOD}/") >= sizes.flood, "B8: flood decisions", 600
                    )
            finally:
                enough.set()
            return created, decided

        try:
            flooding = asyncio.create_task(flood())
            await asyncio.sleep(0.5)  # the flood is under way before the first control create
            figures = await self.control("flood", enough)
            created, _ = await flooding
        finally:
            await watch.stop()
        figures["cpu_pct"] = cpu.percent()
        figures["profile"] = profiler.stop()
        last = max(watch.decided.values())
        figures.update(
            flood_reservations=sizes.flood,
            flood_creates_per_s=round(sizes.flood / (created - start), 1),
            flood_create_s=round(created - start, 2),
            flood_admissions_per_s=round(sizes.flood / (last - start), 1),
            flood_phases=dict(Counter(watch.phases.values())),
        )
        # None should: the flood lasts less than the stale window, or its figures are
        # those of its own reclaims too (a GET and a status write each).
        items, _ = await client.list_all(ns_path(FLOOD))
        phases = Counter((i.get("status") or {}).get("phase") for i in items)
        figures["flood_reclaimed"] = phases.get("Reclaimed", 0)
        return figures


def phase_table(b8: JSON) -> str:
    """B8 per phase: the control tenant's parts, CPU, and what each phase adds."""
    rows = [
        "phase   n    API p50/p99 ms    operator p50/p99 ms   total p50/p99 ms    "
        "CPU % operator / apiserver / etcd / bench / others",
    ]
    for phase, figures in (b8.get("phases") or {}).items():
        cells = []
        for part in ("api", "operator", "total"):
            q = figures.get(part, {})
            cells.append(f"{q.get('p50_ms', 0):7.1f} / {q.get('p99_ms', 0):7.1f}")
        cpu = figures.get("cpu_pct", {})
        load = " / ".join(
            f"{cpu.get(k, 0):.0f}"
            for k in ("operator", "kube-apiserver", "etcd", "bench", "others")
        )
        n = figures.get("operator", {}).get("count", 0)
        rows.append(f"{phase:<6} {n:4d}  {cells[0]}   {cells[1]}     {cells[2]}   {load}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, B0 once")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--profile", type=Path, help="py-spy the operator through each phase, into this directory"
    )
    args = parser.parse_args(argv)
    if args.profile and not PYSPY.exists():
        parser.error(f"--profile needs py-spy beside the interpreter ({PYSPY}): pip install py-spy")
    results = Results(args.json, None)
    results.data["id"] = "B8"
    started = time.monotonic()
    try:
        asyncio.run(Fairness(args, results).main())
    except (Exception, KeyboardInterrupt) as error:
        traceback.print_exc()
        results.fail(error)
    results.data["run_seconds"] = round(time.monotonic() - started, 1)
    results.save()
    print(f"\n{results.data['date']}, {results.data['machine']}")
    print(table(results.data))
    if "B8" in results.data:
        print(phase_table(results.data["B8"]))
        for phase, figures in (results.data["B8"].get("phases") or {}).items():
            if figures.get("profile"):
                print(f"\nprofile of the operator, {phase}:")
                print(render_summary(figures["profile"]))
    for failure in results.data.get("errors", []):
        print(f"FAILED in {failure['phase']}: {failure['exception']}", file=sys.stderr)
    return 1 if results.data.get("errors") else 0


if __name__ == "__main__":
    sys.exit(
        stop_cleanly(
            "bench/fairness.py",
            main,
            "its operators, kube-apiserver and etcd are stopped; the figures so far are saved",
        )
    )
