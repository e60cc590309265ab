"""B0–B4, B6 and B7: the operator measured on the local real control plane.

Every throughput figure is paired with B0, the API server's own ceiling measured
in the same run (a bare async client creating Reservations and patching their
status, no operator), and the ratio is the headline: the machine is shared and
noisy, ratios are comparable across runs, absolute rates are not.

    python bench/cluster.py [--quick] [--json PATH] [--only b1,b2,b3,b4,b7,b6]
                            [--b3-reservations N] [--b6-nodes N] [--b6-reservations N]
                            [--fail-after b0|b1|b2|b3|b4|b7]

B0 always runs (every ratio needs it); ``--only`` picks the others (``--only-b6``
and ``--skip-b6`` are shorthands). ``--b3-reservations`` sizes B3 (10,000, quick
2,000; plus the one new reservation): half admitted, half an undecided backlog on
19 of the 20 nodes, a restart, then the first new decision on the 20th node, which
has no backlog (issue 22's definition, target <= 2 s), and the backlog's drain rate
as a ratio to B0. B7: 1,000 reservations (quick: 200) queued
with ``spec.wait`` on 10 full nodes, then every node's holder released at once:
admissions per second until all are Admitted, as a ratio to B0.

Nothing measured is lost to a later failure: as soon as a figure is measured its
benchmark's row is printed and the ``--json`` file is rewritten atomically with
everything so far (``"complete": true`` once the run reached its end). If a phase
raises, the run prints the traceback, adds ``"errors": [{"phase", "exception",
"traceback"}]`` to the JSON, prints the table of what it has and exits 1; it does
not go on to later phases, whose figures would be taken on a cluster left in an
unknown state. ``--fail-after ID`` tests that path: the run raises as the first
step after benchmark ID's last figure was saved (``b3``: in the clean-up after B3).

Clean-ups (after each B0, B1 and B2 run, after B3 and after B4) delete object by
object and return only when nothing is left, whatever it takes; see
:meth:`Bench.clean` for why that way and for the bound after which one fails.
Every wait prints where it stands every 10 s, and fails with what it saw after a
bound, or as soon as the operator it waits for has exited: nothing waits forever
in silence. One request that meets a timeout or a dropped connection is tried
again (:func:`persist`) instead of ending a run of tens of thousands of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from cpu import Cpu
from report import line, table, write_json

from headroom.kube.client import Credentials, KubeClient
from headroom.kube.transport import ApiError, ApiUnavailableError, resource_path
from headroom_dev.apply import api_client, install_crds
from headroom_dev.controlplane import ControlPlane
from headroom_dev.interrupts import stop_cleanly
from headroom_dev.nodes import create_node
from headroom_dev.operator import OperatorProcess

ROOT = Path(__file__).resolve().parents[1]
RSV = resource_path("headroom.dev", "v1alpha1", "reservations")
JSON = dict[str, Any]
PHASES = ("b1", "b2", "b3", "b4", "b7", "b6")
B7_NODE_LIMIT_MB = 9216  # each B7 node: 10 GiB, less the 1 GiB system reserve

PROGRESS_S = 10.0  # a waiting loop or a clean-up says where it stands this often
ATTEMPTS = 5  # tries of one request that fails transiently (1, 2, 4, 8 s apart)
CLEAN_PAGE = 500  # names listed per pass of a clean-up
CLEAN_IN_FLIGHT = 16  # DELETEs in flight during a clean-up
CLEAN_BOUND_BASE_S = 60.0  # a clean-up fails after this
CLEAN_BOUND_PER_OBJECT_S = 0.1  # ... plus this per reservation it found (i.e. below 10/s)

_T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - _T0:6.0f} s] {text}", flush=True)


def ns_path(namespace: str, name: str | None = None, sub: str = "") -> str:
    path = resource_path("headroom.dev", "v1alpha1", "reservations", namespace, name)
    return f"{path}/{sub}" if sub else path


def body(name: str, node: str, ram: int, vram: int = 0) -> JSON:
    spec: JSON = {"node": node, "ramMB": ram}
    if vram:
        spec["vramMB"] = vram
    return {
        "apiVersion": "headroom.dev/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name},
        "spec": spec,
    }


async def bounded(coroutines: list[Any], limit: int) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(coroutine: Any) -> Any:
        async with gate:
            return await coroutine

    return await asyncio.gather(*(one(c) for c in coroutines))


def transient(error: BaseException) -> bool:
    """A failure that says nothing about the request: a client timeout, a dropped
    connection, 429 or 5xx. Worth another try."""
    if isinstance(error, ApiError):
        return error.status == 429 or error.status >= 500
    return isinstance(error, TimeoutError | aiohttp.ClientError | ApiUnavailableError)


async def persist(call: Callable[[], Awaitable[JSON]], what: str, *, landed: int = 0) -> JSON:
    """``call()``, tried again after a transient failure (up to 5 tries), with a line
    saying so. ``landed``: the status that, on a later try, means an earlier try
    that timed out did take effect (409 for a create); the answer is then ``{}``."""
    delay = 1.0
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await call()
        except Exception as error:
            if attempt > 1 and isinstance(error, ApiError) and error.status == landed:
                return {}
            if not transient(error) or attempt == ATTEMPTS:
                raise
            say(f"{what}: {error!r}; try {attempt + 1} of {ATTEMPTS} in {delay:.0f} s")
        await asyncio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def every(seconds: float, message: Callable[[], str]) -> AsyncIterator[None]:
    """Print ``message()`` every ``seconds`` while the body runs."""

    async def tick() -> None:
        while True:
            await asyncio.sleep(seconds)
            say(message())

    task = asyncio.create_task(tick())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def check_alive(operator: OperatorProcess | None) -> None:
    if operator is not None and operator.popen is not None and operator.popen.poll() is not None:
        raise RuntimeError(
            f"the operator exited ({operator.popen.returncode}); its log ends:\n{operator.tail()}"
        )


async def until(
    what: str,
    check: Callable[[], Awaitable[tuple[bool, str]]],
    *,
    within: float,
    period: float,
    operator: OperatorProcess | None = None,
) -> float:
    """Await ``check()`` every ``period`` s until it answers ``(True, _)``; return
    ``time.monotonic()`` right after that answer, as the loops this replaces did.

    Its second value says where things stand: printed every 10 s and in the error
    raised after ``within`` s, or as soon as ``operator`` has exited. A check that
    fails transiently counts as "not yet".
    """
    start = time.monotonic()
    detail = "not checked yet"
    async with every(PROGRESS_S, lambda: f"{what}: {detail} ({time.monotonic() - start:.0f} s)"):
        while True:
            try:
                done, detail = await check()
            except Exception as error:
                if not transient(error):
                    raise
                done, detail = False, f"{detail}; last check failed: {error!r}"
            if done:
                return time.monotonic()
            check_alive(operator)
            if time.monotonic() - start > within:
                raise TimeoutError(f"{what}: not done after {within:.0f} s: {detail}")
            await asyncio.sleep(period)


class PhaseWatch:
    """A plain WATCH of Reservations (not the operator's): when each name was first seen
    (its ADDED event) and when it was first seen with a ``status.phase``, on the
    bench's monotonic clock.

    ``path``: one namespace's reservations or every namespace's. It runs on a client
    of its own (its own connection), so that the load a benchmark puts on its main
    client's pool does not delay the events. A watch the server ends is resumed from
    the last version seen; one that cannot be resumed (410) raises in :meth:`stop`
    and in the waits.
    """

    def __init__(self, credentials: Credentials, path: str, version: str) -> None:
        self.path, self.version = path, version
        self.client = KubeClient(credentials, connections=2)
        self.added: dict[str, float] = {}
        self.decided: dict[str, float] = {}
        self.phases: dict[str, str] = {}  # the first phase seen
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    @classmethod
    async def start(cls, credentials: Credentials, client: KubeClient, path: str) -> PhaseWatch:
        """A watch from now: from the version of a LIST of ``path`` (one item)."""
        page = await persist(lambda: client.request("GET", path, params={"limit": 1}), "list")
        return cls(credentials, path, (page.get("metadata") or {})["resourceVersion"])

    async def _run(self) -> None:
        while True:
            try:
                async for event in self.client.watch(self.path, resource_version=self.version):
                    self._event(event, time.monotonic())
            except ApiUnavailableError:
                await asyncio.sleep(0.1)  # resumed from self.version

    def _event(self, event: JSON, now: float) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        meta = obj.get("metadata") or {}
        if kind == "ERROR":
            raise RuntimeError(f"watch of {self.path}: {obj.get('message', obj)}")
        self.version = meta.get("resourceVersion") or self.version
        if kind not in ("ADDED", "MODIFIED"):
            return
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        self.added.setdefault(name, now)
        phase = (obj.get("status") or {}).get("phase")
        if phase:
            self.decided.setdefault(name, now)
            self.phases.setdefault(name, phase)
        self._changed.set()

    async def wait(self, done: Callable[[], bool], what: str, within: float) -> float:
        """Until ``done()`` (checked at each event); ``time.monotonic()`` then."""
        deadline = time.monotonic() + within
        while not done():
            if self._task.done():
                self._task.result()  # raises what ended the watch
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what}: not done after {within:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
        return time.monotonic()

    def count(self, prefix: str) -> int:
        """How many names starting with ``prefix`` ("namespace/name") have a phase."""
        return sum(1 for name in self.decided if name.startswith(prefix))

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.client.close()


class Results:
    """What has been measured so far, printed and saved as each figure comes in."""

    def __init__(self, path: Path | None, fail_after: str | None) -> None:
        self.path = path
        self.data: JSON = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{psutil.cpu_count()} cores",
            "complete": False,
        }
        self.phase = "start"
        self.finished: set[str] = set()
        self.fail_after = fail_after.upper() if fail_after else None

    def begin(self, phase: str) -> None:
        """Name what runs now (an error names it); ``--fail-after`` raises here."""
        self.phase = phase
        if self.fail_after in self.finished:
            raise RuntimeError(f"simulated failure (--fail-after {self.fail_after.lower()})")

    def figure(self, bid: str, **figures: Any) -> None:
        self.data.setdefault(bid, {}).update(figures)
        say(line(self.data, bid))
        self.save()

    def repeat(self, bid: str, key: str, value: float) -> None:
        """Append one run's ``value`` to ``bid``'s ``key``; a throughput other than B0
        is also given its median's ratio to B0's."""
        figures = self.data.setdefault(bid, {})
        figures.setdefault(key, []).append(value)
        if bid != "B0":
            b0 = self.data["B0"]["creates_patches_per_s"]
            figures["ratio_to_B0"] = statistics.median(figures[key]) / statistics.median(b0)
        self.figure(bid)

    def finish(self, bid: str) -> None:
        self.finished.add(bid)

    def cleanup(self, after: str, count: int, seconds: float) -> None:
        self.data.setdefault("cleanups", []).append(
            {"after": after, "reservations": count, "seconds": round(seconds, 2)}
        )
        say(f"clean-up after {after}: {count:,} reservations gone in {seconds:.1f} s")
        self.save()

    def fail(self, error: BaseException) -> None:
        self.data.setdefault("errors", []).append(
            {
                "phase": self.phase,
                "exception": f"{type(error).__name__}: {error}",
                "traceback": "".join(traceback.format_exception(error)),
            }
        )
        self.save()

    def complete(self) -> None:
        self.data["complete"] = True
        self.save()

    def save(self) -> None:
        if self.path is not None:
            write_json(self.path, self.data)


class Bench:
    def __init__(self, plane: ControlPlane, workdir: Path, quick: bool) -> None:
        self.plane, self.workdir, self.quick = plane, workdir, quick
        self.credentials = Credentials(
            server=plane.url,
            ca_file=str(plane.pki / "ca.crt"),
            cert_file=str(plane.pki / "admin.crt"),
            key_file=str(plane.pki / "admin.key"),
        )
        self.api = api_client(plane.kubeconfig)
        self.nodes: list[str] = []
        self.namespaces = 0
        self.operators: list[OperatorProcess] = []

    async def namespace(self, client: KubeClient) -> str:
        self.namespaces += 1
        name = f"bench-{self.namespaces}"
        body = {"metadata": {"name": name}}
        await persist(lambda: client.create("/api/v1/namespaces", body), name, landed=409)
        return name

    def operator(self, config: dict[str, Any] | None = None) -> OperatorProcess:
        workdir = Path(tempfile.mkdtemp(dir=self.workdir))
        operator = OperatorProcess(self.plane.kubeconfig, workdir, config)
        self.operators.append(operator)
        return operator

    def stop_operators(self) -> None:
        """Stop every operator still running (a failed phase may leave one)."""
        for operator in self.operators:
            operator.stop()

    async def create_many(
        self,
        client: KubeClient,
        namespace: str,
        count: int,
        ram: int,
        concurrency: int = 64,
        prefix: str = "r",
        vram: int = 0,
    ) -> list[float]:
        started: list[float] = [0.0] * count
        created = 0

        async def one(i: int) -> None:
            nonlocal created
            started[i] = time.monotonic()
            name = f"{prefix}{i:05d}"
            rsv = body(name, self.nodes[i % len(self.nodes)], ram, vram)
            await persist(lambda: client.create(ns_path(namespace), rsv), name, landed=409)
            created += 1

        async with every(PROGRESS_S, lambda: f"{namespace}: {created:,} of {count:,} created"):
            await bounded([one(i) for i in range(count)], concurrency)
        return started

    async def wait_decided(
        self,
        client: KubeClient,
        namespace: str,
        count: int,
        operator: OperatorProcess | None = None,
        within: float = 600,
    ) -> float:
        async def check() -> tuple[bool, str]:
            items, _ = await client.list_all(ns_path(namespace))
            decided = sum(1 for i in items if (i.get("status") or {}).get("phase"))
            return decided >= count, f"{decided:,} of {count:,} decided"

        return await until(
            f"{namespace}: decisions", check, within=within, period=0.05, operator=operator
        )

    async def count(self, client: KubeClient, path: str) -> int:
        """How many objects ``path`` lists, from one LIST of one item."""
        page = await persist(lambda: client.request("GET", path, params={"limit": 1}), "count")
        meta = page.get("metadata") or {}
        return len(page.get("items") or []) + int(meta.get("remainingItemCount") or 0)

    async def clean(self, client: KubeClient, namespace: str | None) -> tuple[int, float]:
        """Delete every Reservation (of ``namespace``, else of the cluster); return only
        when none is left: ``(how many there were, seconds it took)``.

        How: LIST the first 500, DELETE each with 16 in flight, again until the LIST is
        empty. Not one DELETE of the collection, as before: the API server deletes a
        collection one object at a time (``--delete-collection-workers=1``), and it
        stops when the client goes away (the request's context ends), so a client
        timeout cannot be read as "started": measured, a collection DELETE of 5,000
        cut by the client at 3 s left 2,964 behind for good. Measured for 10,001 on
        this shared 2-core machine: one DELETE of the collection 16–22 s (more than
        30 s on a busy machine, hence issue 11); ``DELETE ?limit=500`` repeated
        12–16 s; per object with 8 in flight 19 s, 16 in flight 10–15 s, 32 11 s,
        64 17 s. Per object also keeps every request short and independent: one that
        times out or fails is tried again on the next pass, and whatever was deleted
        stays deleted.

        A line every 10 s says how far it got. Bound: 60 s + 0.1 s per reservation
        found at the start (10,001: 17.7 min; 2,000: 4.3 min), i.e. it fails only
        below 10 deletions/s on average, 50–100 times slower than measured; it then
        raises, naming how many are left and a few of them.
        """
        path = ns_path(namespace) if namespace else RSV
        start = time.monotonic()
        total = await self.count(client, path)
        bound = CLEAN_BOUND_BASE_S + CLEAN_BOUND_PER_OBJECT_S * total
        left, names = total, ""
        where = namespace or "all namespaces"

        async def delete(item: JSON) -> bool:
            meta = item["metadata"]
            try:
                await client.request("DELETE", ns_path(meta["namespace"], meta["name"]))
            except ApiError as error:
                if error.not_found:
                    return True
                if not transient(error):
                    raise
                return False
            except (TimeoutError, aiohttp.ClientError, ApiUnavailableError):
                return False  # listed again on the next pass
            return True

        def progress() -> str:
            return f"clean-up of {where}: {total - left:,} of {total:,} gone, {left:,} left"

        bounded_by = asyncio.timeout(bound)
        try:
            async with bounded_by, every(PROGRESS_S, progress):
                while True:
                    try:
                        page = await client.request("GET", path, params={"limit": CLEAN_PAGE})
                    except Exception as error:
                        if not transient(error):
                            raise
                        await asyncio.sleep(1)
                        continue
                    items = page.get("items") or []
                    remaining = int((page.get("metadata") or {}).get("remainingItemCount") or 0)
                    left = len(items) + remaining
                    names = ", ".join(
                        f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in items[:5]
                    )
                    if not items:
                        break
                    done = await bounded([delete(i) for i in items], CLEAN_IN_FLIGHT)
                    going = all(i["metadata"].get("deletionTimestamp") for i in items)
                    if not any(done) or going:
                        # Every DELETE refused, or every object already on its way out
                        # (a finalizer): let the API server breathe before the next pass.
                        await asyncio.sleep(1)
        except TimeoutError as error:
            if not bounded_by.expired():
                raise
            raise TimeoutError(
                f"clean-up of {where}: {left:,} of {total:,} reservations still there after "
                f"{bound:.0f} s (the bound for {total:,}); among them: {names}"
            ) from error
        return total, time.monotonic() - start

    # -- B0 ------------------------------------------------------------------------------

    async def b0_ceiling(self, client: KubeClient, namespace: str, count: int) -> float:
        status = {"status": {"phase": "Admitted", "reason": "Fits", "message": "bench"}}

        async def one(i: int) -> None:
            name = f"b0-{i:05d}"
            rsv = body(name, self.nodes[i % len(self.nodes)], 1)
            await persist(lambda: client.create(ns_path(namespace), rsv), name, landed=409)
            path = ns_path(namespace, name, "status")
            await persist(lambda: client.merge_patch(path, status), name)

        start = time.monotonic()
        await bounded([one(i) for i in range(count)], 64)
        return count / (time.monotonic() - start)

    # -- B1 ------------------------------------------------------------------------------

    async def b1_throughput(
        self, client: KubeClient, namespace: str, count: int, operator: OperatorProcess
    ) -> float:
        start = time.monotonic()
        await self.create_many(client, namespace, count, 1)
        end = await self.wait_decided(client, namespace, count, operator)
        return count / (end - start)

    # -- B4 ------------------------------------------------------------------------------

    async def b4_reclaim(self, client: KubeClient, count: int) -> dict[str, float]:
        """``count`` reservations created together, never heartbeated: all go stale at
        once; seconds from their stale deadline until every one is Reclaimed."""
        window, sweep = 10.0, 10.0
        operator = self.operator(
            {
                "limits": {"maxEntriesPerNode": 100_000, "heartbeatStaleWindow": f"{window:.0f}s"},
                "sweepPeriod": f"{sweep:.0f}s",
                "reclaimedRetention": "1h",
            }
        ).start()
        namespace = await self.namespace(client)
        await self.create_many(client, namespace, count, 1, prefix="s")
        await self.wait_decided(client, namespace, count, operator)
        items, _ = await client.list_all(ns_path(namespace))
        last_created = max(
            time.monotonic()
            - (
                datetime.now(UTC)
                - datetime.fromisoformat(i["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
            ).total_seconds()
            for i in items
        )
        deadline = last_created + window

        async def reclaimed() -> tuple[bool, str]:
            items, _ = await client.list_all(ns_path(namespace))
            done = sum(1 for i in items if (i.get("status") or {}).get("phase") == "Reclaimed")
            return done == len(items), f"{done:,} of {len(items):,} Reclaimed"

        done = await until(
            "B4: reclaim",
            reclaimed,
            within=window + sweep + 600,
            period=0.1,
            operator=operator,
        )
        operator.stop()
        return {"reservations": count, "after_deadline_s": done - deadline, "sweep_period_s": sweep}

    # -- B7 ------------------------------------------------------------------------------

    async def b7_queue(self, client: KubeClient, nodes: list[str], count: int) -> float:
        """``count`` reservations queued on full ``nodes``, then every holder released at
        once: admissions per second from the release until every queued one is Admitted
        (the nodes have room for all of them once the holders are gone)."""
        operator = self.operator(
            {"limits": {"maxEntriesPerNode": 100_000}, "reclaimedRetention": "1h"}
        ).start()
        namespace = await self.namespace(client)
        for node in nodes:  # each node full
            holder = body(f"hold-{node}", node, B7_NODE_LIMIT_MB)
            await persist(lambda h=holder: client.create(ns_path(namespace), h), node, landed=409)
        await self.wait_decided(client, namespace, len(nodes), operator)
        each = B7_NODE_LIMIT_MB // (count // len(nodes) + 1)
        queued = 0

        async def one(i: int) -> None:
            nonlocal queued
            name = f"q{i:05d}"
            rsv = body(name, nodes[i % len(nodes)], each)
            rsv["spec"]["wait"] = "1h"
            await persist(lambda: client.create(ns_path(namespace), rsv), name, landed=409)
            queued += 1

        async with every(PROGRESS_S, lambda: f"B7: {queued:,} of {count:,} queued"):
            await bounded([one(i) for i in range(count)], 64)

        async def all_queued() -> tuple[bool, str]:
            items, _ = await client.list_all(ns_path(namespace))
            waiting = sum(1 for i in items if (i.get("status") or {}).get("phase") == "Queued")
            return waiting == count, f"{waiting:,} of {count:,} Queued"

        await until("B7: queue", all_queued, within=600, period=0.2, operator=operator)
        start = time.monotonic()
        await bounded(
            [client.delete(ns_path(namespace, f"hold-{node}")) for node in nodes], len(nodes)
        )

        async def all_admitted() -> tuple[bool, str]:
            items, _ = await client.list_all(ns_path(namespace))
            done = sum(1 for i in items if (i.get("status") or {}).get("phase") == "Admitted")
            return done == count, f"{done:,} of {count:,} Admitted"

        end = await until(
            "B7: admissions", all_admitted, within=600, period=0.05, operator=operator
        )
        operator.stop()
        return count / (end - start)

    @staticmethod
    async def metric(operator: OperatorProcess, key: str, unanswered: float) -> float:
        """One value from the operator's /metrics; ``unanswered`` while a busy operator
        is too slow to answer the scrape."""
        try:
            metrics = await asyncio.to_thread(operator.metrics)
        except OSError:
            return unanswered
        return metrics.get(key, 0)

    # -- B2 ------------------------------------------------------------------------------

    async def b2_latency(
        self, client: KubeClient, namespace: str, rate: float, seconds: float
    ) -> dict[str, float]:
        _, version = await client.list_all(ns_path(namespace))
        created: dict[str, float] = {}
        decided: dict[str, float] = {}
        count = int(rate * seconds)

        async def create(name: str, rsv: JSON) -> JSON:
            return await persist(lambda: client.create(ns_path(namespace), rsv), name, landed=409)

        all_seen = asyncio.Event()
        watcher = asyncio.create_task(self._watch(namespace, version, decided, count, all_seen))
        creates = []
        start = time.monotonic()
        for i in range(count):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            name = f"l{i:05d}"
            created[name] = time.monotonic()
            rsv = body(name, self.nodes[i % len(self.nodes)], 1)
            creates.append(asyncio.ensure_future(create(name, rsv)))
        await asyncio.gather(*creates)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_seen.wait(), 60)
        watcher.cancel()
        latencies = sorted(decided[n] - created[n] for n in decided if n in created)
        q = statistics.quantiles(latencies, n=100)
        return {
            "count": len(latencies),
            "p50_ms": q[49] * 1000,
            "p95_ms": q[94] * 1000,
            "p99_ms": q[98] * 1000,
        }

    async def _watch(
        self,
        namespace: str,
        version: str,
        decided: dict[str, float],
        count: int,
        all_seen: asyncio.Event,
    ) -> None:
        ssl = self.credentials.ssl_context()
        url = f"{self.plane.url}{ns_path(namespace)}?watch=1&resourceVersion={version}"
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl)) as session,
            session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as response,
        ):
            async for raw in response.content:
                event = json.loads(raw)
                obj = event.get("object", {})
                name = obj.get("metadata", {}).get("name")
                if (obj.get("status") or {}).get("phase") and name not in decided:
                    decided[name] = time.monotonic()
                    if len(decided) >= count:
                        all_seen.set()


class Run:
    """The phases in order; each figure goes to :class:`Results` as it is measured."""

    bench: Bench
    client: KubeClient

    def __init__(self, args: argparse.Namespace, results: Results) -> None:
        self.args, self.results = args, results
        self.repeats = 1 if args.quick else 3
        self.n1 = 500 if args.quick else 2000
        self.config = {"limits": {"maxEntriesPerNode": 100_000}}

    async def main(self) -> None:
        self.results.begin("control plane start")
        workdir = Path(tempfile.mkdtemp(prefix="headroom-bench-"))
        with ControlPlane() as plane:
            install_crds(api_client(plane.kubeconfig), sorted((ROOT / "crds").glob("*.yaml")))
            self.bench = Bench(plane, workdir, self.args.quick)
            self.client = KubeClient(self.bench.credentials, connections=64)
            try:
                await self.phases()
            finally:
                self.bench.stop_operators()
                await self.client.close()

    async def baseline(self) -> None:
        """The 20 bench nodes, then B0 after a warm-up: every ratio needs it (other
        benchmarks call this too, to pair their figures with B0 in the same run)."""
        bench, client = self.bench, self.client
        core = __import__("kubernetes").client.CoreV1Api(bench.api)
        bench.nodes = [f"bench-node-{i:02d}" for i in range(20)]
        for node in bench.nodes:
            create_node(core, node, memory="1Ti")

        self.results.begin("B0 warm-up")  # the first requests of a fresh server are slow
        namespace = await bench.namespace(client)
        await bench.b0_ceiling(client, namespace, 200)
        await self.clean("the B0 warm-up", namespace)
        for i in range(self.repeats):
            self.results.begin("B0")
            namespace = await bench.namespace(client)
            rate = await bench.b0_ceiling(client, namespace, self.n1)
            self.results.repeat("B0", "creates_patches_per_s", rate)
            await self.clean(f"B0 run {i + 1}", namespace)
        self.results.finish("B0")

    async def phases(self) -> None:
        bench, client, only = self.bench, self.client, self.args.only
        core = __import__("kubernetes").client.CoreV1Api(bench.api)
        await self.baseline()
        if "b1" in only or "b2" in only:
            await self.b1_b2()
        if "b3" in only:
            await self.b3()
        if "b4" in only:
            self.results.begin("B4")
            figures = await bench.b4_reclaim(client, 200 if self.args.quick else 1000)
            self.results.figure("B4", **figures)
            self.results.finish("B4")
            await self.clean("B4", None)
        if "b7" in only:
            self.results.begin("B7")
            nodes = [f"b7-node-{i}" for i in range(10)]
            for node in nodes:
                create_node(core, node, memory=f"{B7_NODE_LIMIT_MB + 1024}Mi")
            count = 200 if self.args.quick else 1000
            rate = await bench.b7_queue(client, nodes, count)
            self.results.repeat("B7", "admissions_per_s", rate)
            self.results.figure("B7", reservations=count, nodes=len(nodes))
            self.results.finish("B7")
            await self.clean("B7", None)
        if "b6" in only:
            # The last phase: its 5,000 Nodes and 50,000 reservations go with the
            # control plane, no clean-up needed.
            await self.b6()
        self.results.begin("end")
        self.results.complete()

    async def clean(self, after: str, namespace: str | None) -> None:
        self.results.begin(f"clean-up after {after}")
        count, seconds = await self.bench.clean(self.client, namespace)
        self.results.cleanup(after, count, seconds)

    async def b1_b2(self) -> None:
        """B1 then B2, with one operator as always."""
        bench, client, results = self.bench, self.client, self.results
        operator = bench.operator(self.config).start()
        if "b1" in self.args.only:
            for i in range(self.repeats):
                results.begin("B1")
                namespace = await bench.namespace(client)
                rate = await bench.b1_throughput(client, namespace, self.n1, operator)
                results.repeat("B1", "admissions_per_s", rate)
                await self.clean(f"B1 run {i + 1}", namespace)
            results.finish("B1")
        if "b2" in self.args.only:
            results.begin("B2")
            namespace = await bench.namespace(client)
            seconds = 10 if self.args.quick else 30
            results.figure("B2", **await bench.b2_latency(client, namespace, 50, seconds))
            results.finish("B2")
            await self.clean("B2", namespace)
        operator.stop()

    async def b3(self) -> None:
        """B3: a restart with n existing (half admitted by a previous operator, half an
        undecided backlog), then one new reservation on an idle node.

        The backlog is on every bench node but the first; the first holds only admitted
        ones (its share of the first half), so the new reservation there has no
        undecided backlog in front of it on its node. It is in the same
        namespace as the backlog: the harder case for a fair operator, which cannot
        tell it apart by namespace. Headline (issue 22): restart -> the new one's
        decision seen, target <= 2 s. Beside it, the backlog's own drain rate
        (backlog / restart -> every backlog decision seen) as a ratio to B0.

        Decisions are seen by a plain watch, not by polling a LIST of 10,000 (which
        costs the API server more than the operator's writes do).
        """
        bench, client, results = self.bench, self.client, self.results
        results.begin("B3")
        n3 = self.args.b3_reservations
        namespace = await bench.namespace(client)
        operator = bench.operator(self.config).start()
        await bench.create_many(client, namespace, n3 // 2, 1, prefix="a")
        await bench.wait_decided(client, namespace, n3 // 2, operator)
        operator.stop()
        idle, busy = bench.nodes[0], bench.nodes[1:]
        backlog = n3 - n3 // 2
        everywhere, bench.nodes = bench.nodes, busy
        try:
            await bench.create_many(client, namespace, backlog, 1, prefix="p")
        finally:
            bench.nodes = everywhere
        watch = await PhaseWatch.start(bench.credentials, client, ns_path(namespace))
        try:
            start = time.monotonic()
            operator = bench.operator(self.config).start(wait_ready=False)
            await asyncio.to_thread(operator.wait_ready, 120)
            ready = time.monotonic() - start
            results.figure("B3", reservations=n3 + 1, backlog=backlog, ready_s=ready)
            first = body("first-new", idle, 1)
            created = time.monotonic()
            await persist(lambda: client.create(ns_path(namespace), first), "first-new", landed=409)
            name = f"{namespace}/first-new"
            end = await watch.wait(lambda: name in watch.decided, "B3: first new", 600)
            results.figure(
                "B3",
                first_new_decision_s=end - start,
                first_new_after_create_s=end - created,
                first_new_backlog_left=backlog - watch.count(f"{namespace}/p"),
            )

            def all_decided() -> bool:
                return watch.count(f"{namespace}/p") >= backlog and name in watch.decided

            async with every(
                PROGRESS_S, lambda: f"B3: {watch.count(f'{namespace}/p'):,} of {backlog:,} decided"
            ):
                end = await watch.wait(all_decided, "B3: backlog", 600)
            check_alive(operator)
        finally:
            await watch.stop()
        last = max(t for n, t in watch.decided.items() if n.startswith(f"{namespace}/p"))
        drain = backlog / (last - start)
        b0 = statistics.median(results.data["B0"]["creates_patches_per_s"])
        results.figure(
            "B3",
            all_decided_s=end - start,
            backlog_drain_per_s=drain,
            backlog_drain_ratio_to_B0=drain / b0,
        )

        # Idle means idle: the decisions' Events are posted off the hot path and may lag.
        async def drained() -> tuple[bool, str]:
            queued = await bench.metric(operator, "headroom_events_queued", 1)
            return not queued, f"{queued:,.0f} Events queued"

        await until("B3: Events", drained, within=600, period=0.5, operator=operator)
        drained_s = time.monotonic() - start
        assert operator.popen is not None
        process = psutil.Process(operator.popen.pid)
        rss = process.memory_info().rss / 2**20
        cpu_before = sum(process.cpu_times()[:2])
        results.figure("B3", events_drained_s=drained_s, rss_mb=rss)
        idle_s = 10 if self.args.quick else 60
        await asyncio.sleep(idle_s)
        cpu = (sum(process.cpu_times()[:2]) - cpu_before) / idle_s * 100
        results.figure("B3", idle_cpu_pct=cpu)
        results.finish("B3")
        operator.stop()
        await self.clean("B3", None)

    async def b6(self) -> None:
        """B1's throughput and the operator's RSS with many nodes and reservations."""
        bench, client, results = self.bench, self.client, self.results
        results.begin("B6")
        nodes, reservations = self.args.b6_nodes, self.args.b6_reservations
        names = [f"scale-{i:05d}" for i in range(nodes)]
        status = {"status": {"capacity": {"memory": "1Ti"}, "allocatable": {"memory": "1Ti"}}}
        made = 0

        async def node(name: str) -> None:
            nonlocal made
            meta = {"metadata": {"name": name}}
            await persist(lambda: client.create("/api/v1/nodes", meta), name, landed=409)
            path = f"/api/v1/nodes/{name}/status"
            await persist(lambda: client.merge_patch(path, status), name)
            made += 1

        async with every(PROGRESS_S, lambda: f"B6: {made:,} of {nodes:,} Nodes created"):
            await bounded([node(n) for n in names], 64)
        small_nodes, bench.nodes = bench.nodes, names
        # A day-long stale window: nothing here heartbeats, and filling takes minutes.
        operator = bench.operator(
            {"limits": {"maxEntriesPerNode": 100_000, "heartbeatStaleWindow": "24h"}}
        ).start()
        namespace = await bench.namespace(client)
        start = time.monotonic()
        await bench.create_many(client, namespace, reservations, 1, prefix="s")
        admitted = 'headroom_decisions_total{phase="Admitted"}'

        async def filled() -> tuple[bool, str]:
            value = await bench.metric(operator, admitted, 0)
            return value >= reservations, f"{value:,.0f} of {reservations:,} admitted"

        # Bound: 10 min plus 20 admissions/s at the least (50,000: 52 min).
        within = 600 + 0.05 * reservations
        await until("B6: fill", filled, within=within, period=1, operator=operator)
        results.figure(
            "B6", nodes=nodes, reservations=reservations, fill_s=time.monotonic() - start
        )
        assert operator.popen is not None
        assert bench.plane.apiserver.popen is not None
        assert bench.plane.etcd.popen is not None
        pids = {
            "operator": operator.popen.pid,
            "kube-apiserver": bench.plane.apiserver.popen.pid,
            "etcd": bench.plane.etcd.popen.pid,
        }
        cpu_runs: list[dict[str, float]] = []
        for i in range(1 if self.args.quick else 2):
            results.begin("B6")
            namespace = await bench.namespace(client)
            cpu = Cpu(pids)  # who is the bound at this size: the operator or the API server
            rate = await bench.b1_throughput(client, namespace, self.n1, operator)
            cpu_runs.append(cpu.percent())
            results.repeat("B6", "admissions_per_s", rate)
            results.figure("B6", cpu_pct=cpu_runs)
            await self.clean(f"B6 run {i + 1}", namespace)
        results.begin("B6")
        assert operator.popen is not None
        rss = psutil.Process(operator.popen.pid).memory_info().rss / 2**20
        results.figure("B6", rss_mb=rss)
        results.finish("B6")
        operator.stop()
        bench.nodes = small_nodes


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument(
        "--only", default=",".join(PHASES), help="which of b1,b2,b3,b4,b7,b6 to run after B0"
    )
    parser.add_argument("--only-b6", action="store_true", help="B0 and B6 only")
    parser.add_argument("--skip-b6", action="store_true", help="B0 to B4 only")
    parser.add_argument(
        "--b3-reservations", type=int, default=None, help="default 10,000 (2,000 quick)"
    )
    parser.add_argument("--b6-nodes", type=int, default=None, help="default 5,000 (500 quick)")
    parser.add_argument(
        "--b6-reservations", type=int, default=None, help="default 50,000 (5,000 quick)"
    )
    parser.add_argument(
        "--fail-after",
        choices=["b0", *PHASES[:-1]],
        help="testing: raise right after this benchmark's last figure was saved",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    only = {p.strip().lower() for p in args.only.split(",") if p.strip()}
    if not only <= set(PHASES):
        parser.error(f"--only: unknown {', '.join(sorted(only - set(PHASES)))}")
    if args.only_b6:
        only &= {"b6"}
    if args.skip_b6:
        only -= {"b6"}
    args.only = only
    args.b3_reservations = args.b3_reservations or (2000 if args.quick else 10_000)
    args.b6_nodes = args.b6_nodes or (500 if args.quick else 5000)
    args.b6_reservations = args.b6_reservations or (5000 if args.quick else 50_000)
    return args


def main() -> int:
    args = parse()
    results = Results(args.json, args.fail_after)
    try:
        asyncio.run(Run(args, results).main())
    except (Exception, KeyboardInterrupt) as error:
        traceback.print_exc()
        results.fail(error)
    print(f"\n{results.data['date']}, {results.data['machine']}")
    print(table(results.data))
    for failure in results.data.get("errors", []):
        print(f"FAILED in {failure['phase']}: {failure['exception']}", file=sys.stderr)
    return 1 if results.data.get("errors") else 0


if __name__ == "__main__":
    sys.exit(
        stop_cleanly(
            "bench/cluster.py",
            main,
            "its operators, kube-apiserver and etcd are stopped; the figures so far are saved",
        )
    )
