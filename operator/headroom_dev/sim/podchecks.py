"""What the simulation checks of gated pods, at every change and once all is calm.

The promise of issue 19 is that placement obeys the ledger: a pod leaves the gate
only where its memory was admitted, holds one reservation, and gives it back when
it ends. So, at every change the fake API server applies:

- **ungated only where admitted**: a pod loses the operator's gate only pinned to one
  node (every required term that matches anything requires ``metadata.name In
  [node]``), while the reservation its annotation names — its own, by
  ownerReference — is Admitted on that node in the store: written before the ungate;
- **one reservation per pod**: no pod ever has two live Admitted reservations;
- **no ungate refused**: nothing here refuses a valid ungate (no admission plugin
  of another project), so a reservation reclaimed ``UngateRefused`` means the
  operator sent a patch the API server's own rules refuse, or lost a race it
  should have retried;
- **over-commitment only where it runs**: a reservation admitted ``OverCommitted``
  (exempt from the node limit in :class:`~headroom_dev.sim.checks.Checker`, since the
  scheduler already placed the pod) belongs to a pod that was bound to that node;
- **only the operator's own is recorded**: such a reservation is named as its owner
  pod and owned by it, never one a tenant wrote by hand (issue 29).

What needs a clock (ungated within a resync, no create/delete loop, the condition
after a crash) is in :mod:`headroom_dev.sim.podpromises`.

After quiescence (:meth:`PodChecker.final`):

- a pod that ended or is gone holds nothing: no reservation of its own is Admitted
  or Queued;
- a pod that runs, or was ungated, holds an Admitted reservation of its own, on its
  node (unless its quota's lifetime ran out: the kubelet ends it at its deadline);
- a pod whose claim label went while it was gated is ungated and holds nothing;
- every pod's condition ``headroom.dev/Admitted`` says what its reservation calls for
  (:func:`headroom_dev.sim.podpromises.condition_wrong`);
- a pod still gated is not stuck: its reservation is not Admitted (Admitted but
  gated), a Queued one does not fit its node and its quotas now (under StrictFIFO:
  the oldest one waiting there), and it has a reservation at all if a known node may
  take it (its constraints and its quotas' nodeSelector allow it, and its own wait
  is within their maxWait). One refused (its own wait ran out, or another to be made
  after a backoff) is left alone: the backoff (up to 5 minutes) is longer than the
  calm. A pod waits on the node its reservation was placed on, by design, even if
  another frees up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from headroom.api.constants import RESERVATION_ANNOTATION, WAIT_ANNOTATION
from headroom.api.selectors import LabelSelector
from headroom_dev.sim.checks import Checker
from headroom_dev.sim.podfacts import allows, claims, finished, gated, pinned_to, request_mb
from headroom_dev.sim.podpromises import PodPromises, owner_pod_uid
from headroom_dev.sim.podquotas import governing, quotas_allow, seconds, share

JSON = dict[str, Any]
Key = tuple[str, str]
UNLIMITED = 1 << 62


def _key(obj: JSON) -> Key:
    return (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _phase(obj: JSON) -> str | None:
    phase = (obj.get("status") or {}).get("phase")
    return str(phase) if phase is not None else None


class PodChecker:
    def __init__(
        self, checker: Checker, steady_since: Callable[[], float | None] = lambda: None
    ) -> None:
        self.checker = checker
        self._pods: dict[Key, JSON] = {}  # pods that claim or our gate holds (or did)
        self._reservations: dict[Key, JSON] = {}
        self._admitted: dict[str, set[str]] = {}  # pod uid -> its live Admitted reservations
        self._bound: dict[str, str] = {}  # pod uid -> the node it was bound to
        self._unclaimed: set[str] = set()  # pod uids whose claim label went while gated
        self.promises = PodPromises(self.fail, self._count, checker.now, steady_since=steady_since)

    def fail(self, what: str) -> None:
        self.checker.fail(what)

    def _count(self, what: str) -> None:
        self.checker.counts[what] += 1

    # -- every mutation --------------------------------------------------------------------

    def on_change(self, event_type: str, obj: JSON) -> None:
        kind = obj.get("kind")
        if kind == "Reservation":
            self._on_reservation(event_type, obj)
        elif kind == "Pod":
            self._on_pod(event_type, obj)
        elif kind in ("Node", "HeadroomQuota"):
            self.promises.moved()
        self.promises.judge(self._pods, self._reservations)

    def _on_pod(self, event_type: str, obj: JSON) -> None:
        key, uid = _key(obj), obj["metadata"]["uid"]
        before = self._pods.get(key)
        same = before is not None and before["metadata"]["uid"] == uid
        if not (claims(obj) or gated(obj) or same):
            return  # neither claims nor ever did while we looked: not a gated pod's
        self._pods.pop(key, None)
        if event_type == "DELETED":
            self.promises.pod_changed(key, before if same else None, None)
            return
        self._pods[key] = obj
        if node := (obj.get("spec") or {}).get("nodeName"):
            self._bound.setdefault(uid, node)
        if same and before is not None and gated(before) and claims(before) and not claims(obj):
            self._unclaimed.add(uid)
        if same and before is not None and gated(before) and not gated(obj):
            self.promises.ungated(uid)
            if claims(obj):
                self._ungated(key, obj)
        self.promises.pod_changed(key, before if same else None, obj)

    def _on_reservation(self, event_type: str, obj: JSON) -> None:
        key, uid, pod_uid = _key(obj), obj["metadata"]["uid"], owner_pod_uid(obj)
        if event_type == "DELETED":
            if self._reservations.get(key, {}).get("metadata", {}).get("uid") == uid:
                del self._reservations[key]
        else:
            self._reservations[key] = obj
            over = (obj.get("status") or {}).get("reason") == "OverCommitted"
            named = ((obj.get("spec") or {}).get("owner") or {}).get("pod") == key[1]
            if over and (pod_uid is None or not named):
                self.fail(f"{key}: recorded OverCommitted, but it is not its pod's own")
        if pod_uid is None:
            return
        pod = self._pods.get(key)
        mine = pod if pod is not None and pod["metadata"]["uid"] == pod_uid else None
        self.promises.reservation_changed(event_type, obj, mine)
        live = self._admitted.setdefault(pod_uid, set())
        if event_type == "DELETED" or _phase(obj) != "Admitted":
            if uid in live and (obj.get("status") or {}).get("reason") == "UngateRefused":
                self.fail(f"{key}: the ungate was refused: {obj['status'].get('message')}")
            live.discard(uid)
            return
        if uid in live:
            return
        live.add(uid)
        if len(live) > 1:
            self.fail(f"pod {pod_uid} holds {len(live)} Admitted reservations: {sorted(live)}")
        if (obj.get("status") or {}).get("reason") == "OverCommitted":
            node = obj["spec"]["node"]
            if self._bound.get(pod_uid) != node:
                self.fail(
                    f"{key}: OverCommitted on node {node}, but its pod was bound to "
                    f"{self._bound.get(pod_uid)}"
                )

    def _ungated(self, key: Key, pod: JSON) -> None:
        self.checker.counts["pod-ungated"] += 1
        name = (pod["metadata"].get("annotations") or {}).get(RESERVATION_ANNOTATION)
        reservation = self._reservations.get((key[0], name)) if name else None
        if reservation is None:
            self.fail(f"pod {key} ungated, but its reservation {name!r} does not exist")
            return
        node, phase = reservation["spec"]["node"], _phase(reservation)
        if owner_pod_uid(reservation) != pod["metadata"]["uid"]:
            self.fail(f"pod {key} ungated with reservation {name}, which is not its own")
        elif phase != "Admitted":
            self.fail(f"pod {key} ungated while its reservation {name} is {phase or 'undecided'}")
        elif not pinned_to(pod, node):
            self.fail(f"pod {key} ungated without a pin to node {node}, where it was admitted")

    # -- after quiescence ------------------------------------------------------------------

    def may_wait(self, reservation: JSON) -> bool:
        """Whether a reservation may still be Queued at the end: its pod is gated (a
        pod waits without a time limit); :meth:`final` checks it is not stuck."""
        pod_uid = owner_pod_uid(reservation)
        return any(p["metadata"]["uid"] == pod_uid and gated(p) for p in self._pods.values())

    def final(
        self,
        pods: list[JSON],
        reservations: list[JSON],
        nodes: list[JSON],
        quotas: Sequence[JSON] = (),
        namespaces: dict[str, dict[str, str]] | None = None,
    ) -> None:
        """``quotas``: the HeadroomQuotas; ``namespaces``: each namespace's labels."""
        config = self.checker.config
        strict = config.queueing.strategy == "StrictFIFO"
        max_entries = config.limits.max_entries_per_node
        limit = self.checker.limit_now
        alive = {p["metadata"]["uid"]: p for p in pods}
        own: dict[str, list[JSON]] = {}
        for reservation in reservations:
            pod_uid = owner_pod_uid(reservation)
            if pod_uid is None:
                continue
            own.setdefault(pod_uid, []).append(reservation)
            pod = alive.get(pod_uid)
            if (pod is None or finished(pod)) and _phase(reservation) in ("Admitted", "Queued"):
                why = "is gone" if pod is None else (pod.get("status") or {}).get("phase")
                self.fail(f"{_key(reservation)}: {_phase(reservation)}, but its pod {why}")
        room = NodeRoom(pods, reservations, limit, max_entries)
        by_name = {n["metadata"]["name"]: n for n in nodes}
        named = {_key(r): r for r in reservations}
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if uid in self._unclaimed and not claims(pod) and not finished(pod):
                self._let_go(pod, own.get(uid, []))
            if not claims(pod) or finished(pod):
                continue
            self.promises.check_condition(pod, named.get(_key(pod)), "at quiescence")
            mine = own.get(uid, [])
            held = [r for r in mine if _phase(r) == "Admitted"]
            queued = [r for r in mine if _phase(r) == "Queued"]
            node = (pod.get("spec") or {}).get("nodeName")
            annotations = pod["metadata"].get("annotations") or {}
            if gated(pod):
                if held:
                    self.fail(f"pod {_key(pod)}: its reservation is Admitted, but it stays gated")
                elif queued and room.stuck(
                    queued[0],
                    reservations,
                    strict=strict,
                    quota_allows=lambda r: quotas_allow(r, reservations, quotas, namespaces or {}),
                    sharing=lambda a, b: share(a, b, quotas, namespaces or {}),
                ):
                    self.fail(
                        f"pod {_key(pod)} waits on {queued[0]['spec']['node']}, which has room"
                    )
                elif not mine and self._placeable(pod, by_name, quotas, namespaces or {}):
                    self.fail(
                        f"pod {_key(pod)} stays gated with no reservation, but a node may take it"
                    )
            elif node or RESERVATION_ANNOTATION in annotations:
                if not held and self.promises.expired(uid):
                    self.checker.counts["pod-ran-out"] += 1  # its quota's lifetime: no other
                elif not held:
                    self.fail(f"pod {_key(pod)} runs or was ungated, but holds no reservation")
                elif node and held[0]["spec"]["node"] != node:
                    self.fail(f"pod {_key(pod)} runs on {node}, its memory is held on another node")

    def _let_go(self, pod: JSON, mine: list[JSON]) -> None:
        """A pod whose claim label went while it was gated: let go (ungated) and holding
        nothing (issue 29, item 6), not left behind our gate or with memory booked."""
        self.checker.counts["pod-let-go"] += 1
        if gated(pod):
            self.fail(f"pod {_key(pod)}: its claim label went, yet our gate still holds it")
        for reservation in mine:
            if _phase(reservation) in ("Admitted", "Queued"):
                self.fail(
                    f"pod {_key(pod)}: its claim label went while gated, yet its reservation "
                    f"{reservation['metadata']['name']} is {_phase(reservation)}"
                )

    @staticmethod
    def _placeable(
        pod: JSON,
        nodes: dict[str, JSON],
        quotas: Sequence[JSON],
        namespaces: dict[str, dict[str, str]],
    ) -> bool:
        """Whether a node may take the pod: its constraints allow it, and so do its
        namespace's quotas (their nodeSelector; a wait of its own within their maxWait)."""
        ruling = governing(pod["metadata"]["namespace"], quotas, namespaces)
        wait = (pod["metadata"].get("annotations") or {}).get(WAIT_ANNOTATION)
        for spec in ruling:
            if wait is not None and seconds(wait) > seconds(spec.get("maxWait", "inf")):
                return False  # WaitTooLong, on every node

        def allowed(node: JSON) -> bool:
            node_labels = node["metadata"].get("labels") or {}
            return allows(pod, node) and all(
                LabelSelector.model_validate(spec["nodeSelector"]).matches(node_labels)
                for spec in ruling
                if spec.get("nodeSelector") is not None
            )

        named = (pod["metadata"].get("annotations") or {}).get("headroom.dev/node")
        if named is not None:  # that node only; unknown, it is waited for
            return named not in nodes or allowed(nodes[named])
        return any(allowed(node) for node in nodes.values())


