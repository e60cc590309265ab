"""What the simulation checks of pods the ``headroom`` scheduler binds through the extender.

The promise of issue 30 is that such a pod runs only where its claim was admitted, on
a node kube-scheduler chose, whatever crashes, leader changes and retries of the same
pod come between the filter and the bind. So, at every change the fake API server
applies:

- **bound only where admitted**: when a pod gets its node, the reservation named as
  it and owned by it is Admitted on that node in the store (written before the
  Binding);
- **one admission per pod**: no pod ever has two live Admitted reservations;

and once all is calm (:meth:`ScheduledChecker.final`):

- a pod that runs holds an Admitted reservation of its own on its node (or had it
  expire, by its quota's lifetime, less than :data:`KILLED_WITHIN` ago: the kubelet
  ends it at the deadline the bind set, counted from its start); one that ended or is
  gone holds nothing Admitted or Queued;
- no pod left unbound holds an admission older than ``bindGrace`` and a resync:
  the fence gives back what a bind that never came was admitted;
- a pod left unbound and waiting in a node's queue is not stuck: that node and its
  quotas have no room for it now (under StrictFIFO, for the one that goes first
  there), as for a gated pod (:class:`headroom_dev.sim.podchecks.NodeRoom`).

Never overcommit, and reclaim only the silent, are the reservations' own checks
(:class:`headroom_dev.sim.checks.Checker`), which see these reservations too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from headroom_dev.sim.checks import Checker
from headroom_dev.sim.podchecks import NodeRoom
from headroom_dev.sim.podfacts import finished
from headroom_dev.sim.podpromises import owner_pod_uid
from headroom_dev.sim.podquotas import quotas_allow, share
from headroom_dev.sim.scheduled import waits_for_scheduler

JSON = dict[str, Any]
Key = tuple[str, str]
LIVE = ("Admitted", "Queued")
#: A pod starts within 2 s of its bind, so it runs at most that long past its expiry.
KILLED_WITHIN = 5.0


def _key(obj: JSON) -> Key:
    return (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _phase(obj: JSON) -> str | None:
    phase = (obj.get("status") or {}).get("phase")
    return str(phase) if phase is not None else None


class ScheduledChecker:
    def __init__(self, checker: Checker, bind_grace: float, now: Callable[[], float]) -> None:
        self.checker, self.bind_grace, self.now = checker, bind_grace, now
        self._reservations: dict[Key, JSON] = {}
        self._admitted_at: dict[Key, float] = {}  # reservation -> when it became Admitted
        self._expired_at: dict[str, float] = {}  # reservation uid -> when it was, Expired
        self._pods: dict[Key, JSON] = {}

    def fail(self, what: str) -> None:
        self.checker.fail(what)

    def on_change(self, event_type: str, obj: JSON) -> None:
        kind = obj.get("kind")
        if kind == "Reservation":
            self._on_reservation(event_type, obj)
        elif kind == "Pod" and waits_for_scheduler(obj):
            self._on_pod(event_type, obj)

    def _on_reservation(self, event_type: str, obj: JSON) -> None:
        key = _key(obj)
        if event_type == "DELETED":
            self._reservations.pop(key, None)
            self._admitted_at.pop(key, None)
            return
        before = self._reservations.get(key)
        self._reservations[key] = obj
        admitted = _phase(obj) == "Admitted"
        same = before is not None and before["metadata"]["uid"] == obj["metadata"]["uid"]
        if admitted and not (same and before is not None and _phase(before) == "Admitted"):
            self._admitted_at[key] = self.now()
        elif not admitted:
            self._admitted_at.pop(key, None)
        if (obj.get("status") or {}).get("reason") == "Expired" and _phase(obj) == "Reclaimed":
            self._expired_at.setdefault(obj["metadata"]["uid"], self.now())
        owner = owner_pod_uid(obj)
        if owner is not None and admitted:
            mine = [r for r in self._owned_by(owner) if _phase(r) == "Admitted"]
            if len(mine) > 1:
                names = sorted(r["metadata"]["name"] for r in mine)
                self.fail(f"pod uid {owner}: two Admitted reservations at once: {names}")

    def _owned_by(self, pod_uid: str) -> list[JSON]:
        return [r for r in self._reservations.values() if owner_pod_uid(r) == pod_uid]

    def _on_pod(self, event_type: str, obj: JSON) -> None:
        key = _key(obj)
        before = self._pods.pop(key, None)
        if event_type == "DELETED":
            return
        self._pods[key] = obj
        node = (obj.get("spec") or {}).get("nodeName")
        was = (before or {}).get("spec", {}).get("nodeName") if before is not None else None
        if node and not was:
            self._bound(key, obj, node)

    def _bound(self, key: Key, pod: JSON, node: str) -> None:
        self.checker.counts["sched-bound-checked"] += 1
        reservation = self._reservations.get(key)
        uid = pod["metadata"]["uid"]
        if reservation is None or owner_pod_uid(reservation) != uid:
            self.fail(f"pod {key} bound to {node} without a reservation of its own")
        elif _phase(reservation) != "Admitted" or reservation["spec"].get("node") != node:
            self.fail(
                f"pod {key} bound to {node}, its reservation {_phase(reservation)} on "
                f"{reservation['spec'].get('node')}"
            )

    def may_wait(self, reservation: JSON) -> bool:
        """Whether a reservation may still be Queued at the end: its pod waits unbound
        for the scheduler (as long as it likes); :meth:`final` checks it is not stuck."""
        owner = owner_pod_uid(reservation)
        return any(
            p["metadata"]["uid"] == owner and not p["spec"].get("nodeName") and not finished(p)
            for p in self._pods.values()
        )

    def final(
        self,
        pods: list[JSON],
        reservations: list[JSON],
        quotas: Sequence[JSON] = (),
        namespaces: dict[str, dict[str, str]] | None = None,
    ) -> None:
        """Once calm: a running pod holds its admission, nothing else holds one long, no
        waiter is stuck. ``quotas``: the HeadroomQuotas; ``namespaces``: their labels."""
        config = self.checker.config
        room = NodeRoom(
            pods, reservations, self.checker.limit_now, config.limits.max_entries_per_node
        )
        labels = namespaces or {}
        named = {_key(r): r for r in reservations}
        live: dict[str, list[JSON]] = {}
        for reservation in reservations:
            owner = owner_pod_uid(reservation)
            if owner is not None and _phase(reservation) in LIVE:
                live.setdefault(owner, []).append(reservation)
        present = {p["metadata"]["uid"] for p in pods}
        for owner, held in live.items():
            if owner not in present and any(_made_for_its_pod(r) for r in held):
                self.fail(f"pod uid {owner} is gone but holds {_names(held)}")
        now = self.now()
        for pod in (p for p in pods if waits_for_scheduler(p)):
            key, uid = _key(pod), pod["metadata"]["uid"]
            node = (pod.get("spec") or {}).get("nodeName")
            held = live.get(uid, [])
            if finished(pod):
                if held:
                    self.fail(f"pod {key} ended but holds {_names(held)}")
            elif node:
                self.checker.counts["sched-final-running"] += 1
                if any(_phase(r) == "Admitted" and r["spec"]["node"] == node for r in held):
                    continue
                own = named.get(key)
                mine = own is not None and owner_pod_uid(own) == uid
                expired = self._expired_at.get(own["metadata"]["uid"]) if mine and own else None
                if expired is not None and now - expired <= KILLED_WITHIN:
                    self.checker.counts["sched-ran-out"] += 1
                    continue
                self.fail(f"pod {key} runs on {node} without its admission: {_names(held)}")
            else:
                queued = [r for r in held if _phase(r) == "Queued"]
                if queued and room.stuck(
                    queued[0],
                    reservations,
                    strict=config.queueing.strategy == "StrictFIFO",
                    quota_allows=lambda r: quotas_allow(r, reservations, quotas, labels),
                    sharing=lambda a, b: share(a, b, quotas, labels),
                ):
                    self.fail(f"pod {key} waits on {queued[0]['spec']['node']}, which has room")
                for reservation in held:
                    since = self._admitted_at.get(_key(reservation))
                    if since is not None and now - since > self.bind_grace + 35:
                        self.fail(
                            f"pod {key} unbound, holding {reservation['metadata']['name']} "
                            f"admitted {now - since:.0f}s ago"
                        )
                self.checker.counts["sched-final-unbound"] += 1


def _made_for_its_pod(reservation: JSON) -> bool:
    """Whether the operator made it for a pod (named as its owner pod, owned by it)."""
    pod = ((reservation.get("spec") or {}).get("owner") or {}).get("pod")
    return pod == reservation["metadata"]["name"] and owner_pod_uid(reservation) is not None


def _names(reservations: list[JSON]) -> list[str]:
    return sorted(f"{r['metadata']['name']} ({_phase(r)})" for r in reservations)
