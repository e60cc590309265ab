"""The operator's in-memory truth: the ledger, and what it decided about each object.

The ledger knows admitted entries by id (``namespace/name``). A :class:`Record`
adds, per Reservation *incarnation* (uid), what only the operator knows: the
decision its status must carry (admitted, rejected or reclaimed), whether the
object is known to carry it yet, which owner pod heartbeats it, and the last
heartbeat values it saw. Records live as long as their object; that is what
makes every path level-triggered — an object is always compared with its record.

Lists race with watches: a LIST answered a second ago can be older than the
watch event handled a moment ago. So the state remembers *when* it last learned
something from a watch — per uid forgotten, per Node, per owner Pod — and a list
never overrules what was learned after the list was asked for.

Everything here is synchronous: each change happens between two ``await``
points, so no other task ever sees it half done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from headroom.api.limits import Limits
from headroom.api.reasons import Phase
from headroom.ledger import Ledger
from headroom.logs import about
from headroom.objects.nodeconstraints import NodeFacts
from headroom.objects.pods import RunningClaim
from headroom.objects.stamp import Stamper
from headroom.objects.status import StatusDecision

log = logging.getLogger(__name__)
RESERVATION, POD = "reservation", "pod"  # heartbeat sources
PodKey = tuple[str, str]  # (namespace, name)
JSON = dict[str, Any]


@dataclass(slots=True)
class Record:
    """What this operator decided about one Reservation incarnation."""

    uid: str
    namespace: str
    name: str
    node: str
    decision: StatusDecision
    pod: str | None = None
    pod_uid: str | None = None  # the owner pod's incarnation: another uid means it was deleted
    changed_at: float = 0.0  # monotonic time ``decision`` was last set
    confirmed: bool = False  # the object is known to carry ``decision``
    announced: bool = False  # its Event was posted and its metrics counted
    beats: dict[str, str | None] = field(default_factory=dict)  # source -> last value seen
    bad_beat: str | None = None  # the last malformed heartbeat reported, once
    written_beat: datetime | None = None  # the lastHeartbeat last put in status
    seen_at: float = 0.0  # monotonic time the record was made (resync's guard)
    confirmed_at: float = 0.0  # monotonic time the object was last seen carrying it
    first_seen: float = 0.0  # when the object was first seen (admission latency)

    @property
    def entry_id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def held(self) -> bool:
        return self.decision.phase == Phase.ADMITTED

    @property
    def about(self) -> dict[str, Any]:
        """``extra=`` for a log line about this reservation (its fields in JSON logs)."""
        return about(self.namespace, self.name, self.uid, self.node)


def pod_key(obj: JSON) -> PodKey:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def deliver_listed(
    pods: list[JSON], on_pod: Callable[..., None], *, listed_at: float
) -> set[PodKey]:
    """Hand each pod of a list asked for at ``listed_at`` to ``on_pod``; the keys listed."""
    listed = set()
    for pod in pods:
        listed.add(pod_key(pod))
        on_pod(None, pod, listed_at=listed_at)
    return listed


@dataclass(slots=True)
class SeenPod:
    """A labelled owner pod as last seen: its incarnation and heartbeat value."""

    uid: str
    beat: str | None
    seen_at: float  # monotonic
    #: Its claim if it is a claim pod running on a node: what tells the operator's own
    #: reservation of it from a tenant's (``headroom.objects.pods.is_own_reservation``).
    running: RunningClaim | None = None
    #: Held by our gate, or unbound and waiting for the scheduler whose binds are ours.
    placed_by_operator: bool = False


class State:
    """The operator's in-memory truth (module docstring). Other modules change it through
    its methods only, and read its maps through read-only views (``Mapping``)."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._ledger = Ledger(limits)
        self._records: dict[str, Record] = {}  # uid -> record
        self._named: dict[str, str] = {}  # entry id -> uid of the incarnation last remembered
        self._holders: dict[str, str] = {}  # ledger entry id -> uid of the incarnation held
        self._forgotten: dict[str, float] = {}  # uid -> when its object was known gone
        self._owner_pods: dict[PodKey, SeenPod] = {}  # labelled pods that own reservations
        self._owned: dict[PodKey, set[str]] = {}  # owner pod -> uids it holds
        self._node_uids: dict[str, str] = {}
        self._node_labels: dict[str, dict[str, str]] = {}  # copied onto its NodeHeadroom
        self._node_facts: dict[str, NodeFacts] = {}  # what says which pods may run there
        self._node_seen: dict[str, float] = {}  # node -> when a watch last told us of it
        # Node-local ResourceSlices (headroom.control.slices): by name, and by spec.nodeName.
        self._slices: dict[str, JSON] = {}
        self._slices_by_node: dict[str, set[str]] = {}
        #: Where each node's GPU devices were read (ResourceSlice, HAMi, GFD), for its summary.
        self._gpu_sources: dict[str, str] = {}
        self._slice_seen: dict[str, float] = {}  # slice -> when a watch last told us of it
        self._dirty_nodes: set[str] = set()  # nodes whose NodeHeadroom is to be written again
        self._room_nodes: set[str] = set()  # nodes where a waiting reservation may fit now
        self._waiters: dict[str, str] = {}  # entry id of a waiting reservation -> its uid
        self._stamper = Stamper(None)  # replaced at start when a decision key is configured

    # -- its parts ------------------------------------------------------------------------------

    @property
    def limits(self) -> Limits:
        """The default limits (a Node's own override them in the ledger)."""
        return self._limits

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    @property
    def stamper(self) -> Stamper:
        """What signs decisions and checks the signatures of those read back."""
        return self._stamper

    def use_stamper(self, stamper: Stamper) -> None:
        """Sign and check decisions with this from now on (at start, once the key is read)."""
        self._stamper = stamper

    # -- what is known: read-only views --------------------------------------------------------

    @property
    def records(self) -> Mapping[str, Record]:
        """uid -> the record of each Reservation incarnation known (:meth:`remember`)."""
        return self._records

    @property
    def holders(self) -> Mapping[str, str]:
        """Ledger entry id -> uid of the incarnation whose capacity it holds."""
        return self._holders

    @property
    def owner_pods(self) -> Mapping[PodKey, SeenPod]:
        """The labelled owner pods, as last seen (:meth:`saw_pod`)."""
        return self._owner_pods

    @property
    def owned(self) -> Mapping[PodKey, AbstractSet[str]]:
        """Owner pod -> uids of the reservations it holds."""
        return self._owned

    # -- owner pods (headroom.control.owners) -------------------------------------------------

    def saw_pod(self, key: PodKey, seen: SeenPod) -> None:
        """A labelled owner pod, as a watch or a list showed it."""
        self._owner_pods[key] = seen

    def forget_pod(self, key: PodKey) -> None:
        """The pod is gone, or owns no reservation any more (unlabelled)."""
        self._owner_pods.pop(key, None)

    def prune_pods(self, listed: AbstractSet[PodKey], listed_at: float) -> None:
        """Forget the pods a list asked for at ``listed_at`` lacks, unless seen since."""
        for key in [k for k in self._owner_pods if k not in listed]:
            if self._owner_pods[key].seen_at < listed_at:
                del self._owner_pods[key]

    # -- Nodes (headroom.control.nodes) ------------------------------------------------------

    @property
    def node_uids(self) -> Mapping[str, str]:
        """The Nodes there are: name -> uid (what owns its NodeHeadroom)."""
        return self._node_uids

    @property
    def node_labels(self) -> Mapping[str, Mapping[str, str]]:
        """Each Node's labels, as last seen (copied onto its NodeHeadroom)."""
        return self._node_labels

    @property
    def node_facts(self) -> Mapping[str, NodeFacts]:
        """What says which pods may run on each Node."""
        return self._node_facts

    @property
    def gpu_sources(self) -> Mapping[str, str]:
        """Where each node's GPU devices were read (ResourceSlice, HAMi, GFD), for its summary."""
        return self._gpu_sources

    def saw_node(self, name: str, at: float) -> None:
        """A watch told of the Node at monotonic time ``at`` (a list asked before is older)."""
        self._node_seen[name] = at

    def node_seen_since(self, name: str, moment: float) -> bool:
        """Whether a watch told of the Node at or after ``moment`` (a list from then is stale)."""
        return self._node_seen.get(name, float("-inf")) >= moment

    def set_node_uid(self, name: str, uid: str) -> None:
        self._node_uids[name] = uid

    def set_node_labels(self, name: str, labels: dict[str, str]) -> None:
        """The Node's labels: for its NodeHeadroom, and the quotas' nodeSelectors."""
        self._node_labels[name] = labels
        self._ledger.set_node_labels(name, labels)

    def set_node_facts(self, name: str, facts: NodeFacts) -> None:
        self._node_facts[name] = facts

    def set_gpu_source(self, name: str, source: str | None) -> None:
        """Where the node's GPU devices were read; None: nowhere (or the Node is gone)."""
        if source is not None:
            self._gpu_sources[name] = source
        else:
            self._gpu_sources.pop(name, None)

    def remove_node(self, name: str) -> None:
        """The Node is gone: what was known of it, its labels and capacity in the ledger too
        (what the ledger holds there stays until released or reclaimed)."""
        self._node_uids.pop(name, None)
        self._node_labels.pop(name, None)
        self._ledger.set_node_labels(name, None)
        self._node_facts.pop(name, None)
        self._ledger.remove_node(name)

    # -- ResourceSlices (headroom.control.slices) --------------------------------------------

    @property
    def slices(self) -> Mapping[str, JSON]:
        """The node-local ResourceSlices kept, by name."""
        return self._slices

    @property
    def slices_by_node(self) -> Mapping[str, AbstractSet[str]]:
        """The names of the slices kept, by their ``spec.nodeName``."""
        return self._slices_by_node

    def keep_slice(self, name: str, node: str, obj: JSON) -> None:
        """Keep slice ``name``, local to ``node``."""
        self._slices[name] = obj
        self._slices_by_node.setdefault(node, set()).add(name)

    def pop_slice(self, name: str) -> JSON | None:
        """Stop keeping slice ``name``; what was kept (then :meth:`unindex_slice` its node)."""
        return self._slices.pop(name, None)

    def unindex_slice(self, name: str, node: str) -> None:
        """Slice ``name``, no longer kept, is no longer counted local to ``node``."""
        names = self._slices_by_node.get(node)
        if names is not None:
            names.discard(name)
            if not names:
                del self._slices_by_node[node]

    def saw_slice(self, name: str, at: float) -> None:
        """A watch told of the slice at monotonic time ``at`` (a list asked before is older)."""
        self._slice_seen[name] = at

    def slice_seen_since(self, name: str, moment: float) -> bool:
        """Whether a watch told of the slice at or after ``moment`` (a list then is stale)."""
        return self._slice_seen.get(name, float("-inf")) >= moment

    def prune_slice_times(self, before: float) -> None:
        """Forget when a watch told of slices not kept, if that was before ``before``."""
        seen = self._slice_seen
        for name in [n for n, at in seen.items() if at < before and n not in self._slices]:
            del seen[name]

    # -- nodes whose summary or queue changed -------------------------------------------------

    def mark_dirty(self, *nodes: str) -> None:
        """The NodeHeadroom of these nodes is to be written again (at the next flush)."""
        self._dirty_nodes.update(nodes)

    def take_dirty(self) -> set[str]:
        """The nodes marked dirty since the last take; none are marked after it."""
        dirty, self._dirty_nodes = self._dirty_nodes, set()
        return dirty

    def mark_room(self, *nodes: str) -> None:
        """Room may have appeared on these nodes: what waits there is tried again."""
        self._room_nodes.update(nodes)

    def mark_changed(self, *nodes: str) -> None:
        """What these nodes hold or offer changed: their summary, and room for their waiters."""
        self._dirty_nodes.update(nodes)
        self._room_nodes.update(nodes)

    def room_marked(self, nodes: AbstractSet[str]) -> bool:
        """Whether room may have appeared on any of ``nodes`` since the last take."""
        return bool(nodes & self._room_nodes)

    def take_room(self) -> set[str]:
        """The nodes marked for room since the last take; none are marked after it."""
        nodes, self._room_nodes = self._room_nodes, set()
        return nodes

    # -- records ---------------------------------------------------------------------------

    def remember(self, record: Record) -> bool:
        """Keep a decision; an admitted one must already be in the ledger, for this uid.

        Refuses (False, logged) to let an admitted record claim an entry the ledger
        holds for another incarnation: that would let releasing one free the other.
        """
        if record.held:
            holder = self._holders.get(record.entry_id)
            if holder is not None and holder != record.uid:
                log.error(
                    "%s: admitted incarnation %s not remembered: the ledger holds %s",
                    record.entry_id,
                    record.uid,
                    holder,
                )
                return False
        self._records[record.uid] = record
        self._named[record.entry_id] = record.uid
        if record.held:
            self.hold(record)
        elif record.decision.phase == Phase.QUEUED:
            self._waiters[record.entry_id] = record.uid
            self._dirty_nodes.add(record.node)
        return True

    def hold(self, record: Record) -> None:
        """Link an admitted record to the entry the ledger now holds for it."""
        self._holders[record.entry_id] = record.uid
        if self._waiters.get(record.entry_id) == record.uid:
            del self._waiters[record.entry_id]
        self._dirty_nodes.add(record.node)
        if record.pod:
            self._owned.setdefault((record.namespace, record.pod), set()).add(record.uid)

    def held_record(self, entry_id: str) -> Record | None:
        uid = self._holders.get(entry_id)
        return self._records.get(uid) if uid is not None else None

    def holds(self, record: Record) -> bool:
        """Whether the ledger holds this incarnation's capacity (admitted, or reclaimed
        but not yet shown as Reclaimed on its object)."""
        return self._holders.get(record.entry_id) == record.uid

    def unhold(self, record: Record) -> None:
        """Drop the ledger-side links of a record (its entry already left the ledger)."""
        if self._holders.get(record.entry_id) == record.uid:
            del self._holders[record.entry_id]
        self._dirty_nodes.add(record.node)
        self._room_nodes.add(record.node)  # room may have appeared for a waiting one
        self._room_nodes |= self._ledger.quota_waiters(record.namespace)  # ... or in its quota
        if record.pod:
            key = (record.namespace, record.pod)
            owned = self._owned.get(key)
            if owned is not None:
                owned.discard(record.uid)
                if not owned:
                    del self._owned[key]

    def release(self, record: Record) -> None:
        """Return a record's capacity, if the ledger holds it (its object is gone)."""
        if self.holds(record):
            self._ledger.release(record.entry_id)
            self.unhold(record)

    def drop(self, uid: str) -> Record | None:
        """Undo a decision (never written), or forget one: release what it held (or stop its
        waiting) and drop its record."""
        record = self._records.pop(uid, None)
        if record is not None:
            if self._named.get(record.entry_id) == uid:
                del self._named[record.entry_id]
            self.release(record)
            self.stop_waiting(record)
        return record

    def named(self, entry_id: str) -> Record | None:
        """The record of the reservation named ``entry_id`` known to exist, in any phase."""
        uid = self._named.get(entry_id)
        return self._records.get(uid) if uid is not None else None

    def waiting_record(self, entry_id: str) -> Record | None:
        """The record of the reservation waiting as ``entry_id`` in its node's queue."""
        uid = self._waiters.get(entry_id)
        return self._records.get(uid) if uid is not None else None

    def wait_ended(self, record: Record) -> None:
        """The ledger ended this record's wait (refused it): it leaves its node's queue."""
        self._waiters.pop(record.entry_id, None)
        self._room_nodes.add(record.node)  # strict FIFO: the next one may go now

    def stop_waiting(self, record: Record) -> None:
        """A waiting record leaves its node's queue (decided, timed out, or gone)."""
        if self._waiters.get(record.entry_id) == record.uid:
            del self._waiters[record.entry_id]
            self._ledger.stop_waiting(record.entry_id)
            self._dirty_nodes.add(record.node)
            self._room_nodes.add(record.node)  # under strict FIFO the next one may go now

    def forget(self, uid: str, now: float) -> Record | None:
        """The object is gone: release what it held, drop its record, leave a tombstone."""
        self._forgotten[uid] = now
        return self.drop(uid)

    def forgotten_since(self, uid: str, moment: float) -> bool:
        """Whether the object was known gone after ``moment`` (a list from then is stale)."""
        return self._forgotten.get(uid, float("-inf")) >= moment

    def prune_tombstones(self, before: float) -> None:
        """Tombstones older than the oldest list still being read can go."""
        for uid in [uid for uid, at in self._forgotten.items() if at < before]:
            del self._forgotten[uid]

    def held_records(self) -> Iterator[Record]:
        for uid in list(self._holders.values()):
            record = self._records.get(uid)
            if record is not None:
                yield record

    def owners_of(self, key: PodKey) -> list[Record]:
        records = (self._records.get(uid) for uid in self._owned.get(key, ()))
        return [record for record in records if record is not None]