class NodeRoom:
    """Each node's room as the ledger should see it at quiescence, computed again:
    the node's limit, less Admitted reservations, less what bound pods request
    beyond what they hold (the ``podRequests: subtract`` mode)."""

    def __init__(
        self,
        pods: list[JSON],
        reservations: list[JSON],
        limit: Callable[[str], int | None],
        max_entries: int,
    ) -> None:
        self._limit, self._max_entries = limit, max_entries
        self._held: dict[str, int] = {}
        self._entries: dict[str, int] = {}
        claimed: dict[Key, int] = {}  # by (namespace, spec.owner.pod), as the ledger keys it
        for r in reservations:
            if _phase(r) == "Admitted":
                node, ram = r["spec"]["node"], int(r["spec"].get("ramMB", 0))
                self._held[node] = self._held.get(node, 0) + ram
                self._entries[node] = self._entries.get(node, 0) + 1
                owner = (r["spec"].get("owner") or {}).get("pod")
                if owner:
                    key = (r["metadata"]["namespace"], owner)
                    claimed[key] = claimed.get(key, 0) + ram
        self._requested: dict[str, int] = {}
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node and not finished(pod):
                excess = max(0, request_mb(pod) - claimed.get(_key(pod), 0))
                self._requested[node] = self._requested.get(node, 0) + excess

    def free(self, node: str) -> int | None:
        limit = self._limit(node)
        if limit is None or self._entries.get(node, 0) >= self._max_entries:
            return None
        return limit - self._held.get(node, 0) - self._requested.get(node, 0)

    def stuck(
        self,
        queued: JSON,
        reservations: list[JSON],
        *,
        strict: bool,
        quota_allows: Callable[[JSON], bool],
        sharing: Callable[[str, str], bool],
    ) -> bool:
        """Whether ``queued`` could go now: its node and its quotas have room for it (under
        StrictFIFO, for the one that goes first there: the oldest not waiting for its
        quota, nor behind an older one of a namespace sharing a quota that does)."""
        node = queued["spec"]["node"]
        if strict:  # only the oldest waiting there may go
            waiting = sorted(
                (r for r in reservations if _phase(r) == "Queued" and r["spec"]["node"] == node),
                key=lambda r: (r["metadata"]["creationTimestamp"], _key(r)),
            )
            held_back: list[str] = []  # namespaces whose quota's head waits for it
            for head in waiting:
                namespace = head["metadata"]["namespace"]
                if any(sharing(namespace, other) for other in held_back):
                    continue
                if not quota_allows(head):
                    held_back.append(namespace)
                    continue
                queued = head
                break
            else:
                return False
        elif not quota_allows(queued):
            return False
        free = self.free(node)
        return free is not None and int(queued["spec"].get("ramMB", 0)) <= free
