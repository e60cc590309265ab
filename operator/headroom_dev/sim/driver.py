"""Seeded schedules of everything that can happen, driving the real control code.

One schedule, from one seed: a fake API server on a virtual-time loop, one or
two operator processes (``headroom.control.Controller`` exactly as production
runs it, with leader election in some schedules), nodes, tenants who create,
heartbeat (through their reservation or an owner pod) and delete reservations,
in some schedules gated pods and the cluster around them
(:mod:`headroom_dev.sim.pods`), in some others pods that kube-scheduler binds through
the extender (:mod:`headroom_dev.sim.scheduled`), in some tenants under HeadroomQuotas that an
admin raises, lowers, deletes and creates again, in some a noisy tenant who creates
reservations in bursts and heartbeats them many times a second, and an adversary
who resizes and deletes nodes,
deletes and unlabels owner pods, crashes and restarts the operator, pauses the
leader past its Lease, cuts the network for a while, breaks watches and compacts
history — on top of a network that throttles, fails, loses answers and drops,
duplicates and delays watch events. Then everything calms down, every owner goes silent, and
the schedule runs until it quiesces. :mod:`headroom_dev.sim.checks` and
:mod:`headroom_dev.sim.podchecks` and :mod:`headroom_dev.sim.scheduledchecks` say
what is checked.

Replay one schedule, with the operator's log::

    python -m headroom_dev.sim.driver --seed 1234 -v
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from headroom.api.config import OperatorConfig
from headroom.api.constants import GPU_COUNT_LABEL, GPU_MEMORY_LABEL, OWNER_LABEL
from headroom.control.controller import Controller
from headroom.control.schedulerextender import SchedulerExtender
from headroom.control.supervisor import Supervisor
from headroom.kube.events import EventRecorder
from headroom.kube.leader import LeaderElector, LeaseSettings
from headroom.kube.transport import ApiError, ApiUnavailableError, resource_path
from headroom.ledger.quotas import NAME_LABEL
from headroom_dev.sim.checks import Checker, Replica
from headroom_dev.sim.fakeapi import FakeApiServer, FaultPlan
from headroom_dev.sim.fakeapi.client import FakeClient
from headroom_dev.sim.loop import VirtualClock, run_virtual
from headroom_dev.sim.podchecks import PodChecker
from headroom_dev.sim.pods import PodWorld
from headroom_dev.sim.reviewchecks import ReviewChecker
from headroom_dev.sim.reviews import HOLDS, REVIEW_SHARE, Reviews
from headroom_dev.sim.scheduled import ScheduledWorld
from headroom_dev.sim.scheduledchecks import ScheduledChecker

NAMESPACE = "sim"
LEASE = ("kube-system", "headroom")
WINDOW = 20.0
QUIESCE = 90.0  # virtual seconds of calm at the end: a window, a resync, and slack
POD_SHARE = 0.5  # of schedules that have gated pods (headroom_dev.sim.pods)
SCHEDULED_SHARE = 0.6  # of the others, that have pods for the headroom scheduler
QUOTA_SHARE = 0.5  # of schedules with tenants under quotas
TEAMS = ("team-a", "team-b")  # both under quota "team"; team-b also under "b-only"
NOISY_SHARE = 0.3  # of schedules with a tenant that floods creates and heartbeats
NOISY = "noisy"
JSON = dict[str, Any]
QUOTAS = resource_path("headroom.dev", "v1alpha1", "headroomquotas")
QUOTA_NAMES = ("team", "b-only", "pods")  # "pods" governs the gated pods' namespace


@dataclass
class Outcome:
    seed: int
    violations: list[str]
    stats: dict[str, int] = field(default_factory=dict)
    revision: int = 0  # the fake server's last resourceVersion: equal runs, equal revisions


def simulate(seed: int) -> Outcome:
    """Run the schedule of ``seed`` to quiescence and check it."""
    return run_virtual(_Schedule(seed).run(), max_virtual_seconds=3600)


def _config(
    leader: bool,
    strict: bool,
    bind_grace: float | None = None,
    provisional_hold: float | None = None,
) -> OperatorConfig:
    """``bind_grace``: placement by the headroom scheduler, through the extender (whose
    calls the schedule makes directly: no port is served). ``provisional_hold``: the
    webhook's ``provisionalHold`` (its reviews are called directly too)."""
    scheduled: JSON = {}
    if bind_grace is not None:
        scheduled = {
            "extenderPort": 0,
            "placement": {"mode": "scheduler", "bindGrace": f"{bind_grace:g}s"},
        }
    if provisional_hold is not None:
        scheduled["webhook"] = {"provisionalHold": f"{provisional_hold:g}s"}
    return OperatorConfig.model_validate(
        {
            **scheduled,
            "queueing": {"strategy": "StrictFIFO" if strict else "BestEffortFIFO"},
            "limits": {"heartbeatStaleWindow": f"{WINDOW:g}s", "maxEntriesPerNode": 6},
            "podRequests": "subtract",  # what bound pods requested is not the ledger's
            "sweepPeriod": "1s",
            "summaryInterval": "500ms",
            "resyncPeriod": "30s",
            "reclaimedRetention": "2m",
            "leaderElection": {
                "enabled": leader,
                "namespace": LEASE[0],
                "leaseName": LEASE[1],
                "leaseDuration": "6s",
                "renewDeadline": "4s",
                "retryPeriod": "1s",
            },
        }
    )


