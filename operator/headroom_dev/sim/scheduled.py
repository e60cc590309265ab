"""Claim pods placed by kube-scheduler through the extender, in the simulation (issue 30).

With ``placement.mode: scheduler`` an opted-in pod is not gated: the webhook gives it
``schedulerName: headroom``, and a second kube-scheduler asks the leader, as its
extender, to filter, prioritize and bind
(:class:`headroom.control.schedulerextender.SchedulerExtender`, called here as the
HTTPS server calls it). What surrounds those pods, played here:

- tenants create such pods (the claim and owner labels, the scheduler's name,
  ``headroom.dev/ram``, sometimes ``headroom.dev/wait``) and delete them;
- kube-scheduler, one or two unelected replicas, each trying every unbound pod in
  turn. Its own predicates pass only some nodes for a pod (its CPU fits on those: a
  fixed random set per pod, which the ledger cannot see). Each call reaches one
  operator replica, as the Service spreads connections: one that does not decide
  (crashed, paused, a standby, rebuilding its ledger) answers 503, and the pod is
  tried again after a backoff. The bind comes a moment after the filter, maybe to
  another replica, after a crash;
- the kubelet runs a bound pod and ends it after its lifetime (not once all is calm),
  or at its ``activeDeadlineSeconds`` (Failed), which the bind sets from its quota's
  lifetime.

:class:`ScheduledChecker` says what is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import zlib
from collections.abc import Callable
from typing import Any, Protocol

from headroom.api.constants import CLAIM_LABEL, OWNER_LABEL, RAM_ANNOTATION, WAIT_ANNOTATION
from headroom.control.binder import BindCall
from headroom.control.schedulerextender import SchedulerExtender
from headroom.kube.transport import ApiError, resource_path
from headroom_dev.sim.kubelet import end_at_deadline, set_phase
from headroom_dev.sim.podedits import SIZES, Stage
from headroom_dev.sim.podfacts import claims, finished

JSON = dict[str, Any]
SCHEDULER = "headroom"  # placement.schedulerName's default
BACKOFF = (1.0, 5.0)  # the chart's podInitialBackoffSeconds, podMaxBackoffSeconds


class ScheduledStage(Stage, Protocol):
    def extender(self) -> SchedulerExtender | None:
        """The extender of the replica a call reaches, or None: it answers 503."""
        ...


def waits_for_scheduler(pod: JSON) -> bool:
    spec = pod.get("spec") or {}
    return claims(pod) and spec.get("schedulerName") == SCHEDULER


class ScheduledWorld:
    """Tenants' pods for the ``headroom`` scheduler, that scheduler, and the kubelet."""

    def __init__(self, stage: ScheduledStage, namespace: str, seed: float) -> None:
        self.stage, self.server, self.namespace = stage, stage.server, namespace
        self.rng = random.Random(seed)
        self.names = 0
        self.lifetimes: dict[str, float] = {}  # pod uid -> seconds it runs
        self._retry_at: dict[str, float] = {}  # pod uid -> not tried before (backoff)
        self._started: set[str] = set()
        self.server.subscribe(self.on_change)

    def start(self) -> None:
        """kube-scheduler starts: one replica, or two that both schedule every pod."""
        for number in range(self.rng.choice([1, 1, 2])):
            self.stage.spawn(self._scheduler(number))

    def actions(self) -> list[tuple[float, Callable[[], None]]]:
        return [(6, self.create_pod), (1.5, self.delete_pod)]

    # -- tenants --------------------------------------------------------------------------

    def create_pod(self) -> None:
        rng = self.rng
        name = f"spod{self.names}"
        self.names += 1
        ram = rng.choice(SIZES)
        annotations = {RAM_ANNOTATION: f"{ram}Mi"}
        if rng.random() < 0.2:
            annotations[WAIT_ANNOTATION] = f"{rng.randint(5, 60)}s"
        container: JSON = {"name": "main", "image": "sim"}
        if rng.random() < 0.7:
            container["resources"] = {"requests": {"memory": f"{ram}Mi"}}
        body = {
            "metadata": {
                "name": name,
                "labels": {CLAIM_LABEL: "true", OWNER_LABEL: "true"},
                "annotations": annotations,
            },
            "spec": {"schedulerName": SCHEDULER, "containers": [container]},
        }
        try:
            pod = self.server.create(resource_path("", "v1", "pods", self.namespace), body)
        except ApiError:
            return
        self.lifetimes[pod["metadata"]["uid"]] = rng.uniform(3, 90)
        self.stage.count("sched-pod")
        self.stage.log(f"pod {name} created for the scheduler")

    def delete_pod(self) -> None:
        pods = [p for p in self.server.pods(self.namespace) if waits_for_scheduler(p)]
        if not pods:
            return
        pod = self.rng.choice(pods)
        with contextlib.suppress(ApiError):
            self.server.delete(self._path(pod["metadata"]["name"]), uid=pod["metadata"]["uid"])
            bound = bool(pod["spec"].get("nodeName"))
            self.stage.count("sched-pod-delete" if bound else "sched-pod-delete-unbound")

    def _path(self, name: str) -> str:
        return resource_path("", "v1", "pods", self.namespace, name)

    # -- kube-scheduler ---------------------------------------------------------------------

    def feasible(self, pod: JSON, nodes: list[str]) -> list[str]:
        """The nodes kube-scheduler's own predicates pass (its CPU fits there): a fixed
        share of them per pod, at least one when there are any."""
        uid = pod["metadata"]["uid"]
        passed = [n for n in nodes if zlib.crc32(f"{uid}/{n}".encode()) % 4 != 0]
        return passed or nodes[:1]

    async def _scheduler(self, number: int) -> None:
        rng = random.Random(self.rng.random())
        while True:
            await asyncio.sleep(rng.uniform(0.1, 0.6))
            pods = [
                p
                for p in self.server.pods(self.namespace)
                if waits_for_scheduler(p) and not p["spec"].get("nodeName") and not finished(p)
            ]
            for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
                uid = pod["metadata"]["uid"]
                if self._retry_at.get(uid, 0.0) <= self.stage.now():
                    await self._schedule_one(pod, rng, number)

    async def _schedule_one(self, pod: JSON, rng: random.Random, number: int) -> None:
        meta = pod["metadata"]
        uid, name = meta["uid"], meta["name"]
        extender = self.stage.extender()
        if extender is None:
            self._back_off(uid, rng, "sched-filter-503")
            return
        nodes = self.feasible(pod, sorted(n["metadata"]["name"] for n in self.server.nodes()))
        found = extender.filter(pod, nodes)
        if not found.nodes:
            self._back_off(uid, rng, "sched-unschedulable")
            return
        scores = extender.prioritize(pod, found.nodes)
        node = max(found.nodes, key=lambda n: (scores.get(n, 0), rng.random()))
        await asyncio.sleep(rng.uniform(0.0, 0.3))  # the binding cycle runs apart
        extender = self.stage.extender()  # a new connection: maybe another replica
        if extender is None:
            self._back_off(uid, rng, "sched-bind-503")
            return
        error = await extender.bind(BindCall(self.namespace, name, uid, node))
        if error:
            self.stage.log(f"scheduler-{number}: pod {name} not bound to {node}: {error}")
            self._back_off(uid, rng, "sched-bind-refused")
            return
        self.stage.count("sched-bound")
        self.stage.log(f"scheduler-{number}: pod {name} bound to {node}")

    def _back_off(self, uid: str, rng: random.Random, what: str) -> None:
        self._retry_at[uid] = self.stage.now() + rng.uniform(*BACKOFF)
        self.stage.count(what)

    # -- the kubelet -----------------------------------------------------------------------

    def on_change(self, event_type: str, obj: JSON) -> None:
        if obj.get("kind") != "Pod" or event_type == "DELETED" or not waits_for_scheduler(obj):
            return
        uid = obj["metadata"]["uid"]
        phase = (obj.get("status") or {}).get("phase")
        if obj["spec"].get("nodeName") and phase == "Pending" and uid not in self._started:
            self._started.add(uid)
            self.stage.spawn(self._run(obj["metadata"]["name"], uid))

    async def _run(self, name: str, uid: str) -> None:
        await asyncio.sleep(self.rng.uniform(0.2, 2))
        if not self._set_phase(name, uid, "Running"):
            return
        self.stage.spawn(self._deadline(name, uid))
        await asyncio.sleep(self.lifetimes.get(uid, 30.0))
        if self.stage.calmed:
            return  # what runs at the calm runs on: the end state is steady
        if self._set_phase(name, uid, "Succeeded"):
            self.stage.count("sched-pod-finished")

    async def _deadline(self, name: str, uid: str) -> None:
        if await end_at_deadline(self.server, self._path(name), uid):
            self.stage.count("sched-deadline-exceeded")

    def _set_phase(self, name: str, uid: str, phase: str) -> bool:
        return set_phase(self.server, self._path(name), uid, phase)
