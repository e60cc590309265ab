"""Edits of gated pods, and of their nodes, as tenants and admins make them (issue 29).

Kubernetes lets a gated pod's labels and annotations change freely and its node
selector and required affinity narrow (additions only; the fake API refuses the
rest, as kube-apiserver does: :mod:`headroom_dev.sim.fakeapi.podrules`); Kueue and
people do so. Each edit here is one the operator must survive without stranding the
pod or holding memory for nothing: the claim label removed (the pod is let go), the
``headroom.dev/ram`` annotation made unreadable (its reservation released) and
readable again a while later, the size changed (a reservation for the old size is
of no use), the node selector narrowed by a label only some nodes carry; and an
admin cordons or taints the node a gated pod's reservation is on, and undoes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Coroutine
from typing import Any, Protocol

from headroom.api.constants import CLAIM_LABEL, RAM_ANNOTATION
from headroom.kube.transport import ApiError, resource_path
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.podfacts import claims, gated

JSON = dict[str, Any]
MAINTENANCE = {"key": "maintenance", "effect": "NoSchedule"}  # an admin's, tolerated by none
SIZES = (256, 512, 1024, 2048)  # MiB a pod claims
BAD_SIZES = ("lots", "12XB", "-1Gi")  # unreadable claims


class Stage(Protocol):
    """What of the schedule (``headroom_dev.sim.driver``) the pods' world uses."""

    server: FakeApiServer
    calmed: bool

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None: ...
    def now(self) -> float: ...
    def count(self, what: str) -> None: ...
    def log(self, line: str) -> None: ...


class GatedPodEdits:
    """The edits, on the pods of one namespace."""

    def __init__(self, stage: Stage, namespace: str, rng: random.Random) -> None:
        self.stage, self.server, self.namespace, self.rng = stage, stage.server, namespace, rng
        self._node_edits: dict[str, int] = {}  # node -> edits not undone yet

    def edit_gated_pod(self) -> None:
        """A tenant edits a gated pod, as the API server lets it while the pod is gated:
        labels and annotations freely, the node selector by additions only."""
        pods = [p for p in self.server.pods(self.namespace) if claims(p) and gated(p)]
        if not pods:
            return
        pod = self.rng.choice(pods)
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        annotations = pod["metadata"].get("annotations") or {}
        move = self.rng.choices(
            ["unclaim", "unreadable", "resize", "narrow"], [0.15, 0.25, 0.3, 0.3]
        )[0]
        if move == "unclaim":
            patch: JSON = {"metadata": {"labels": {CLAIM_LABEL: None}}}
        elif move == "unreadable":
            patch = {"metadata": {"annotations": {RAM_ANNOTATION: self.rng.choice(BAD_SIZES)}}}
        elif move == "resize":
            sizes = [s for s in (f"{mb}Mi" for mb in SIZES) if s != annotations.get(RAM_ANNOTATION)]
            patch = {"metadata": {"annotations": {RAM_ANNOTATION: self.rng.choice(sizes)}}}
        else:  # a label some nodes carry, on a key the selector does not have yet
            selector = pod["spec"].get("nodeSelector") or {}
            keys = [k for k in ("pool", "zone") if k not in selector]
            if not keys:
                return
            key = self.rng.choice(keys)
            value = self.rng.choice(["a", "b"] if key == "pool" else ["z1", "z2"])
            patch = {"spec": {"nodeSelector": {key: value}}}
        try:
            self.server.merge_patch(self._path(name), patch)
        except ApiError as error:
            self.stage.log(f"pod {name}: {move} refused: {error}")
            return
        self.stage.count(f"pod-edit-{move}")
        self.stage.log(f"pod {name} {uid[-4:]} edited while gated: {move} {patch}")
        if move == "unreadable":
            self.stage.spawn(self._readable_again(name, uid, self.rng.uniform(1, 25)))

    async def _readable_again(self, name: str, uid: str, delay: float) -> None:
        await asyncio.sleep(delay)
        pod = self._pod(name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        value = (pod["metadata"].get("annotations") or {}).get(RAM_ANNOTATION)
        if value not in BAD_SIZES:
            return
        size = f"{self.rng.choice(SIZES)}Mi"
        with contextlib.suppress(ApiError):
            self.server.annotate(self._path(name), {RAM_ANNOTATION: size})
            self.stage.log(f"pod {name} {uid[-4:]} readable again: {size}")

    def cordon_or_taint(self) -> None:
        """An admin cordons or taints the node a gated pod's reservation is on (a pod
        that does not tolerate it may no longer go there), and undoes it a while later."""
        held = [
            r["spec"]["node"]
            for r in self.server.reservations()
            if r["metadata"]["namespace"] == self.namespace
            and (pod := self._pod(r["metadata"]["name"])) is not None
            and gated(pod)
        ]
        if not held:
            return
        node = self.rng.choice(sorted(held))
        current = self._node(node)
        if current is None:
            return
        spec = current.get("spec") or {}
        if self.rng.random() < 0.5:
            patch: JSON = {"spec": {"unschedulable": True}}
            what = "cordon"
        else:
            patch = {"spec": {"taints": [*(spec.get("taints") or []), MAINTENANCE]}}
            what = "taint"
        self.server.merge_patch(resource_path("", "v1", "nodes", None, node), patch)
        self._node_edits[node] = self._node_edits.get(node, 0) + 1
        self.stage.count(f"pod-node-{what}")
        self.stage.log(f"node {node}: {what} while a gated pod's reservation is there")
        self.stage.spawn(self._undo_node_edit(node, self.rng.uniform(2, 30)))

    async def _undo_node_edit(self, node: str, delay: float) -> None:
        await asyncio.sleep(delay)
        self._node_edits[node] -= 1
        current = self._node(node)
        if current is None or self._node_edits[node]:
            return  # gone, or edited again since: the last undo clears both
        spec = current.get("spec") or {}
        taints = [t for t in spec.get("taints") or [] if t != MAINTENANCE]
        patch = {"spec": {"unschedulable": None, "taints": taints or None}}
        self.server.merge_patch(resource_path("", "v1", "nodes", None, node), patch)
        self.stage.log(f"node {node}: uncordoned and untainted")

    def _node(self, name: str) -> JSON | None:
        return self.server.get(resource_path("", "v1", "nodes", None, name))

    def _path(self, name: str) -> str:
        return resource_path("", "v1", "pods", self.namespace, name)

    def _pod(self, name: str) -> JSON | None:
        return self.server.get(self._path(name))
