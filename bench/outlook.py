"""B13: Reservation creates with the outlook webhook (issue 32) against the same without.

In one run, on one local control plane, with one operator running throughout with
its webhook enabled (on loopback, registered by URL, the chart's configuration
otherwise: failurePolicy Ignore, timeoutSeconds 2), two variants alternate:

- **off**: no ValidatingWebhookConfiguration: a create is never reviewed;
- **on**: the configuration present: every create is reviewed, and answered
  ``allowed`` with the ledger's outlook as a warning.

Only the review differs: the same operator process serves the webhook in both. The
order is off, on, on, off, off, on, ... so that a machine getting busier or quieter
over the run favours neither. Each run measures

- **sequential**: N creates one after the other: each create's latency (p50, p99);
- **64 in flight**: M creates, 64 at a time: creates per second from the first
  create sent to the last answered, and each create's latency (p50, p99).

The headlines, from the medians of each variant's runs: on / off create throughput
at 64 in flight (target >= 0.7) and on - off sequential p50 (target <= +3 ms).

Also counted, per phase: the TCP connections the API server opened to the webhook,
i.e. the TLS handshakes the reviews cost (:class:`Connections`). And the CPU time
per create at 64 in flight of the operator, kube-apiserver, etcd and the machine
(the bench and anything else running on it included).

Checked, or the run fails: in an "on" run, every create's answer carries exactly one
outlook warning (its ``Warning`` header), and the operator's
``headroom_webhook_reviews_total{result="allowed"}`` grew by at least the creates;
in an "off" run, no create has a warning and that count did not move (a bench that
measured "off" twice is a defect); after every run, every reservation is Admitted.
Each run starts once a server-side dry-run create shows the configuration's state
(warning or none: the API server follows the configurations by a watch) and the
operator has let go of the last run's reservations, then 2 s more.

    python bench/outlook.py [--quick] [--rounds N] [--in-flight N] [--json PATH]

``--quick``: 100 sequential and 400 in flight, 2 runs of each variant (else 200 and
2,000, 4 runs of each); ``--rounds``: that many runs of each; ``--in-flight``: other
than 64 (24 keeps within the 25 connections the API server keeps open to a webhook,
so no review pays a handshake: what the handshakes cost).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from cluster import ROOT, RSV, Bench, body, bounded, ns_path, say, until
from kubernetes import client as k8s
from report import write_json

from headroom.api.outlook import Outlook, Verdict, parse_warning
from headroom.kube.client import Credentials, KubeClient
from headroom_dev.apply import install_crds
from headroom_dev.controlplane import ControlPlane, free_port
from headroom_dev.interrupts import stop_cleanly
from headroom_dev.nodes import create_node
from headroom_dev.operator import OperatorProcess
from headroom_dev.webhooks import OUTLOOK_PATH, outlook_configuration

JSON = dict[str, Any]
OFF, ON = "off", "on"
NODES = 20
NAMESPACE = "bench-outlook"
WEBHOOK = "headroom-bench-outlook"
IN_FLIGHT = 64
RAM_MB = 1
SETTLE_S = 2.0
REVIEWS = 'headroom_webhook_reviews_total{result="allowed"}'
TARGET_RATIO, TARGET_P50_MS = 0.7, 3.0
_WARNING = re.compile(r'^\d{3} \S+ "(?P<text>(?:[^"\\]|\\.)*)"')


def order(rounds: int) -> list[str]:
    """off, on, on, off, off, on, ...: ``rounds`` runs of each."""
    pairs = [(OFF, ON) if r % 2 == 0 else (ON, OFF) for r in range(rounds)]
    return [variant for pair in pairs for variant in pair]


def warnings_of(values: list[str]) -> list[str]:
    """The texts of ``Warning: 299 - "text"`` headers (RFC 7234, as the API server sends)."""
    texts = []
    for value in values:
        match = _WARNING.match(value)
        texts.append(re.sub(r"\\(.)", r"\1", match["text"]) if match else value)
    return texts


def percentiles(seconds: list[float]) -> JSON:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"p50_ms": statistics.median(ordered) * 1000, "p99_ms": p99 * 1000}


def peers(port: int) -> set[int]:
    """The client ports of the TCP connections to ``port`` on this machine now."""
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local = int(fields[1].rsplit(":", 1)[1], 16)
            remote = int(fields[2].rsplit(":", 1)[1], 16)
            if local == port and remote:  # the server's side (not the listening socket)
                found.add(remote)
            elif remote == port:  # the client's side
                found.add(local)
    return found


class Connections:
    """The TCP connections to ``port`` opened over a phase: those open at its end or
    closed during it, less those open at its start. Closed ones are heard of from the
    kernel as they go (``ss -E``, socket destroy events): they do not linger in
    TIME_WAIT here, both sides reset them."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.closed: set[int] = set()
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        match = f"( sport = :{self.port} or dport = :{self.port} )"
        try:
            self._process = await asyncio.create_subprocess_exec(
                "ss", "-E", "-tnH", match, stdout=asyncio.subprocess.PIPE
            )
        except FileNotFoundError:
            say("no ss (iproute2) on this machine: connections are not counted (-1)")
            return
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        async for raw in self._process.stdout:
            fields = raw.decode().split()
            if len(fields) < 5:
                continue
            local, peer = (int(f.rsplit(":", 1)[1]) for f in fields[3:5])
            self.closed.add(peer if local == self.port else local)

    async def mark(self) -> tuple[set[int], set[int]]:
        """What the phase's count starts from: open now, and closed so far."""
        await asyncio.sleep(0.2)  # the events of what closed before
        return peers(self.port), set(self.closed)

    async def opened(self, since: tuple[set[int], set[int]]) -> int:
        """How many were opened since ``since`` (a :meth:`mark`); -1: not counted."""
        if self._process is None:
            return -1
        await asyncio.sleep(0.2)  # the events of what closed last
        open_then, closed_then = since
        return len((peers(self.port) | (self.closed - closed_then)) - open_then)

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            await self._process.wait()
        if self._reader is not None:
            self._reader.cancel()