class Process:
    """One operator process: a client (its network), a controller, maybe a Lease."""

    def __init__(self, schedule: _Schedule, number: int) -> None:
        self.schedule, s = schedule, schedule
        self.name = f"operator-{number}"
        self.run_id = f"r{number}"
        self.client: FakeClient = s.server.client(self.name, s.faults(number))
        self.alive = True
        self.elector: LeaderElector | None = None
        if s.config.leader_election.enabled:
            e = s.config.leader_election
            self.elector = LeaderElector(
                self.client,
                LeaseSettings(
                    LEASE[0],
                    LEASE[1],
                    self.name,
                    e.lease_duration,
                    e.renew_deadline,
                    e.retry_period,
                ),
                s.clock,
            )
        elector = self.elector
        self.controller = Controller(
            s.config,
            self.client,
            clock=s.clock,
            supervisor=Supervisor(on_failure=lambda reason: self.crash(f"supervisor: {reason}")),
            may_act=elector.may_act if elector else (lambda: True),
            time_left=elector.time_left if elector else (lambda: 30.0),
            rng=random.Random(s.rng.random()),
            run_id=self.run_id,
            events=EventRecorder(self.client, clock=s.clock, instance=self.name),
        )
        self.extender = SchedulerExtender(self.controller) if s.scheduled is not None else None
        if s.review_checker is not None:
            self._record_give_backs(s.review_checker)
        self.replica = Replica(self.name, self.run_id, started_at=float("inf"))
        s.checker.replicas[self.run_id] = self.replica
        self.task = asyncio.create_task(self._run(), name=f"{self.name}-main")

    async def _run(self) -> None:
        s = self.schedule
        if self.elector is not None:
            await self.elector.acquire()
            self.controller.supervisor.spawn(
                "lease", self.elector.hold(on_lost=lambda: self.crash("lost the Lease"))
            )
        while True:  # as kopf retries a start-up handler that failed
            self.replica.started_at = s.now()
            try:
                await self.controller.start()
                break
            except (ApiError, ApiUnavailableError):
                await asyncio.sleep(1.0)
        self.replica.controller = self.controller
        s.checker.deciders.append(self.replica)
        s.disturbed()  # a new operator: the pods' clocks start again (podpromises)

    def _record_give_backs(self, checker: ReviewChecker) -> None:
        """Tell the checker each provisional hold given back (decided, withdrawn, run out)."""
        holds = self.controller.holds
        give_back = holds.give_back

        def recorded(uid: str) -> bool:
            given = give_back(uid)
            checker.gave_back(self.run_id, uid, given)
            return given

        holds.give_back = recorded  # type: ignore[method-assign]

    @property
    def paused(self) -> bool:
        return self.client.paused

    @property
    def deciding(self) -> bool:
        """Whether its extender answers (not 503): alive and running, not paused, its
        ledger rebuilt, the leader (as ``headroom.main`` decides)."""
        return (
            self.alive
            and not self.client.paused
            and self.replica.controller is not None
            and self.controller.ready.is_set()
            and (self.elector is None or self.elector.may_act())
        )

    def crash(self, why: str = "killed") -> None:
        """The process dies: its network goes, its tasks stop, nothing is written after."""
        if not self.alive:
            return
        self.alive = False
        self.replica.controller = None  # a dead process writes nothing more
        self.schedule.log(f"{self.name} crashes ({why})")
        self.client.kill()
        self.schedule.disturbed()
        self.task.cancel()
        self.schedule.spawn(self.controller.stop())
        if self.extender is not None:
            self.schedule.spawn(self.extender.stop())
        self.schedule.restart_later()  # as the Deployment would


