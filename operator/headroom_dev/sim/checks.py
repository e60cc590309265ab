"""What the simulation checks, at every mutation and once a schedule has quiesced.

At every change the fake API server applies (``FakeApiServer.subscribe``):

- **never over a node's limit**: when a reservation becomes Admitted by a new
  decision, the Admitted RAM on its node (gated pods' reservations included) is
  within the node's limit; only a pod the scheduler already placed there may be
  recorded over it (``OverCommitted``; a tenant's reservation recorded so is judged
  as any decision, against the node and its quotas), and a decision taken before such a record
  is not pushed over by it when its status lands after it. The limit is the
  largest the node had in the last ``SHRINK_GRACE`` seconds: a decision taken
  before the operator could know of a shrink is not an overcommit of the
  operator's making (the ledger's own arithmetic is proven by property tests);
- **decided once**: a reservation carries one Admitted or Rejected decision
  (its decisionID) in its life, and Admitted may only become Reclaimed;
- **never drop the living**: a reservation reclaimed as stale at time t had no
  heartbeat written (on itself or its owner pod) after t − window, was admitted
  at least a window before t, and the operator that reclaimed it had been
  running for a window; one reclaimed as OwnerPodDeleted has no owner pod (a
  gated pod's: no pod of that incarnation, as its ownerReference names it);
- **one decider**: with leader election, a new decision comes from the replica
  that holds the Lease at that moment (decision ids carry the run id);
- **every write is the truth when it is sent**: a status that lands says what
  the writing operator's record said at most ``LANDING_SLACK`` seconds before
  (the network's latency), unless that operator's network was paused meanwhile;
- **strict FIFO**: under that strategy, a reservation that waited is admitted only
  when no older one still waits on its node in the deciding operator's ledger
  (but another tenant's waiting for its own quota);
- **never over a quota** (:mod:`headroom_dev.sim.quotachecks`);
- **no NodeUnknown for a known node**: a reservation is not refused NodeUnknown
  when its node was there, with a known capacity, from before the reservation
  was created until the refusal landed.

After the schedule quiesces (:meth:`Checker.final`): every reservation is
decided (a gated pod's may still be Queued: it waits as long as its pod), its
status is the live operator's truth, and the operator remembers nothing that is
gone (but what was deleted that moment, the answer on its way). Gated pods have
checks of their own: :mod:`headroom_dev.sim.podchecks`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headroom.api.config import OperatorConfig
from headroom.api.constants import HEARTBEAT_ANNOTATION
from headroom.control.controller import Controller
from headroom.ledger.node import NodeState
from headroom.objects.nodes import node_capacity
from headroom_dev.sim.devicechecks import DeviceBook
from headroom_dev.sim.quotachecks import QuotaBook

JSON = dict[str, Any]
SHRINK_GRACE = 90.0  # seconds: a lost Node event is caught by the resync (30 s) and a relist
LANDING_SLACK = 0.5  # seconds: the fake network's latency is at most 0.05 s each way


def _owner_pod_uid(reservation: JSON) -> str | None:
    for ref in reservation["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1":
            return str(ref.get("uid"))
    return None


def _decided_after(over: str | None, decision: str) -> bool:
    """Whether the over-commitment ``over`` was decided after ``decision`` by the same
    run (decision ids count up per run): then the ledger decided ``decision`` without
    it, and a status that lands late is not pushed over the limit by it."""
    if over is None:
        return False
    run, _, number = over.rpartition("-")
    mine, _, own = decision.rpartition("-")
    return run == mine and number.isdigit() and own.isdigit() and int(number) > int(own)


@dataclass
class Replica:
    """One operator process of the simulation, as the checker needs to know it."""

    identity: str
    run_id: str
    started_at: float  # when its controller began watching (its rebuild)
    controller: Controller | None = None


@dataclass
class Checker:
    config: OperatorConfig
    now: Callable[[], float]
    lease: Callable[[], JSON | None]  # the Lease in the store, when leader election is on
    paused: Callable[[str, float, float], bool] = lambda run_id, since, until: False
    #: The provisional holds in the ledger of the replica that took ``decision``:
    #: (namespace, node, MiB) each (:mod:`headroom_dev.sim.reviewchecks`).
    provisional: Callable[[str], list[tuple[str, str, int]]] = lambda decision: []
    window: float = 0.0
    violations: list[str] = field(default_factory=list)
    replicas: dict[str, Replica] = field(default_factory=dict)  # run id -> replica
    deciders: list[Replica] = field(default_factory=list)  # controllers started, in order
    _limits: dict[str, list[tuple[float, int | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    _nodes: dict[str, JSON] = field(default_factory=dict)
    _phase: dict[str, str] = field(default_factory=dict)
    _status: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # uid -> (phase, id)
    _decision: dict[str, str] = field(default_factory=dict)
    _admitted_at: dict[str, float] = field(default_factory=dict)
    _admitted: dict[str, tuple[str, int]] = field(default_factory=dict)  # uid -> (node, MiB)
    _beats: dict[tuple[str, str, str], float] = field(default_factory=dict)  # last beat
    _pods: set[tuple[str, str]] = field(default_factory=set)
    _pod_uids: set[str] = field(default_factory=set)
    _over: dict[str, str] = field(default_factory=dict)  # uid -> decisionID, OverCommitted
    _deleted_at: dict[str, float] = field(default_factory=dict)
    _created: dict[str, float] = field(default_factory=dict)  # uid -> when it appeared
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _last_value: dict[tuple[str, str, str], str] = field(default_factory=dict)
    devices: DeviceBook = field(init=False)
    quotas: QuotaBook = field(init=False)

    def __post_init__(self) -> None:
        self.window = self.config.limits.heartbeat_stale_window.total_seconds()
        self.devices = DeviceBook(self.fail, self._count)
        self.quotas = QuotaBook(self.fail, self._count, self.now)

    def _count(self, what: str) -> None:
        self.counts[what] += 1

    def fail(self, what: str) -> None:
        self.violations.append(f"t={self.now():.3f}: {what}")

    # -- every mutation --------------------------------------------------------------------

    def on_change(self, event_type: str, obj: JSON) -> None:
        kind = obj.get("kind")
        meta = obj.get("metadata") or {}
        if kind == "Node":
            self._on_node(event_type, obj)
        elif kind == "Pod":
            key = (meta.get("namespace", ""), meta.get("name", ""))
            if event_type == "DELETED":
                self._pods.discard(key)
                self._pod_uids.discard(meta.get("uid", ""))
            else:
                self._pods.add(key)
                self._pod_uids.add(meta.get("uid", ""))
                self._beat("Pod", key, obj)
        elif kind == "Reservation":
            self._on_reservation(event_type, obj)
        elif kind == "Namespace":
            self.quotas.on_namespace(event_type, obj)
        elif kind == "HeadroomQuota":
            self.quotas.on_quota(event_type, obj)

    def _on_node(self, event_type: str, obj: JSON) -> None:
        name = obj["metadata"]["name"]
        limit: int | None = None
        if event_type != "DELETED":
            self._nodes[name] = obj
            capacity = node_capacity(obj, self.config.limits.to_limits(), "allocatable")
            if capacity.total_ram_mb is not None:
                state = NodeState(name, capacity.limits, capacity.total_ram_mb)
                limit = state.limit_ram_mb()
                if limit is None:  # ratio 0: unlimited
                    limit = 1 << 62
        else:
            self._nodes.pop(name, None)
        self._limits[name].append((self.now(), limit))
        self.devices.on_node(name, None if event_type == "DELETED" else obj)

    def _limit(self, node: str) -> int | None:
        """The largest limit the node had in the last SHRINK_GRACE seconds (None: unknown)."""
        history = self._limits.get(node) or []
        recent = [limit for at, limit in history if at >= self.now() - SHRINK_GRACE]
        if history:
            recent.append(history[-1][1])  # in force now, whenever it was set
        known = [limit for limit in recent if limit is not None]
        return max(known) if known else None

    def limit_now(self, node: str) -> int | None:
        """The node's limit as it stands now (None: unknown, or no such node now)."""
        history = self._limits.get(node) or []
        return history[-1][1] if history else None

    def _beat(self, kind: str, key: tuple[str, str], obj: JSON) -> None:
        value = ((obj.get("metadata") or {}).get("annotations") or {}).get(HEARTBEAT_ANNOTATION)
        marker = (kind, *key)
        if value is not None and value != self._last_value.get(marker):
            self._last_value[marker] = value
            self._beats[marker] = self.now()

    def _on_reservation(self, event_type: str, obj: JSON) -> None:
        meta, status = obj["metadata"], obj.get("status") or {}
        uid, key = meta["uid"], (meta["namespace"], meta["name"])
        if event_type == "DELETED":
            self._admitted.pop(uid, None)
            self.devices.released(uid)
            self.quotas.released(uid)
            self._deleted_at[uid] = self.now()
            return
        self._created.setdefault(uid, self.now())
        self._beat("Reservation", key, obj)
        phase, decision = status.get("phase"), status.get("decisionID")
        before = self._phase.get(uid)
        if phase is None or self._status.get(uid) == (phase, decision):
            return  # not a status change (an annotation, a queue position)
        self._status[uid] = (phase, decision)
        if before == "Rejected" or (before == "Reclaimed" and phase != "Reclaimed"):
            self.fail(f"{key}: {before} became {phase}")
        if before == "Admitted" and phase not in ("Admitted", "Reclaimed"):
            self.fail(f"{key}: Admitted became {phase}")
        if phase == "Queued" and before not in (None, "Queued"):
            self.fail(f"{key}: {before} became Queued")
        if phase == "Admitted" and before == "Queued":
            self._strict_fifo(key, obj, str(decision))
        if phase in ("Admitted", "Rejected"):
            if uid in self._decision and self._decision[uid] != decision:
                self.fail(f"{key}: decided twice ({self._decision[uid]}, then {decision})")
            self._decision[uid] = str(decision)
            self._one_decider(key, str(decision))
        self._phase[uid] = str(phase)
        self.counts[f"{phase}/{status.get('reason')}"] += 1
        self._truth_when_sent(uid, key, status)
        if phase == "Rejected" and status.get("reason") == "NodeUnknown":
            self._node_unknown(uid, key, obj["spec"]["node"])
        if phase == "Admitted" and before != "Admitted":
            self._admission(uid, key, obj)
        elif phase == "Reclaimed":
            self._admitted.pop(uid, None)
            self.devices.released(uid)
            self.quotas.released(uid)
            self._reclaim(uid, key, obj, status)

    def _admission(self, uid: str, key: tuple[str, str], obj: JSON) -> None:
        node, ram = obj["spec"]["node"], int(obj["spec"]["ramMB"])
        self._admitted[uid] = (node, ram)
        self._admitted_at[uid] = self.now()
        decision = str((obj.get("status") or {}).get("decisionID"))
        self.devices.admitted(
            uid,
            key,
            obj,
            lambda other: (
                other in self._admitted and not _decided_after(self._over.get(other), decision)
            ),
        )
        # Only a pod's own (named as its owner pod, owned by a pod) may be recorded past the
        # node's limit and its quotas; one a tenant wrote is judged as any decision (the
        # pod checker also fails it for its OverCommitted).
        named = ((obj.get("spec") or {}).get("owner") or {}).get("pod") == key[1]
        own = named and _owner_pod_uid(obj) is not None
        forced = own and (obj.get("status") or {}).get("reason") == "OverCommitted"
        held = [] if forced else self.provisional(decision)
        self.quotas.admitted(uid, key, ram, forced, [(ns, mb) for ns, _, mb in held])
        if forced:
            self._over[uid] = decision
            return  # a pod already running there, recorded as it is (podchecks checks that)
        limit = self._limit(node)
        provisional = sum(mb for _, n, mb in held if n == node)
        total = provisional + sum(
            mb
            for other, (n, mb) in self._admitted.items()
            if n == node and not _decided_after(self._over.get(other), decision)
        )
        if limit is None:
            self.fail(f"{key}: admitted on node {node}, whose capacity was never known")
        elif total > limit:
            self.fail(
                f"{key}: admitted {ram} MiB pushed node {node} to {total} > limit {limit}"
                + (f" ({provisional} MiB of it provisional holds)" if provisional else "")
            )

    def committed_on(self, node: str) -> int:
        """The Admitted RAM on ``node`` in the store now (a pod's forced records too)."""
        return sum(mb for n, mb in self._admitted.values() if n == node)

    def _truth_when_sent(self, uid: str, key: tuple[str, str], status: JSON) -> None:
        now = self.now()
        for replica in self.replicas.values():
            controller = replica.controller
            record = controller.state.records.get(uid) if controller is not None else None
            if record is None or record.decision.matches(status):
                continue
            if now - record.changed_at <= LANDING_SLACK:
                continue
            writer = str(status.get("decisionID") or "").split("-", 1)[0]
            if writer and writer != replica.run_id:
                continue  # another replica's decision (a takeover): not this one's write
            if self.paused(replica.run_id, record.changed_at, now):
                continue
            self.fail(
                f"{key}: {status.get('phase')} landed {now - record.changed_at:.2f}s after "
                f"{replica.run_id}'s truth became {record.decision.phase}"
            )

    def _strict_fifo(self, key: tuple[str, str], obj: JSON, decision: str) -> None:
        if self.config.queueing.strategy != "StrictFIFO":
            return
        replica = self.replicas.get(decision.split("-", 1)[0])
        controller = replica.controller if replica is not None else None
        if controller is None:
            return
        created = (obj["metadata"].get("creationTimestamp") or "", key)
        quotas = controller.state.ledger.quotas
        for waiting in controller.state.ledger.waiting.on(obj["spec"]["node"]):
            if waiting.for_quota and not quotas.share(key[0], waiting.entry_id.split("/")[0]):
                continue  # another tenant's, waiting for its own quota
            ahead = waiting.entry.created_at.strftime("%Y-%m-%dT%H:%M:%SZ")
            if (ahead, tuple(waiting.entry.id.split("/", 1))) < created:
                self.fail(f"{key}: admitted while {waiting.entry.id} still waits ahead of it")

    def _node_unknown(self, uid: str, key: tuple[str, str], node: str) -> None:
        created = self._created.get(uid, self.now())
        history = self._limits.get(node) or []
        before = [limit for at, limit in history if at <= created]
        since = [limit for at, limit in history if at > created]
        if before and before[-1] is not None and all(limit is not None for limit in since):
            self.fail(f"{key}: refused NodeUnknown, but node {node} was known all along")

    def _reclaim(self, uid: str, key: tuple[str, str], obj: JSON, status: JSON) -> None:
        reason, now = status.get("reason"), self.now()
        if reason == "HeartbeatStale":
            pod = ((obj.get("spec") or {}).get("owner") or {}).get("pod")
            beats = [self._beats.get(("Reservation", *key), -1e9)]
            if pod:
                beats.append(self._beats.get(("Pod", key[0], pod), -1e9))
            last = max(beats)
            if last > now - self.window + 1e-6:
                self.fail(f"{key}: reclaimed as stale, but its owner beat {now - last:.2f}s ago")
            admitted = self._admitted_at.get(uid, -1e9)
            if admitted > now - self.window + 1e-6:
                self.fail(f"{key}: reclaimed as stale {now - admitted:.2f}s after its admission")
            started = self.deciders[-1].started_at if self.deciders else -1e9
            if started > now - self.window + 1e-6:
                self.fail(f"{key}: reclaimed as stale {now - started:.2f}s after a start")
        elif reason == "OwnerPodDeleted":
            pod = ((obj.get("spec") or {}).get("owner") or {}).get("pod")
            owner = _owner_pod_uid(obj)  # a gated pod's: that incarnation, not its name
            if (owner in self._pod_uids) if owner is not None else (key[0], pod) in self._pods:
                self.fail(f"{key}: reclaimed OwnerPodDeleted, but pod {pod} exists")

    def _one_decider(self, key: tuple[str, str], decision: str) -> None:
        lease = self.lease()
        if lease is None:
            return
        replica = self.replicas.get(decision.split("-", 1)[0])
        holder = (lease.get("spec") or {}).get("holderIdentity")
        if replica is None or holder != replica.identity:
            self.fail(f"{key}: decision {decision} written while {holder!r} held the Lease")

    # -- after quiescence ------------------------------------------------------------------

    def final(
        self,
        reservations: list[JSON],
        controller: Controller | None,
        may_wait: Callable[[JSON], bool] = lambda obj: False,
    ) -> None:
        """``may_wait``: a reservation that may still be Queued (a gated pod's, which
        waits as long as its pod does; ``podchecks`` checks it is not stuck)."""
        present = set()
        for obj in reservations:
            meta, status = obj["metadata"], obj.get("status") or {}
            uid, key = meta["uid"], (meta["namespace"], meta["name"])
            present.add(uid)
            waits = status.get("phase") == "Queued" and may_wait(obj)
            if status.get("phase") not in ("Admitted", "Rejected", "Reclaimed") and not waits:
                self.fail(f"{key}: never decided: {status}")
                continue
            if controller is None:
                continue
            record = controller.state.records.get(uid)
            if record is None:
                self.fail(f"{key}: {status.get('phase')} but the operator has no record of it")
            elif not record.decision.matches(status):
                self.fail(
                    f"{key}: status {status.get('phase')}/{status.get('decisionID')} but the "
                    f"ledger's truth is {record.decision.phase}/{record.decision.decision_id}"
                )
            held = controller.state.holders.get(f"{key[0]}/{key[1]}") == uid
            if held != (status.get("phase") == "Admitted"):
                self.fail(f"{key}: status {status.get('phase')}, held in the ledger: {held}")
        if controller is not None:
            for uid, record in controller.state.records.items():
                # (a deletion that landed this moment: its answer is still on its way)
                just = self.now() - self._deleted_at.get(uid, -1e9) <= LANDING_SLACK
                if uid not in present and not just:
                    self.fail(f"{record.entry_id}: remembered, but its object is gone")