class Creator:
    """Creates Reservations on a session of its own (64 connections to the API server),
    timing each and keeping the warnings of its answer."""

    def __init__(self, credentials: Credentials, in_flight: int) -> None:
        self.in_flight = in_flight
        self.session = aiohttp.ClientSession(
            base_url=credentials.server.rstrip("/") + "/",
            connector=aiohttp.TCPConnector(ssl=credentials.ssl_context(), limit=in_flight),
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def create(self, item: JSON, *, dry_run: bool = False) -> tuple[float, list[str]]:
        """Seconds the create took, and the warnings it was answered with."""
        url = ns_path(NAMESPACE).lstrip("/") + ("?dryRun=All" if dry_run else "")
        started = time.perf_counter()
        async with self.session.post(url, json=item) as response:
            text = await response.text()
            took = time.perf_counter() - started
            if response.status >= 300:
                raise RuntimeError(f"create {item['metadata']['name']}: {response.status} {text}")
            return took, warnings_of(response.headers.getall("Warning", []))

    async def close(self) -> None:
        await self.session.close()


class OutlookBench:
    def __init__(
        self,
        bench: Bench,
        client: KubeClient,
        creator: Creator,
        operator: OperatorProcess,
        port: int,
        sizes: tuple[int, int],
    ) -> None:
        self.bench, self.client, self.creator, self.operator = bench, client, creator, operator
        self.port = port
        self.sequential, self.concurrent = sizes
        self.admission = k8s.AdmissionregistrationV1Api(bench.api)
        self.ca_bundle: str | None = None  # once the operator has published it
        self.runs = 0
        self.connections = Connections(port)
        children = {
            "operator": operator.popen,
            "kube-apiserver": bench.plane.apiserver.popen,
            "etcd": bench.plane.etcd.popen,
        }
        self.processes = {n: psutil.Process(p.pid) for n, p in children.items() if p is not None}

    # -- the configuration -----------------------------------------------------------------

    def configuration(self) -> JSON:
        url = f"https://127.0.0.1:{self.port}{OUTLOOK_PATH}"
        return outlook_configuration(WEBHOOK, url, ca_bundle=self.ca_bundle)

    async def switch(self, variant: str) -> None:
        """Make the configuration present (on) or absent (off); return once a dry-run
        create shows it (an outlook, or no warning)."""
        present = self.present()
        if variant == ON and not present:
            self.admission.create_validating_webhook_configuration(self.configuration())
        elif variant == OFF and present:
            self.admission.delete_validating_webhook_configuration(WEBHOOK)

        async def shown() -> tuple[bool, str]:
            item = body("probe", self.bench.nodes[0], RAM_MB)
            _, said = await self.creator.create(item, dry_run=True)
            outlooks = [o for o in map(parse_warning, said) if o is not None]
            if variant == ON:
                done = len(outlooks) == 1 and outlooks[0].verdict is Verdict.ADMITTED
            else:
                done = not said
            return done, f"a dry run was answered with {said or 'no warning'}"

        await until(f"webhook {variant}", shown, within=60, period=0.1, operator=self.operator)
        if variant == ON and self.ca_bundle is None:
            # Published by the operator (it keeps the caBundle of the configuration its
            # webhook.certificate.webhookConfiguration names); given at every later create.
            read = self.admission.read_validating_webhook_configuration(WEBHOOK)
            self.ca_bundle = read.webhooks[0].client_config.ca_bundle

    def present(self) -> bool:
        names = self.admission.list_validating_webhook_configuration().items
        return any(c.metadata.name == WEBHOOK for c in names)

    # -- one run ---------------------------------------------------------------------------

    async def run(self, variant: str, sizes: tuple[int, int] | None = None) -> JSON:
        """One run of ``variant`` (``sizes``: other than the bench's): its figures, checked."""
        self.runs += 1
        sequential, concurrent = sizes or (self.sequential, self.concurrent)
        await self.switch(variant)
        await self.settle()
        reviews = await self.reviews()
        prefix = f"r{self.runs}-"
        figures: JSON = {}
        said: list[list[str]] = []

        since = await self.connections.mark()
        latencies: list[float] = []
        for i in range(sequential):
            item = body(f"{prefix}s{i:05d}", self.bench.nodes[i % NODES], RAM_MB)
            took, warnings = await self.creator.create(item)
            latencies.append(took)
            said.append(warnings)
        figures["sequential"] = percentiles(latencies)
        figures["sequential"]["connections"] = await self.connections.opened(since)
        await self.decided(sequential)

        since = await self.connections.mark()
        latencies = []

        async def one(i: int) -> None:
            item = body(f"{prefix}c{i:05d}", self.bench.nodes[i % NODES], RAM_MB)
            took, warnings = await self.creator.create(item)
            latencies.append(took)
            said.append(warnings)

        cpu = self.cpu()
        start = time.monotonic()
        await bounded([one(i) for i in range(concurrent)], self.creator.in_flight)
        seconds = time.monotonic() - start
        used = {name: (s - cpu[name]) * 1000 / concurrent for name, s in self.cpu().items()}
        figures["concurrent"] = {
            "creates_per_s": concurrent / seconds,
            **percentiles(latencies),
            "connections": await self.connections.opened(since),
            "cpu_ms_per_create": {name: round(ms, 3) for name, ms in used.items()},
        }
        total = sequential + concurrent
        await self.decided(total)
        reviewed = await self.reviews() - reviews
        figures["reviews"] = reviewed
        figures["no_outlook"] = self.check(variant, said, reviewed, total)
        await self.all_admitted(total)
        count, took_s = await self.bench.clean(self.client, None)
        say(f"clean-up after run {self.runs} ({variant}): {count:,} gone in {took_s:.1f} s")
        return figures

    def cpu(self) -> dict[str, float]:
        """CPU seconds (user + system) so far of each process, and of the machine."""
        used = {name: sum(p.cpu_times()[:2]) for name, p in self.processes.items()}
        times = psutil.cpu_times()
        used["machine"] = times.user + times.system + times.nice + times.irq + times.softirq
        return used

    def check(self, variant: str, said: list[list[str]], reviewed: float, total: int) -> int:
        """Fail the run unless every create was reviewed (on) or none was (off); return how
        many outlooks said there was none (the ledger did not answer in time)."""
        outlooks = [[o for o in map(parse_warning, s) if o is not None] for s in said]
        if variant == OFF:
            warned = sum(1 for s in said if s)
            if warned or reviewed:
                raise AssertionError(
                    f"off: {warned} of {total} creates had warnings, the webhook answered "
                    f"{reviewed:.0f} reviews; among them: {[s for s in said if s][:3]}"
                )
            return 0
        single = sum(1 for o in outlooks if len(o) == 1)
        if single != total or reviewed < total:
            odd = [s for s, o in zip(said, outlooks, strict=True) if len(o) != 1]
            raise AssertionError(
                f"on: {single} of {total} creates had one outlook, the webhook answered "
                f"{reviewed:.0f} reviews; among the others: {odd[:3]}"
            )
        unknown: list[Outlook] = [o[0] for o in outlooks if o[0].verdict is not Verdict.ADMITTED]
        if any(o.verdict is not Verdict.UNKNOWN for o in unknown):
            raise AssertionError(f"on: outlooks other than Admitted: {unknown[:3]}")
        return len(unknown)

    async def reviews(self) -> float:
        value = await Bench.metric(self.operator, REVIEWS, -1)
        if value < 0:
            raise RuntimeError("the operator did not answer a scrape of its metrics")
        return value

    async def settle(self) -> None:
        """Start every run from the same quiet: no entry held, no Event queued, then 2 s."""

        async def quiet() -> tuple[bool, str]:
            active = await Bench.metric(self.operator, "headroom_active_entries", -1)
            events = await Bench.metric(self.operator, "headroom_events_queued", -1)
            return (active, events) == (0, 0), f"{active:,.0f} entries, {events:,.0f} Events"

        await until("operator: quiet", quiet, within=120, period=0.2, operator=self.operator)
        await asyncio.sleep(SETTLE_S)

    async def decided(self, count: int) -> float:
        async def check() -> tuple[bool, str]:
            items, _ = await self.client.list_all(RSV)
            done = sum(1 for i in items if (i.get("status") or {}).get("phase"))
            return done >= count, f"{done:,} of {count:,} decided"

        return await until("decisions", check, within=600, period=0.05, operator=self.operator)

    async def all_admitted(self, count: int) -> None:
        items, _ = await self.client.list_all(RSV)
        refused = [
            i.get("status") for i in items if (i.get("status") or {}).get("phase") != "Admitted"
        ]
        if len(items) != count or refused:
            raise AssertionError(
                f"{len(items):,} reservations of {count:,}, {len(refused):,} not Admitted; "
                f"among them: {refused[:3]}"
            )


async def run(args: argparse.Namespace, result: JSON) -> None:
    sizes = (100, 400) if args.quick else (200, 2000)
    rounds = args.rounds or (2 if args.quick else 4)
    result.update(
        sequential=sizes[0],
        concurrent=sizes[1],
        in_flight=args.in_flight,
        nodes=NODES,
        order=order(rounds),
        load_before=os.getloadavg(),
    )
    workdir = Path(tempfile.mkdtemp(prefix="headroom-bench-outlook-"))
    with ControlPlane() as plane:
        bench = Bench(plane, workdir, args.quick)
        install_crds(bench.api, sorted((ROOT / "crds").glob("*.yaml")))
        client = KubeClient(bench.credentials, connections=16)
        creator = Creator(bench.credentials, args.in_flight)
        core = k8s.CoreV1Api(bench.api)
        ob: OutlookBench | None = None
        try:
            bench.nodes = [f"bench-node-{i:02d}" for i in range(NODES)]
            for node in bench.nodes:
                create_node(core, node, memory="1Ti")
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            port = free_port()
            webhook = {
                "enabled": True,
                "host": "127.0.0.1",
                "port": port,
                "certificate": {
                    "namespace": "default",
                    "extraNames": ["127.0.0.1"],
                    "webhookConfiguration": WEBHOOK,
                    "checkPeriod": "1s",
                },
            }
            config = {"limits": {"maxEntriesPerNode": 100_000}, "webhook": webhook}
            operator = bench.operator(config).start()
            ob = OutlookBench(bench, client, creator, operator, port, sizes)
            await ob.connections.start()
            for variant in (ON, OFF):  # the first requests of each kind are slow
                warmed = await ob.run(variant, (50, 200))
                say(f"warm-up ({variant}): {warmed}")
            for variant in result["order"]:
                figures = await ob.run(variant)
                result.setdefault(variant, {}).setdefault("runs", []).append(figures)
                summarize(result)
                say(f"B13 {variant} run {len(result[variant]['runs'])}: {figures}")
                save(args, result)
            result["load_after"] = os.getloadavg()
            operator.stop()
        finally:
            if ob is not None:
                await ob.connections.stop()
            bench.stop_operators()
            await creator.close()
            await client.close()
    result["complete"] = True


FIGURES = (
    ("sequential", "p50_ms"),
    ("sequential", "p99_ms"),
    ("concurrent", "creates_per_s"),
    ("concurrent", "p50_ms"),
    ("concurrent", "p99_ms"),
    ("sequential", "connections"),
    ("concurrent", "connections"),
)


def summarize(result: JSON) -> None:
    """Each variant's medians over its runs; the headlines, once both have runs."""
    for variant in (OFF, ON):
        if variant in result:
            runs = result[variant]["runs"]
            medians = result[variant]["median"] = {}
            for phase, key in FIGURES:
                medians[f"{phase}_{key}"] = statistics.median(r[phase][key] for r in runs)
            medians["reviews_per_run"] = statistics.median(r["reviews"] for r in runs)
            medians["cpu_ms_per_create"] = {
                name: statistics.median(r["concurrent"]["cpu_ms_per_create"][name] for r in runs)
                for name in runs[0]["concurrent"]["cpu_ms_per_create"]
            }
            result[variant]["no_outlook"] = sum(r["no_outlook"] for r in runs)
    if OFF in result and ON in result:
        off, on = result[OFF]["median"], result[ON]["median"]
        rate = "concurrent_creates_per_s"
        result["throughput_ratio"] = on[rate] / off[rate]
        result["sequential_p50_added_ms"] = on["sequential_p50_ms"] - off["sequential_p50_ms"]
        # Each "on" run against the "off" run beside it in the order.
        pairs = zip(result[OFF]["runs"], result[ON]["runs"], strict=False)
        result["pair_ratios"] = [
            round(n["concurrent"]["creates_per_s"] / f["concurrent"]["creates_per_s"], 3)
            for f, n in pairs
        ]
        result["targets_met"] = (
            result["throughput_ratio"] >= TARGET_RATIO
            and result["sequential_p50_added_ms"] <= TARGET_P50_MS
        )


def save(args: argparse.Namespace, result: JSON) -> None:
    if args.json:
        write_json(args.json, result)


def table(result: JSON) -> str:
    rows = []
    n, m = result.get("sequential", 0), result.get("concurrent", 0)
    in_flight = result.get("in_flight", IN_FLIGHT)
    for variant in (OFF, ON):
        if variant not in result:
            continue
        f = result[variant]["median"]
        runs = result[variant]["runs"]
        rates = [r["concurrent"]["creates_per_s"] for r in runs]
        rows.append(
            (
                variant,
                f"{n} sequential: p50 {f['sequential_p50_ms']:.1f} ms, p99 "
                f"{f['sequential_p99_ms']:.1f} ms; {m:,} at {in_flight} in flight: "
                f"{f['concurrent_creates_per_s']:,.0f}/s (min {min(rates):,.0f}, max "
                f"{max(rates):,.0f}), p50 {f['concurrent_p50_ms']:.1f} ms, p99 "
                f"{f['concurrent_p99_ms']:.1f} ms; webhook connections opened "
                f"{f['sequential_connections']:.0f} + {f['concurrent_connections']:.0f}",
            )
        )
        cpu = ", ".join(f"{k} {v:.2f}" for k, v in f["cpu_ms_per_create"].items())
        rows.append((variant, f"CPU ms per create at {in_flight} in flight: {cpu}"))
    if "throughput_ratio" in result:
        pairs = ", ".join(f"{r:.2f}" for r in result["pair_ratios"])
        rows.append(
            (
                "on/off",
                f"throughput {result['throughput_ratio']:.2f} (pairs: {pairs}; target >= "
                f"{TARGET_RATIO}), sequential p50 {result['sequential_p50_added_ms']:+.1f} ms "
                f"(target <= +{TARGET_P50_MS:.0f}): targets "
                f"{'met' if result['targets_met'] else 'NOT met'}",
            )
        )
    if ON in result and result[ON]["no_outlook"]:
        rows.append((ON, f"{result[ON]['no_outlook']} creates answered without an outlook"))
    if not rows:
        return "(no figures)"
    return "\n".join(f"B13 {variant:<6}  {what}" for variant, what in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="100 sequential, 400 in flight, 2 runs of each"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="runs of each variant (default 4, quick 2)"
    )
    parser.add_argument(
        "--in-flight", type=int, default=IN_FLIGHT, help="creates in flight (default 64)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result: JSON = {
        "id": "B13",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{psutil.cpu_count()} cores",
        "complete": False,
    }
    failed = False
    try:
        asyncio.run(run(args, result))
    except (Exception, KeyboardInterrupt) as error:
        traceback.print_exc()
        result.setdefault("errors", []).append(
            {
                "exception": f"{type(error).__name__}: {error}",
                "traceback": "".join(traceback.format_exception(error)),
            }
        )
        failed = True
    save(args, result)
    print(f"\n{result['date']}, {result['machine']}, load {result.get('load_before')}")
    print(table(result))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(
        stop_cleanly("bench/outlook.py", main, "its operator, kube-apiserver and etcd are stopped")
    )
