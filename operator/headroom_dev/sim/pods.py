"""Gated pods in the simulation: the cluster around them, played as it behaves.

Issue 19 holds an opted-in pod behind the scheduling gate ``headroom.dev/admission``
until its memory is admitted, then pins it to that node. To prove that with the
real control code, a schedule needs what surrounds those pods, played here:

- tenants create pods the way the mutating webhook leaves them (the claim and owner
  labels, the gate, ``headroom.dev/ram`` and sometimes ``wait`` or ``node``), with
  node selectors, required node affinity (terms ORed, one of them sometimes empty)
  and tolerations that give placement choices; now and then with a foreign gate
  that a quota controller lifts later, or without any (the webhook did not answer,
  under ``failurePolicy: Ignore``);
- kube-scheduler: once a claiming pod has no gate it binds it (``pods/binding``) a
  moment later to a node its hard constraints allow and its memory request fits,
  so the operator's pin decides where it runs;
- the kubelet: a bound pod runs and, after its lifetime, Succeeds or Fails;
- the garbage collector (in some schedules only: nothing may depend on it): a
  reservation whose owner pod is gone is deleted a while later;
- the adversary deletes pods, gated or running, at once (``--force``);
- a tenant writes Pod-liveness reservations by hand that name one of its running
  claim pods, on the pod's node, as large as it likes (issue 29): they must be
  decided like any claim, never recorded past a limit as the pod's own is;
- tenants edit gated pods as Kubernetes lets them (issue 29; the fake API refuses
  the rest, :mod:`headroom_dev.sim.fakeapi.podrules`): the claim label removed, the
  ``headroom.dev/ram`` annotation made unreadable and readable again a while later,
  the size changed, the node selector narrowed by a label only some nodes carry;
  and an admin taints or cordons the node a gated pod's reservation is on, undone a
  while later;
- the kubelet ends a pod at its ``activeDeadlineSeconds`` (Failed,
  ``DeadlineExceeded``), as the operator asks when a quota gives the reservation
  a lifetime.

Nodes get labels and, some, a taint. The placement rules are in
:mod:`headroom_dev.sim.podfacts`, written again rather than the operator's. Only
pods that claim are scheduled; the owner pods of other tenants stay unbound as
before.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any

from headroom.api.constants import (
    CLAIM_LABEL,
    NODE_ANNOTATION,
    OWNER_LABEL,
    RAM_ANNOTATION,
    SCHEDULING_GATE,
    WAIT_ANNOTATION,
)
from headroom.kube.transport import ApiError, resource_path
from headroom_dev.sim.kubelet import end_at_deadline, set_phase
from headroom_dev.sim.podedits import SIZES, GatedPodEdits, Stage
from headroom_dev.sim.podfacts import (
    REQUIRED,
    allows,
    claims,
    finished,
    gated,
    gates,
    memory_mb,
    request_mb,
)

JSON = dict[str, Any]
PodKey = tuple[str, str]
FOREIGN_GATE = "example.com/quota"
TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}


# -- the world ----------------------------------------------------------------------------------


class PodWorld:
    """Tenants' claiming pods, kube-scheduler, the kubelet and the garbage collector."""

    def __init__(self, stage: Stage, namespace: str, seed: float) -> None:
        self.stage, self.server, self.namespace = stage, stage.server, namespace
        self.rng = random.Random(seed)
        self.collects = self.rng.random() < 0.6  # a garbage collector runs
        self.traits: dict[str, tuple[dict[str, str], bool]] = {}  # node -> labels, tainted
        self.names: list[str] = []  # every pod name used; some are used again
        self.lifetimes: dict[str, float] = {}  # pod uid -> seconds it runs
        self._binding: set[PodKey] = set()  # a bind is on its way
        self._unplaced: set[PodKey] = set()  # no node could take it; tried again on a change
        self._started: set[str] = set()  # pod uids the kubelet runs
        self._alive: set[str] = set()
        self._dead: set[str] = set()
        self._collecting = False
        self._hand_named: set[str] = set()  # pods a hand-made reservation names
        self.edits = GatedPodEdits(stage, namespace, self.rng)
        self.server.subscribe(self.on_change)

    def actions(self) -> list[tuple[float, Callable[[], None]]]:
        return [
            (6, self.create_pod),
            (1.5, self.delete_pod),
            (1, self.hand_made_reservation),
            (2, self.edits.edit_gated_pod),
            (1.5, self.edits.cordon_or_taint),
        ]

    # -- nodes ----------------------------------------------------------------------------

    def node_labels(self, name: str) -> dict[str, str | None]:
        """A node's labels, the same whenever it is put (created, resized, back)."""
        if name not in self.traits:
            labels = {"pool": self.rng.choice(["a", "b"])}
            if self.rng.random() < 0.5:
                labels["zone"] = self.rng.choice(["z1", "z2"])
            tainted = self.rng.random() < 0.25
            if tainted:
                labels["dedicated"] = "gpu"
            self.traits[name] = (labels, tainted)
        return dict(self.traits[name][0])

    def node_put(self, name: str) -> None:
        """After the kubelet put the node: its taint (the spec, not the status)."""
        if self.traits[name][1]:
            path = resource_path("", "v1", "nodes", None, name)
            self.server.merge_patch(path, {"spec": {"taints": [TAINT]}})

    # -- tenants --------------------------------------------------------------------------

    def create_pod(self) -> None:
        rng = self.rng
        # A name a hand-made reservation names is not used again: that reservation's owner
        # is the incarnation it was decided for, so a new pod of that name would see it
        # released OwnerPodDeleted, rightly, where the checker reads owners by name.
        reused = [n for n in self.names if self._pod(n) is None and n not in self._hand_named]
        name = rng.choice(reused) if reused and rng.random() < 0.2 else f"pod{len(self.names)}"
        self.names.append(name)
        ram = rng.choice(SIZES)
        annotations = {RAM_ANNOTATION: rng.choice([f"{ram}Mi", str(ram), f"{ram / 1024:g}Gi"])}
        if rng.random() < 0.2:
            annotations[WAIT_ANNOTATION] = f"{rng.randint(5, 60)}s"
        if rng.random() < 0.1:
            annotations[NODE_ANNOTATION] = rng.choice([*sorted(self.traits), "node-9"])
        request = rng.choice([ram, ram, ram + rng.choice([128, 512]), 0])
        container: JSON = {"name": "main", "image": "sim"}
        if request:
            container["resources"] = {"requests": {"memory": f"{request}Mi"}}
        spec: JSON = {"containers": [container], **self._placement()}
        labels = {CLAIM_LABEL: "true"}
        missed = rng.random() < 0.08  # no webhook answered: no gate, no owner label
        if not missed:
            labels[OWNER_LABEL] = "true"
            spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
            if rng.random() < 0.15:
                spec["schedulingGates"].insert(rng.randint(0, 1), {"name": FOREIGN_GATE})
        body = {"metadata": {"name": name, "labels": labels, "annotations": annotations}}
        try:
            pod = self.server.create(
                resource_path("", "v1", "pods", self.namespace), {**body, "spec": spec}
            )
        except ApiError:
            return
        uid = pod["metadata"]["uid"]
        self.lifetimes[uid] = rng.uniform(3, 90)
        self.stage.count("pod-missed" if missed else "pod-gated")
        self.stage.log(f"pod {name} {uid[-4:]} created {'ungated' if missed else 'gated'}")
        if FOREIGN_GATE in gates(pod):
            self.stage.spawn(self._lift_foreign_gate(name, uid, rng.uniform(1, 40)))

    def hand_made_reservation(self) -> None:
        """A Pod-liveness reservation a tenant writes naming a running claim pod of its own
        (not named as the pod, so the operator's own for it can still be made)."""
        running = [
            pod
            for pod in self.server.pods(self.namespace)
            if claims(pod) and pod["spec"].get("nodeName") and not finished(pod)
        ]
        if not running:
            return
        pod = self.rng.choice(running)
        name = pod["metadata"]["name"]
        body = {
            "apiVersion": "headroom.dev/v1alpha1",
            "kind": "Reservation",
            "metadata": {"name": f"hand-{name}-{self.rng.randrange(1000)}"},
            "spec": {
                "node": pod["spec"]["nodeName"],
                "ramMB": self.rng.choice([request_mb(pod) or 256, 4096, 1 << 20]),
                "liveness": "Pod",
                "owner": {"pod": name},
            },
        }
        path = resource_path("headroom.dev", "v1alpha1", "reservations", self.namespace)
        try:
            self.server.create(path, body)
        except ApiError:
            return
        self._hand_named.add(name)
        self.stage.count("pod-hand-made-reservation")

    def _placement(self) -> JSON:
        rng = self.rng
        spec: JSON = {}
        if rng.random() < 0.3:
            spec["nodeSelector"] = {"pool": rng.choice(["a", "b"])}
        if rng.random() < 0.35:
            terms = rng.choice(
                [
                    [{"matchExpressions": [_req("pool", "In", "a", "b")]}],
                    [{"matchExpressions": [_req("zone", "Exists")]}],
                    [{"matchExpressions": [_req("zone", "NotIn", "z1")]}],
                    [
                        {"matchExpressions": [_req("pool", "In", "a")]},
                        {"matchFields": [_req("metadata.name", "In", "node-0")]},
                    ],
                    [{}, {"matchExpressions": [_req("dedicated", "DoesNotExist")]}],
                ]
            )
            spec["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}
        if rng.random() < 0.3:
            spec["tolerations"] = [TOLERATION]
        return spec

    async def _lift_foreign_gate(self, name: str, uid: str, delay: float) -> None:
        """A quota controller lifts its own gate, whatever ours does meanwhile."""
        await asyncio.sleep(delay)
        pod = self._pod(name)
        if pod is None or pod["metadata"]["uid"] != uid or FOREIGN_GATE not in gates(pod):
            return
        left = [{"name": g} for g in gates(pod) if g != FOREIGN_GATE]
        with contextlib.suppress(ApiError):
            self.server.merge_patch(self._path(name), {"spec": {"schedulingGates": left or None}})

    def delete_pod(self) -> None:
        pods = [p for p in self.server.pods(self.namespace) if claims(p)]
        if not pods:
            return
        pod = self.rng.choice(pods)
        name = pod["metadata"]["name"]
        with contextlib.suppress(ApiError):
            self.server.delete(self._path(name), uid=pod["metadata"]["uid"])
            self.stage.count("pod-delete-gated" if gated(pod) else "pod-delete")
            self.stage.log(f"pod {name} deleted{' while gated' if gated(pod) else ''}")

    def _path(self, name: str) -> str:
        return resource_path("", "v1", "pods", self.namespace, name)

    def _pod(self, name: str) -> JSON | None:
        return self.server.get(self._path(name))

    # -- the scheduler, the kubelet, the garbage collector ----------------------------------------

    def on_change(self, event_type: str, obj: JSON) -> None:
        """Every change the server makes (never a write from here: those are spawned)."""
        kind = obj.get("kind")
        if kind == "Node":
            self._retry_unplaced()
        elif kind == "Reservation" and self.collects and event_type != "DELETED":
            owners = {r.get("uid") for r in obj["metadata"].get("ownerReferences") or []}
            if owners & self._dead:
                self._collect_soon()
        elif kind == "Pod" and claims(obj):
            self._on_pod(event_type, obj)

    def _on_pod(self, event_type: str, pod: JSON) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        key, uid = (meta["namespace"], meta["name"]), meta["uid"]
        phase = (pod.get("status") or {}).get("phase")
        if event_type == "DELETED" or finished(pod):
            if event_type == "DELETED":
                self._alive.discard(uid)
                self._dead.add(uid)
                if self.collects:
                    self._collect_soon()
            self._unplaced.discard(key)
            self._retry_unplaced()  # its memory is free again
            return
        self._alive.add(uid)
        if not spec.get("nodeName") and not gates(pod) and key not in self._binding:
            self._binding.add(key)
            self.stage.spawn(self._bind(key, uid, self.rng.uniform(0.05, 2)))
        elif spec.get("nodeName") and phase == "Pending" and uid not in self._started:
            self._started.add(uid)
            self.stage.spawn(self._run(key, uid))

    def _retry_unplaced(self) -> None:
        for key in sorted(self._unplaced):
            pod = self._pod(key[1])
            if pod is not None:
                self._on_pod("MODIFIED", pod)
        self._unplaced.clear()

    async def _bind(self, key: PodKey, uid: str, delay: float) -> None:
        await asyncio.sleep(delay)
        self._binding.discard(key)
        pod = self._pod(key[1])
        if pod is None or pod["metadata"]["uid"] != uid or pod["spec"].get("nodeName"):
            return
        request = request_mb(pod)
        used: dict[str, int] = {}
        for other in self.server.pods():
            node = (other.get("spec") or {}).get("nodeName")
            if node and not finished(other):
                used[node] = used.get(node, 0) + request_mb(other)
        nodes = [
            n["metadata"]["name"]
            for n in self.server.nodes()
            if allows(pod, n) and used.get(n["metadata"]["name"], 0) + request <= memory_mb(n)
        ]
        if not nodes:
            self._unplaced.add(key)  # FailedScheduling: tried again when something changes
            return
        node = self.rng.choice(nodes)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": key[1], "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            self.server.create(self._path(key[1]) + "/binding", binding)
        except ApiError as error:
            self.stage.log(f"pod {key[1]} not bound: {error}")
            return
        self.stage.count("pod-bound")
        self.stage.log(f"pod {key[1]} bound to {node}")

    async def _run(self, key: PodKey, uid: str) -> None:
        """The kubelet: the pod runs, and ends after its lifetime (not once all is calm),
        or at its ``activeDeadlineSeconds`` from its start (calm or not), Failed."""
        await asyncio.sleep(self.rng.uniform(0.2, 2))
        if not self._set_phase(key, uid, "Running"):
            return
        self.stage.spawn(self._deadline(key, uid))
        await asyncio.sleep(self.lifetimes.get(uid, 30.0))
        if self.stage.calmed:
            return  # what runs at the calm runs on: the end state is steady
        phase = "Succeeded" if self.rng.random() < 0.8 else "Failed"
        if self._set_phase(key, uid, phase):
            self.stage.count("pod-finished")
            self.stage.log(f"pod {key[1]} {phase}")

    async def _deadline(self, key: PodKey, uid: str) -> None:
        """The kubelet's active deadline, counted from the pod's start."""
        if await end_at_deadline(self.server, self._path(key[1]), uid):
            self.stage.count("pod-deadline-exceeded")
            self.stage.log(f"pod {key[1]} Failed: DeadlineExceeded")

    def _set_phase(self, key: PodKey, uid: str, phase: str) -> bool:
        return set_phase(self.server, self._path(key[1]), uid, phase)

    def _collect_soon(self) -> None:
        if not self._collecting:
            self._collecting = True
            self.stage.spawn(self._collect(self.rng.uniform(1, 30)))

    async def _collect(self, delay: float) -> None:
        """The garbage collector: dependents of an owner that is gone are deleted."""
        await asyncio.sleep(delay)
        self._collecting = False
        for reservation in self.server.reservations():
            meta = reservation["metadata"]
            owners = {r.get("uid") for r in meta.get("ownerReferences") or []}
            if owners & self._dead and not owners & self._alive:
                path = resource_path(
                    "headroom.dev", "v1alpha1", "reservations", meta["namespace"], meta["name"]
                )
                with contextlib.suppress(ApiError):
                    self.server.delete(path, uid=meta["uid"])
                    self.stage.count("gc-delete")


def _req(key: str, operator: str, *values: str) -> JSON:
    requirement: JSON = {"key": key, "operator": operator}
    if values:
        requirement["values"] = list(values)
    return requirement