class _Schedule:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = VirtualClock()
        self.server = FakeApiServer(
            self.clock,
            seed=seed,
            history_limit=self.rng.choice([40, 1000]),
            bookmark_interval=self.rng.choice([5.0, 60.0]),
        )
        self.leader = self.rng.random() < 0.35
        strict = self.rng.random() < 0.5
        with_pods = self.rng.random() < POD_SHARE
        scheduled = not with_pods and self.rng.random() < SCHEDULED_SHARE
        bind_grace = self.rng.choice([5.0, 20.0, 60.0]) if scheduled else None
        # Reviews draw on their own: the schedules without them are as they were.
        reviewing = random.Random(seed * 7919 + 17)
        hold = reviewing.choice(HOLDS) if reviewing.random() < REVIEW_SHARE else None
        self.config = _config(self.leader, strict, bind_grace, hold)
        lease_path = resource_path("coordination.k8s.io", "v1", "leases", *LEASE)
        self.pauses: list[tuple[str, float, float]] = []  # (run id, from, to)
        self.checker = Checker(
            self.config,
            now=self.now,
            lease=(lambda: self.server.get(lease_path)) if self.leader else (lambda: None),
            paused=lambda run_id, since, until: any(
                r == run_id and start <= until and end >= since for r, start, end in self.pauses
            ),
        )
        self.server.subscribe(self.checker.on_change)
        self.pods: PodWorld | None = None
        self.pod_checker = PodChecker(self.checker, steady_since=self.steady_since)
        self._disturbed_at = 0.0  # the last crash, start, pause's or outage's end
        self._outages = 0  # outages in progress
        if with_pods:
            self.pods = PodWorld(self, NAMESPACE, seed=self.rng.random())
            self.server.subscribe(self.pod_checker.on_change)
        self.scheduled: ScheduledWorld | None = None
        # The Service's picks draw on their own: the tenants' and the adversary's
        # sequences do not depend on how many calls the schedulers made.
        self.service = random.Random(self.rng.random())
        self.scheduled_checker = ScheduledChecker(self.checker, bind_grace or 0.0, self.now)
        if scheduled:
            self.server.subscribe(self.scheduled_checker.on_change)
            self.scheduled = ScheduledWorld(self, NAMESPACE, seed=self.rng.random())
        self.processes: list[Process] = []
        self.review_checker: ReviewChecker | None = None
        self.reviews: Reviews | None = None
        if hold is not None:
            self.review_checker = ReviewChecker(self.checker, hold, self.live_controllers)
            self.server.subscribe(self.review_checker.on_change)
            self.reviews = Reviews(
                self.server,
                lambda: self.processes,
                self.review_checker,
                self.count,
                self.now,
                seed=reviewing.random(),
            )
        self.numbers = 0
        self.nodes: dict[str, int] = {}
        self.reservations: list[str] = []
        self.owners: dict[str, str] = {}  # reservation -> owner pod
        self.beating: dict[str, asyncio.Task[None]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.stats: dict[str, int] = {}
        self.noisy = self.rng.random() < 0.8  # a network that misbehaves all along
        self.quotas = self.rng.random() < QUOTA_SHARE
        self.where: dict[str, str] = {}  # reservation -> its namespace
        self.flooding = self.rng.random() < NOISY_SHARE
        self.trace: list[str] = []
        self.calmed = False
        self.ending = False

    def now(self) -> float:
        return self.clock.monotonic()

    def live_controllers(self) -> list[tuple[str, Controller]]:
        return [(p.run_id, p.controller) for p in self.processes if p.alive]

    def disturbed(self) -> None:
        self._disturbed_at = self.now()
        self.pod_checker.promises.moved(restart=True)  # a start may rightly place pods again

    def steady_since(self) -> float | None:
        """Since when one operator has run undisturbed (no crash, start, pause or
        outage since); None while none runs, or one is paused or cut off."""
        running = [p for p in self.processes if p.alive and p.replica.controller is not None]
        if not running or self._outages or any(p.client.paused for p in self.processes):
            return None
        return self._disturbed_at

    def log(self, line: str) -> None:
        self.trace.append(f"{self.now():8.3f} {line}")
        logging.getLogger("sim").info("%s", line)

    def spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def faults(self, number: int) -> FaultPlan:
        if not self.noisy or self.calmed:  # a process started in the calm has it too
            return FaultPlan(seed=self.seed * 31 + number)
        return FaultPlan(
            seed=self.seed * 31 + number,
            throttle=0.02,
            server_error=0.02,
            lose_answer=0.02,
            refuse=0.01,
            latency=0.05,
            watch_break=0.01,
            watch_drop=0.01,
            watch_duplicate=0.01,
            watch_expire=0.005,
            watch_delay=0.2,
        )

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    # -- the schedule ----------------------------------------------------------------------

    async def run(self) -> Outcome:
        reviews = self.reviews
        claim_pods = self.pods is not None or self.scheduled is not None
        # (the claim pods' namespace is never strict: the operator creates their reservations)
        strict = reviews.namespace_labels if reviews is not None else lambda _: {}
        self.server.ensure_namespace(NAMESPACE, None if claim_pods else strict(NAMESPACE))
        if self.flooding and reviews is not None:
            self.server.ensure_namespace(NOISY, strict(NOISY))
        if self.quotas:
            for team in TEAMS:
                self.server.ensure_namespace(team, {"team": "t", **strict(team)})
            self.put_quota("team", {"matchLabels": {"team": "t"}})
            self.put_quota("b-only", {"matchLabels": {NAME_LABEL: "team-b"}})
            if self.pods is not None or self.scheduled is not None:
                # the claim pods' namespace, under a quota of its own
                self.put_quota("pods", {"matchLabels": {NAME_LABEL: NAMESPACE}})
        for i in range(self.rng.randint(1, 3)):
            self.put_node(f"node-{i}")
        for _ in range(2 if self.leader else 1):
            self.start_process()
        if self.scheduled is not None:
            self.scheduled.start()
        actions: list[tuple[float, Callable[[], None]]] = [
            (12, self.create_reservation),
            (2, self.delete_reservation),
            (1.5, self.resize_node),
            (0.5, self.delete_node),
            (1, self.delete_owner_pod),
            (0.5, self.unlabel_owner_pod),
            (1, self.crash_and_restart),
            (1, self.pause_leader),
            (1, self.outage),
            (0.5, self.break_watches),
            (0.3, self.compact),
            *([(1.0, self.change_quota)] if self.quotas else []),
            *([(1.0, self.flood)] if self.flooding else []),
            *(self.pods.actions() if self.pods is not None else []),
            *(self.scheduled.actions() if self.scheduled is not None else []),
        ]
        weights = [w for w, _ in actions]
        for _ in range(self.rng.randint(10, 35)):
            await asyncio.sleep(self.rng.expovariate(1 / 1.5))
            self.rng.choices(actions, weights)[0][1]()
        await self.calm()
        living = next((p for p in reversed(self.processes) if p.alive), None)
        controller = living.controller if living is not None and living.replica.controller else None
        reservations = self.server.reservations()
        may_wait = (
            self.pod_checker.may_wait if self.scheduled is None else self.scheduled_checker.may_wait
        )
        self.checker.final(reservations, controller, may_wait=may_wait)
        if self.review_checker is not None:
            self.review_checker.final()
        quotas = [q for n in QUOTA_NAMES if (q := self.server.get(f"{QUOTAS}/{n}"))]
        namespaces = {
            n: (ns.get("metadata") or {}).get("labels") or {}
            for n in (NAMESPACE, *TEAMS)
            if (ns := self.server.get(resource_path("", "v1", "namespaces", None, n))) is not None
        }
        if self.pods is not None:
            self.pod_checker.final(
                self.server.pods(), reservations, self.server.nodes(), quotas, namespaces
            )
        if self.scheduled is not None:
            self.scheduled_checker.final(self.server.pods(), reservations, quotas, namespaces)
        self.ending = True
        for process in self.processes:
            process.crash("end of schedule")
        await asyncio.sleep(10)  # their bounded stops
        self.checker.violations.extend(repr(e) for e in self.server.listener_errors)
        stats = {**self.stats, **self.checker.counts}
        if self.review_checker is not None:
            stats.update(self.review_checker.counts)
        return Outcome(self.seed, self.checker.violations, stats, self.server.resource_version)

    async def calm(self) -> None:
        """No more faults, every owner silent, one live operator; wait for quiescence."""
        self.log("calm")
        self.calmed = True
        for process in self.processes:
            for name in (
                "throttle",
                "server_error",
                "lose_answer",
                "refuse",
                "latency",
                "watch_break",
                "watch_drop",
                "watch_duplicate",
                "watch_expire",
                "watch_delay",
            ):
                if process.client.faults is not None:
                    setattr(process.client.faults, name, 0.0)
            if process.client.paused:
                process.client.resume()
        for task in self.beating.values():
            task.cancel()
        if not any(p.alive for p in self.processes):
            self.start_process()
        await asyncio.sleep(QUIESCE)

    # -- operators -------------------------------------------------------------------------

    def extender(self) -> SchedulerExtender | None:
        """The extender of the replica a scheduler's call reaches (the Service picks one
        at random), or None when that one answers 503."""
        living = [p for p in self.processes if p.alive]
        if not living:
            return None
        process = self.service.choice(living)
        return process.extender if process.deciding else None

    def start_process(self) -> None:
        self.numbers += 1
        self.processes.append(Process(self, self.numbers))
        self.log(f"operator-{self.numbers} starts")

    def crash_and_restart(self) -> None:
        living = [p for p in self.processes if p.alive]
        if living:
            self.rng.choice(living).crash()
            self.count("crash")

    def restart_later(self) -> None:
        """A crashed operator comes back after a while (a pod restart, an image pull)."""
        if self.ending:
            return
        delay = self.rng.uniform(0, 30)

        async def restart() -> None:
            await asyncio.sleep(delay)
            alive = sum(1 for p in self.processes if p.alive)
            if not self.ending and alive < (2 if self.leader else 1):
                self.start_process()  # without a Lease, never two operators at once

        self.spawn(restart())

    def pause_leader(self) -> None:
        living = [p for p in self.processes if p.alive and not p.client.paused]
        if not living:
            return
        process = self.rng.choice(living)
        seconds = self.rng.uniform(2, 15)
        process.client.pause()
        self.pauses.append((process.run_id, self.now(), self.now() + seconds))
        self.log(f"{process.name} paused for {seconds:.1f}s")
        self.count("pause")

        async def resume() -> None:
            await asyncio.sleep(seconds)
            process.client.resume()
            self.disturbed()

        self.spawn(resume())

    def outage(self) -> None:
        living = [p for p in self.processes if p.alive and p.client.faults is not None]
        if not living:
            return
        faults = self.rng.choice(living).client.faults
        assert faults is not None
        seconds = self.rng.uniform(1, 10)
        faults.refuse = 1.0
        self._outages += 1
        self.count("outage")

        async def back() -> None:
            await asyncio.sleep(seconds)
            faults.refuse = 0.01 if self.noisy and not self.calmed else 0.0
            self._outages -= 1
            self.disturbed()

        self.spawn(back())

    def break_watches(self) -> None:
        self.server.break_watches()

    def compact(self) -> None:
        self.server.compact()

    # -- nodes -----------------------------------------------------------------------------

    def put_node(self, name: str) -> None:
        memory = self.rng.choice([2048, 3072, 4096, 8192])
        self.nodes[name] = memory
        labels = self.pods.node_labels(name) if self.pods is not None else {}
        if int(name.rsplit("-", 1)[1]) % 2 == 0:  # even nodes have two GPUs of 3 GiB (GFD)
            labels = {**(labels or {}), GPU_COUNT_LABEL: "2", GPU_MEMORY_LABEL: "3072"}
        self.server.put_node(name, memory=memory, labels=labels or None)
        if self.pods is not None:
            self.pods.node_put(name)

    def resize_node(self) -> None:
        if self.nodes:
            self.put_node(self.rng.choice(sorted(self.nodes)))
            self.count("resize")

    def delete_node(self) -> None:
        if not self.nodes:
            return
        name = self.rng.choice(sorted(self.nodes))
        del self.nodes[name]
        self.server.delete_node(name)
        self.count("node-delete")
        if self.rng.random() < 0.7:

            async def back() -> None:
                await asyncio.sleep(self.rng.uniform(1, 20))
                self.put_node(name)

            self.spawn(back())

    # -- quotas ----------------------------------------------------------------------------

    def put_quota(self, name: str, selector: JSON) -> None:
        """Create, or change, a quota: new limits, sometimes a default lifetime; the gated
        pods' quota also, sometimes, a nodeSelector, a maxWait and a maxLifetime."""
        spec: JSON = {
            "namespaceSelector": selector,
            "ramMB": self.rng.choice([1024, 2048, 3072, 6144]),
            "maxEntries": self.rng.choice([2, 3, 5]),
        }
        if self.rng.random() < 0.3:
            spec["defaultLifetime"] = f"{self.rng.randint(5, 60)}s"
        if name == "pods":
            spec.update(self._pod_quota_rules())
        body = {"apiVersion": "headroom.dev/v1alpha1", "kind": "HeadroomQuota"}
        path = f"{QUOTAS}/{name}"
        existing = self.server.get(path)
        if existing is None:
            self.server.create(QUOTAS, {**body, "metadata": {"name": name}, "spec": spec})
        else:
            cleared = dict.fromkeys(("defaultLifetime", "maxLifetime", "maxWait", "nodeSelector"))
            self.server.merge_patch(path, {"spec": {**cleared, **spec}})
        self.log(f"quota {name}: {spec}")

    def _pod_quota_rules(self) -> JSON:
        """What governs where and how long gated pods go (issue 29): a nodeSelector on
        labels the pods' nodes carry (:meth:`PodWorld.node_labels`), a maxWait shorter
        than a pod's default wait (24 h), a maxLifetime over the default lifetime."""
        rng = self.rng
        rules: JSON = {}
        rules["ramMB"] = rng.choice([2048, 4096, 8192])
        rules["maxEntries"] = rng.choice([3, 5, 8])
        if rng.random() < 0.5:
            rules["nodeSelector"] = rng.choice(
                [
                    {"matchLabels": {"pool": rng.choice(["a", "b"])}},
                    {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
                    {"matchExpressions": [{"key": "dedicated", "operator": "DoesNotExist"}]},
                ]
            )
        if rng.random() < 0.5:
            rules["maxWait"] = f"{rng.randint(5, 40)}s"
        if rng.random() < 0.3:
            rules["maxLifetime"] = f"{rng.randint(60, 90)}s"
        return rules

    def change_quota(self) -> None:
        """An admin raises or lowers a quota, or deletes it (and may create it again)."""
        claim_pods = self.pods is not None or self.scheduled is not None
        name = self.rng.choice(QUOTA_NAMES if claim_pods else QUOTA_NAMES[:2])
        selector = {
            "team": {"matchLabels": {"team": "t"}},
            "b-only": {"matchLabels": {NAME_LABEL: "team-b"}},
            "pods": {"matchLabels": {NAME_LABEL: NAMESPACE}},
        }[name]
        if self.rng.random() < 0.25 and self.server.get(f"{QUOTAS}/{name}") is not None:
            self.server.delete(f"{QUOTAS}/{name}")
            self.count("quota-delete")
            self.log(f"quota {name} deleted")
            return
        self.put_quota(name, selector)
        self.count("quota-change")

    # -- tenants ---------------------------------------------------------------------------

    def create_reservation(self) -> None:
        """A tenant creates a reservation (reviewed by the webhook first, in some schedules:
        :mod:`headroom_dev.sim.reviews`)."""
        name = f"r{len(self.reservations)}"
        namespace = self.rng.choice([NAMESPACE, *TEAMS]) if self.quotas else NAMESPACE
        reviews = self.reviews
        namesake = (
            reviews.namesake([r for r in self.reservations if self.where[r] == namespace])
            if reviews is not None
            else None
        )
        if namesake is None:
            self.reservations.append(name)
            self.where[name] = namespace
        else:
            name = namesake
        node = self.rng.choice([*sorted(self.nodes), "node-9"]) if self.nodes else "node-0"
        spec: dict[str, Any] = {}
        if self.rng.random() < 0.2:
            spec["expiresAt"] = (
                self.clock.now() + timedelta(seconds=self.rng.uniform(1, 60))
            ).strftime("%Y-%m-%dT%H:%M:%SZ")
        if self.rng.random() < 0.4:  # it may wait for room
            spec["wait"] = f"{self.rng.uniform(1, 60):.1f}s"
        vram = self.rng.choice([0, 0, 0, 1024, 2048, 3072])
        if vram and self.rng.random() < 0.3:  # over two devices, or the node's sum
            spec["gpus"] = self.rng.choice([0, 2])
        how = self.rng.choice(["silent", "self", "self", "pod", "pod", "late-pod", "no-pod"])
        if namesake is not None:
            how = "silent"  # (named taken: AlreadyExists, but for one deleted meanwhile)
        if how in ("pod", "late-pod", "no-pod"):
            pod = f"owner-{name}"
            spec["owner"] = {"pod": pod}
            self.owners[name] = pod
            if how == "pod":
                self.server.create_pod(namespace, pod, labels={OWNER_LABEL: "true"})
        ram = self.rng.choice([256, 512, 1024, 2048, 3072])
        try:
            if reviews is None:
                self.server.create_reservation(namespace, name, node, ram, vram, **spec)
            else:
                annotations = reviews.annotations()
                if reviews.dry_run_first():  # kubectl apply --dry-run=server, then for real
                    with contextlib.suppress(ApiError):
                        self.server.create_reservation(
                            namespace, name, node, ram, vram, annotations=annotations,
                            review=reviews.review(dry_run=True), dry_run=True, **spec,
                        )  # fmt: skip
                self.server.create_reservation(
                    namespace, name, node, ram, vram, annotations=annotations,
                    review=reviews.review(), **spec,
                )  # fmt: skip
        except ApiError:
            return
        self.count("create")
        if how == "late-pod":  # created just after its reservation: the operator must look it up
            self.server.create_pod(namespace, f"owner-{name}", labels={OWNER_LABEL: "true"})
        if how in ("self", "pod", "late-pod"):
            lifetime = self.rng.uniform(0, 120)
            self.beating[name] = asyncio.create_task(self.beat(name, how == "self", lifetime))

    async def beat(self, name: str, on_reservation: bool, lifetime: float) -> None:
        """An owner alive for ``lifetime`` seconds, beating every few seconds."""
        until = self.now() + lifetime
        while self.now() < until:
            await asyncio.sleep(self.rng.uniform(1, WINDOW / 3))
            with contextlib.suppress(ApiError):
                if on_reservation:
                    self.server.heartbeat(self.where[name], name)
                else:
                    self.server.heartbeat_pod(self.where[name], self.owners[name])

    def flood(self) -> None:
        """The noisy tenant: a burst of creates over every node at once, some of them
        waiting for room, each then heartbeated several times a second."""
        nodes = sorted(self.nodes) or ["node-0"]
        burst = self.rng.randint(10, 40)
        for _ in range(burst):
            name = f"n{len(self.reservations)}"
            self.reservations.append(name)
            self.where[name] = NOISY
            spec: dict[str, Any] = {}
            if self.rng.random() < 0.3:
                spec["wait"] = f"{self.rng.uniform(1, 30):.1f}s"
            node, ram = self.rng.choice(nodes), self.rng.choice([64, 128, 256])
            reviews = self.reviews
            try:
                if reviews is None:
                    self.server.create_reservation(NOISY, name, node, ram, **spec)
                else:
                    self.server.create_reservation(
                        NOISY, name, node, ram, annotations=reviews.annotations(),
                        review=reviews.review(), **spec,
                    )  # fmt: skip
            except ApiError:
                continue
            self.count("noisy-create")
            if self.rng.random() < 0.5:
                self.beating[name] = asyncio.create_task(self.storm(name))

    async def storm(self, name: str) -> None:
        """Heartbeats far more often than needed, for a while."""
        until = self.now() + self.rng.uniform(5, 60)
        while self.now() < until:
            await asyncio.sleep(self.rng.uniform(0.05, 0.5))
            with contextlib.suppress(ApiError):
                self.server.heartbeat(NOISY, name)
                self.count("noisy-beat")

    def delete_reservation(self) -> None:
        if not self.reservations:
            return
        name = self.rng.choice(self.reservations)
        with contextlib.suppress(ApiError):
            self.server.delete_reservation(self.where[name], name)
            self.count("delete")
        if (task := self.beating.pop(name, None)) is not None:
            task.cancel()

    def delete_owner_pod(self) -> None:
        if not self.owners:
            return
        name = self.rng.choice(sorted(self.owners))
        with contextlib.suppress(ApiError):
            self.server.delete_pod(self.where[name], self.owners[name])
            self.count("pod-delete")
        if (task := self.beating.pop(name, None)) is not None:
            task.cancel()

    def unlabel_owner_pod(self) -> None:
        if not self.owners:
            return
        name = self.rng.choice(sorted(self.owners))
        pod = self.owners[name]
        with contextlib.suppress(ApiError):
            path = resource_path("", "v1", "pods", self.where[name], pod)
            self.server.merge_patch(path, {"metadata": {"labels": {OWNER_LABEL: None}}})
            self.count("unlabel")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("-v", "--verbose", action="store_true", help="the operator's log too")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.CRITICAL,
        format="%(name)s %(levelname)s %(message)s",
    )
    outcome = simulate(args.seed)
    print(f"seed {args.seed}: {outcome.stats}")
    for violation in outcome.violations:
        print(f"  VIOLATION {violation}")
    return 1 if outcome.violations else 0


if __name__ == "__main__":
    sys.exit(main())
