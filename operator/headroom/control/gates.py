"""Gated pods: reserve their memory, pin them where it was admitted, give it back when they end.

A pod labelled ``headroom.dev/claim: "true"`` is created behind the scheduling gate
``headroom.dev/admission`` (the webhook adds it). For each such pod this module
keeps one Reservation — same namespace and name as the pod, owned by it, with
``spec.liveness: Pod`` — and brings the pod and that reservation into agreement,
level-triggered, from every path (pod watch, reservation reconcile, a decision
confirmed, the resync):

- gated, no reservation: choose a node the pod may run on (its hard constraints;
  best first as ``kubectl headroom fit`` orders them, the first that fits now, else
  the best to wait on) and create the reservation; the decider decides it like
  any other, in creation order;
- gated, its reservation Admitted *and written*: one patch pins the pod to that
  node, names the reservation and removes the gate. Only a written admission
  lets a pod run: a crash before the write must not leave a pod running on a
  decision nobody recorded. A patch refused (another admission plugin, foreign
  constraints) reclaims the reservation (``UngateRefused``): nothing stays
  Admitted while its pod stays gated. One that failed only because it was made
  from a stale view of the pod (another controller lifted its own gate
  meanwhile) is made again from the pod as it is, not taken for a refusal;
- gated, but no longer labelled (or never labelled: every pod our gate holds is
  followed, whatever its labels): what it booked is deleted and our gate removed,
  so it schedules as any pod (``NotClaimed``); labelled but its claim unreadable:
  what it booked is deleted and it stays gated until the claim reads (``BadClaim``);
- gated, with a reservation owned by it and named as it that is not what this
  module writes for its claim: one of its shape for another size, devices or node
  (made before the pod was edited) is deleted and one made for the claim
  (``ClaimChanged``); another says so and stays gated (``ReservationNameTaken``);
  one on a node its constraints no longer allow (narrowed, tainted, cordoned) is
  deleted, and the pod placed again (``NodeUnsuitable``);
- gated, its reservation finally refused (its wait ran out): shown on the pod; a
  pod that set no wait of its own gets a new reservation, so it waits as long as
  it is gated;
- not gated but bound (the webhook missed it, or the label came later): its claim
  is recorded on the node it runs on, over the limit if it must be
  (``OverCommitted``), never pretended away; until its reservation is decided, the
  ledger counts that claim against its quotas (from the rebuild on, before the
  decider's first decision), so nothing is admitted into room the pod already uses;
- Succeeded or Failed: its reservation is reclaimed at once (``OwnerPodFinished``),
  or, if it still waits in a queue (decided after the pod ended), deleted.
  A deleted pod's reservation goes with the pod's owner label (``headroom.control
  .owners``) and with the garbage collector (its ownerReference); no finalizer is
  ever involved, so nothing waits for the operator.

Every pass makes the pod's condition ``headroom.dev/Admitted`` match its reservation,
whatever was written before (a restart, a lost answer). A create is tried once while
the placement lock is held; one that fails is tried again later with a per-pod
backoff, so one namespace's failing creates never stall another's pods.

It is a level-triggered reconciler, the way controller-runtime's are: every path
above only adds the pod's key to a keyed work queue (:mod:`headroom.kube.workqueue`:
deduped, one pass per pod at a time, again after a pass if changed during it, per-pod
backoff); a pass reads what is known of the pod, asks the pure
:func:`headroom.control.podactions.decide` for the one thing it needs, and does it.

Names are deterministic, so "no pod gets two reservations" holds across restarts
and races: a second create answers 409 and the existing one is adopted if it is
this pod incarnation's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from datetime import UTC, datetime

from headroom.api.claims import PodClaim, is_claim_pod, pod_claim
from headroom.api.constants import OWNER_LABEL
from headroom.api.parse import InvalidValueError
from headroom.api.paths import PODS, pod_path, reservation_path, resource_path
from headroom.api.reasons import EventReason, Phase, Reason
from headroom.control.feeds import WatchedFeed
from headroom.control.placement import choose_node
from headroom.control.podactions import (
    BIND_GRACE,
    CALLS,
    BackOff,
    ClaimPod,
    Condition,
    Create,
    Expire,
    Fence,
    Known,
    Later,
    LetGo,
    Nudge,
    PodAction,
    Reclaim,
    Replace,
    Say,
    Ungate,
    decide,
    running_claim,
)
from headroom.control.podcalls import Caller, DeposedError, PodCalls
from headroom.control.state import PodKey, Record, State, deliver_listed, pod_key
from headroom.control.telemetry import Telemetry
from headroom.kube.clock import Clock
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport, list_all
from headroom.ledger import Entry
from headroom.objects.nodeconstraints import may_run_on
from headroom.objects.podreservations import booked, differences, for_another_claim
from headroom.objects.pods import (
    bound_node,
    is_finished,
    is_gated,
    owning_pod_uid,
    pod_reservation,
    pod_wait,
    unschedulable_for,
)
from headroom.objects.reservations import reservation_id

log = logging.getLogger(__name__)
#: The pods watch selects nothing: a pod our gate holds is followed whatever its labels
#: (a label can be removed; a field selector cannot see scheduling gates).
CLAIM_SELECTOR = None
_RETRY_FIRST, _RETRY_CAP = 10.0, 300.0  # a new reservation after a refusal, per pod
_AFTER_BIND = 0.5  # seconds: a pod kube-scheduler's bind holds is looked at again after
_GONE_WITHIN = 5.0  # seconds a queue waits to see the reservation it replaced gone
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # a running claim's times: never read


def _created(pod: JSON) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def _followed(pod: JSON) -> bool:
    """Opted in, or held by our gate (an opted-in pod that lost its label, say)."""
    return is_claim_pod(pod) or is_gated(pod)


class Gates(PodCalls, WatchedFeed):
    name, path, selector = "claims", PODS, CLAIM_SELECTOR

    def __init__(
        self,
        state: State,
        transport: Transport,
        events: EventRecorder,
        clock: Clock,
        *,
        reclaim: Callable[[Record, Reason, str], None],
        may_act: Callable[[], bool],
        rng: random.Random,
        telemetry: Telemetry | None = None,
        bind_grace: float = BIND_GRACE,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        """``bind_grace``: seconds an admission for kube-scheduler's choice waits for its
        Binding before it is fenced and released; ``wake``: the decider's (a running
        claim no longer counted may leave room in its quotas)."""
        self._bind_grace = bind_grace
        self._wake = wake
        super().__init__(
            state,
            transport,
            events,
            clock,
            reclaim=reclaim,
            may_act=may_act,
            rng=rng,
            telemetry=telemetry,
        )
        self._pod_of: dict[str, PodKey] = {}  # reservation uid -> the pod key it is named for
        self._unlisted: set[tuple[PodKey, str]] = set()  # pods a list lacked: gone?
        # Reservations are created one at a time, in the order pods were seen (a fair
        # lock), so the decider sees them in the pods' creation order; and what is
        # created but not decided yet counts against its node when the next is placed.
        self._creating = asyncio.Lock()
        self._planned: dict[PodKey, tuple[str, int, int]] = {}  # -> (node, RAM, VRAM)
        self._replacing: set[PodKey] = set()  # queues waiting for a replaced one to go

    async def stop(self) -> None:
        """The pod work queue's (PodCalls'), named here so that no base's default wins."""
        await PodCalls.stop(self)

    # -- what the operator sees --------------------------------------------------------------

    def planned(self) -> list[tuple[str, int, int]]:
        """What was created for pods and is not decided yet: (node, RAM MiB, VRAM MiB)."""
        return list(self._planned.values())

    @property
    def gated(self) -> int:
        """Pods held by our gate now."""
        return sum(1 for pod in self._claim_pods.values() if is_gated(pod.obj))

    def unschedulable_for(self, scheduler: str) -> list[tuple[PodKey, JSON]]:
        """Claim pods ``scheduler`` left unbound, finding no node for them, that no queue
        of the ledger will nudge: without a reservation that waits or holds."""
        return [
            (key, pod.obj)
            for key, pod in self._claim_pods.items()
            if unschedulable_for(pod.obj, scheduler) and not self._queued(key, pod)
        ]

    def _queued(self, key: PodKey, pod: ClaimPod) -> bool:
        known = self._reservations.get(key)
        record = self._record(known, pod)
        if known is None or record is None:
            return False
        return record.held or record.decision.phase == Phase.QUEUED or known.book.waits

    def on_event(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        meta = obj.get("metadata") or {}
        key = pod_key(obj)
        uid = str(meta.get("uid", ""))
        seen = self._claim_pods.get(key)
        if event_type == "DELETED":
            if seen is not None and seen.uid == uid:
                del self._claim_pods[key]
                self._count_running(key)
                self._tasks.spawn(self._gone(key, uid))
            return
        if listed_at is not None and seen is not None and seen.seen_at >= listed_at:
            return  # a watch event since the list was asked for is newer
        if not _followed(obj):
            # Neither opted in nor gated (its label went after its gate did): no longer
            # ours to follow; a reservation it holds stays, as any owner pod's does.
            if seen is not None and seen.uid == uid:
                del self._claim_pods[key]
                self._count_running(key)
            return
        if seen is None or seen.uid != uid:
            seen = self._claim_pods[key] = ClaimPod(obj, uid)
        seen.obj = obj
        seen.seen_at = self._clock.monotonic() if listed_at is None else listed_at
        seen.node = seen.node or bound_node(obj)
        seen.ended = seen.ended or is_finished(obj)
        if is_gated(obj) and seen.gated_at is None:
            seen.gated_at = self._clock.monotonic()
        self._count_running(key)
        self.poke(key)

    async def relist(self) -> str:
        asked = self._clock.monotonic()
        pods, version = await list_all(self._transport, PODS, label_selector=CLAIM_SELECTOR)
        self.take(pods, listed_at=asked)
        return version

    def take(self, pods: list[JSON], *, listed_at: float) -> None:
        listed = deliver_listed(pods, self.on_event, listed_at=listed_at)
        for key in [k for k, seen in self._claim_pods.items() if k not in listed]:
            if self._claim_pods[key].seen_at < listed_at:  # a watch may have seen it since
                del self._claim_pods[key]
                self._count_running(key)
        # A pod deleted while nobody watched (the operator down, a watch gap): its
        # reservation, if it holds nothing, goes now, not at the next resync.
        for key, known in list(self._reservations.items()):
            if key not in listed and key not in self._claim_pods:
                self._unlisted.add((key, known.pod_uid))
        if self.started:
            self._check_unlisted()

    def _check_unlisted(self) -> None:
        unlisted, self._unlisted = self._unlisted, set()
        for key, pod_uid in unlisted:
            self._tasks.spawn(self._gone(key, pod_uid))

    def reservation_seen(self, obj: JSON) -> None:
        """A Reservation owned by a pod exists (any path of the reconcile)."""
        pod_uid = owning_pod_uid(obj)
        if pod_uid is None:
            return
        meta = obj.get("metadata") or {}
        key = pod_key(obj)
        uid = str(meta.get("uid", ""))
        known = self._reservations.get(key)
        if known is None or known.uid != uid:
            self._reservations[key] = Known(uid, pod_uid, booked(obj))
            self._pod_of[uid] = key
            self._count_running(key)
            self.poke(key)

    def reservation_gone(self, uid: str) -> None:
        self._released(uid)
        key = self._pod_of.pop(uid, None)
        if key is not None:
            self._planned.pop(key, None)
        known = self._reservations.get(key) if key is not None else None
        if key is not None and known is not None and known.uid == uid:
            del self._reservations[key]
            self._count_running(key)
            self.poke(key)

    def decided(self, record: Record) -> None:
        """A decision reached its object: a gated pod may go now."""
        key = (record.namespace, record.name)
        self._planned.pop(key, None)  # the ledger holds it now, or never will
        self._count_running(key)
        if key in self._reservations:
            self.poke(key)

    def nodes_changed(self) -> None:
        """A node came, went or changed: pods that found no node may find one now, and a
        pod whose node no longer suits it (tainted, cordoned, relabelled) is placed again."""
        for key, pod in self._claim_pods.items():
            if is_gated(pod.obj):
                self.poke(key)

    def start(self) -> None:
        self.started = True
        self._check_unlisted()
        for key in sorted(self._claim_pods, key=lambda k: (_created(self._claim_pods[k].obj), k)):
            self.poke(key)

    # -- bringing a pod and its reservation into agreement --------------------------------------

    async def _reconcile(self, key: PodKey) -> None:
        """One pass of the pod's key: what is known of it, decided, done."""
        self._count_running(key)
        seen = self._claim_pods.get(key)
        if seen is None or not self.started or not self._may_act():
            return
        if self.binding(key):  # kube-scheduler's bind has it: looked at again after
            self._queue.add_after(key, _AFTER_BIND)
            return
        known = self._reservations.get(key)
        if known is not None and known.pod_uid != seen.uid and await self._newer(key, known):
            return  # the watch has not shown the pod the reservation is for yet
        record = self._record(known, seen)
        facts, now = self._state.node_facts, self._clock.monotonic()
        action = decide(seen, known, record, facts, now, bind_grace=self._bind_grace)
        try:
            await self._do(key, seen, action)
        except DeposedError:
            return  # the next leader does it
        except (ApiError, ApiUnavailableError) as error:
            delay = self._queue.add_rate_limited(key)
            log.warning("pod %s/%s: %s; tried again in %.1fs", *key, error, delay)
            return
        if isinstance(action, CALLS):
            self._queue.forget(key)

    async def _do(self, key: PodKey, seen: ClaimPod, action: PodAction) -> None:
        match action:
            case Say(reason, message, kind):
                self._say(seen, reason, message, kind)
            case Condition(reason, message):
                self._condition(seen, reason, message)
            case Reclaim(record, reason, message):
                self._reclaim(record, reason, message)
            case Replace(uid, say):
                if say is not None:
                    self._say(seen, say.reason, say.message, say.kind)
                await self._replace(key, uid)
            case LetGo(uid):
                await self._let_go(key, seen, uid)
            case Create(claim, node):
                await self._create(key, seen, claim, node=node)
            case Ungate(record):
                await self._ungate(key, seen, record)
            case Fence(record):
                await self._fence(key, seen, record)
            case Nudge(record, say):
                if say is not None:
                    self._say(seen, say.reason, say.message, say.kind)
                await self._nudge(key, seen, record)
            case Expire(say):
                seen.expired = True
                self._say(seen, say.reason, say.message, say.kind)
            case BackOff(refused, say):
                self._say(seen, say.reason, say.message, say.kind)
                seen.refused = refused
                self._backoff(seen)
                self._queue.add_after(key, seen.retry_after - self._clock.monotonic())
            case Later(delay, say):
                if say is not None:
                    self._say(seen, say.reason, say.message, say.kind)
                self._queue.add_after(key, delay)

    async def _newer(self, key: PodKey, known: Known) -> bool:
        """Whether the pod named ``key`` is, in the API now, the one ``known`` is for (the
        scheduler bound a pod of that name the watch has not shown yet): then it is taken
        as seen, and its reservation is not taken for an earlier pod's."""
        try:
            pod = await self._fresh(key)
        except (ApiError, ApiUnavailableError, DeposedError):
            self._queue.add_rate_limited(key)
            return True
        if pod is None or (pod.get("metadata") or {}).get("uid") != known.pod_uid:
            return False
        self.on_event(None, pod)
        return True

    def _count_running(self, key: PodKey) -> None:
        """Level-triggered: the ledger counts the pod's claim against its quotas while it
        runs with no decision about its reservation (:func:`running_claim`), from the
        rebuild on: no decision is taken against a ledger that lacks it."""
        seen = self._claim_pods.get(key)
        running = None
        if seen is not None:
            running = running_claim(seen, self._record(self._reservations.get(key), seen))
        entry_id = reservation_id(*key)
        claim = None
        if running is not None:
            node, wanted = running
            claim = Entry(
                entry_id,
                node,
                wanted.ram_mb,
                _EPOCH,
                _EPOCH,
                vram_mb=wanted.vram_mb,
                pod_lifetime=True,
            )
        if self._state.ledger.set_running_claim(entry_id, claim) and claim is None:
            self._state.mark_room(*self._state.ledger.quota_waiters(key[0]))
            self._wake()

    def _record(self, known: Known | None, seen: ClaimPod) -> Record | None:
        """The decision about the pod's reservation, if it was made for this incarnation."""
        if known is None or known.pod_uid != seen.uid:
            return None
        return self._state.records.get(known.uid)

    def _backoff(self, seen: ClaimPod) -> None:
        seen.retries += 1
        delay = min(_RETRY_FIRST * 2 ** min(seen.retries - 1, 10), _RETRY_CAP)
        seen.retry_after = self._clock.monotonic() + delay

    # -- the API calls ---------------------------------------------------------------------------

    async def _create(
        self, key: PodKey, seen: ClaimPod, claim: PodClaim, *, node: str | None = None
    ) -> None:
        if node is not None:  # already placed by the scheduler: nothing to choose
            await self._label_owner(key, seen, self._call)
            await self._make(key, seen, claim, node, self._call)
            return
        async with self._creating:
            # Labelled under the lock too: were it before, the creates would reach the
            # decider in the order the label patches happened to return, not the order
            # the pods came (seen under load: the third pod admitted before the second).
            await self._label_owner(key, seen, self._once)
            now = self._clock.now()
            placement = choose_node(self._state, self._planned.values(), seen.obj, claim, now)
            node = placement.node
            if node is None:  # nothing is made until a node, a quota or the pod changes
                assert placement.reason is not None, "a placement without a node says why"
                self._say(seen, placement.reason, placement.why, "Warning")
                return
            self._planned[key] = (node, claim.ram_mb, claim.vram_mb)
            made = False
            try:
                # One attempt while the lock is held: a create that fails (one namespace's
                # webhook or quota in trouble) is tried again later, after the others.
                made = await self._make(key, seen, claim, node, self._once)
            finally:
                if not made:  # every exit that made nothing clears what it planned
                    self._planned.pop(key, None)

    async def make_for_bind(self, key: PodKey, pod: JSON, claim: PodClaim, node: str) -> bool:
        """The pod's reservation on ``node``, chosen by kube-scheduler: with no wait, so
        the ledger admits or refuses it at once (a pod that finds no room waits in the
        scheduler's queue, not in the ledger's)."""
        seen = self._claim_pods.get(key)
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if seen is None or seen.uid != uid:
            seen = ClaimPod(pod, uid)  # the watch has not shown it yet
        await self._label_owner(key, seen, self._call)
        return await self._make(key, seen, claim, node, self._call, wait=False)

    async def queue(self, key: PodKey, pod: JSON, node: str) -> None:
        """kube-scheduler found no node with room for the pod: its reservation waits in the
        ledger's queue of ``node``, in turn with every other claim there (FIFO, strict or
        best effort, quotas and their waits, as a gated pod's). Admitted, the pod is
        nudged; refused, it says why and, once its retry delay is over, its next filter
        queues it again, at the back."""
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if self.binding(key) or not self.started or not self._may_act():
            return
        if key in self._replacing:
            return  # a queue of this pod waits for the reservation it replaced to go
        try:
            replaced = await self._queue_once(key, pod, uid, node)
            if replaced is None:
                return
            self._replacing.add(key)
            # One entry per pod in the ledger: the one it replaced must be seen gone
            # first (waited for without the lock: a bind of the pod is not held up).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_GONE_WITHIN):
                    while self.holds(replaced):
                        await self.released(replaced)
            if not self.holds(replaced):
                await self._queue_once(key, pod, uid, node)
        except (ApiError, ApiUnavailableError, DeposedError, InvalidValueError) as error:
            log.warning("pod %s/%s not queued for node %s: %s", *key, node, error)
        finally:
            self._replacing.discard(key)

    async def _queue_once(self, key: PodKey, pod: JSON, uid: str, node: str) -> str | None:
        """Make the pod's waiting reservation, unless it has one to keep; the uid of one
        deleted instead (replaced once it is seen gone), else None."""
        async with self.bind_lock(key):
            seen = self._claim_pods.get(key)
            if seen is None or seen.uid != uid:
                seen = ClaimPod(pod, uid)  # the watch has not shown it yet
            if bound_node(seen.obj) or seen.node or is_finished(seen.obj):
                return None  # bound (the watch may lag: a node once seen is kept)
            claim = pod_claim(seen.obj)
            if pod_wait(claim, self._state.ledger.quotas.max_wait(key[0])) is None:
                return None  # its quotas let it wait for nothing (a maxWait under a second)
            known = self._reservations.get(key)
            if known is not None:
                why = self._requeue(key, known, seen, claim)
                if why is None:
                    return None
                if why:
                    self._say(seen, *why)
                await self._replace(key, known.uid)
                return known.uid
            await self._label_owner(key, seen, self._call)
            await self._make(key, seen, claim, node, self._call)
            return None

    def _requeue(
        self, key: PodKey, known: Known, seen: ClaimPod, claim: PodClaim
    ) -> tuple[EventReason, str] | tuple[()] | None:
        """Whether the pod's reservation ``known``, not admitted, is to be replaced by one
        in a queue now, and what the pod says of it (None: kept): one the operator made
        for another claim (edited since: ``ClaimChanged``); one that waits on a node the
        pod can no longer run on (``NodeUnsuitable``, as the gate path's); one made at a
        bind and refused; one that waited and was refused, once the pod's retry delay is
        over (not if its own wait ran out: it gives up). An admission is never taken
        back here: the bind, or the bind grace's fence, decides about it."""
        record = self._record(known, seen)
        if record is None or not record.confirmed or record.held:
            return None  # undecided, another incarnation's (its reconcile replaces it), held
        differ = differences(known.book, key[1], claim)
        if differ:  # not the operator's (a tenant's object of that name): not ours to delete
            if not for_another_claim(known.book, key[1]):
                return None
            return (
                EventReason.CLAIM_CHANGED,
                f"its claim changed ({'; '.join(differ)}); queued anew",
            )
        if record.decision.phase == Phase.QUEUED:
            facts = self._state.node_facts.get(known.book.node)
            if facts is not None and may_run_on(seen.obj, facts):
                return None
            return (
                EventReason.NODE_UNSUITABLE,
                f"node {known.book.node} no longer suits the pod; it waits on another",
            )
        if not known.book.waits:
            return ()
        if record.decision.reason == Reason.WAIT_TIMEOUT and claim.wait is not None:
            return None
        due = seen.refused == known.uid and seen.retry_after <= self._clock.monotonic()
        return () if due else None

    async def _label_owner(self, key: PodKey, seen: ClaimPod, call: Caller) -> None:
        if (seen.obj.get("metadata") or {}).get("labels", {}).get(OWNER_LABEL) == "true":
            return
        await call(  # its deletion is then followed like any owner pod's
            lambda: self._transport.json_patch(
                pod_path(*key),
                [
                    {"op": "test", "path": "/metadata/uid", "value": seen.uid},
                    {
                        "op": "add",
                        "path": "/metadata/labels/" + OWNER_LABEL.replace("/", "~1"),
                        "value": "true",
                    },
                ],
            )
        )

    async def _make(
        self,
        key: PodKey,
        seen: ClaimPod,
        claim: PodClaim,
        node: str,
        call: Caller,
        *,
        wait: bool = True,
    ) -> bool:
        """Create the pod's reservation (or adopt the one there); whether it is the pod's."""
        max_wait = self._state.ledger.quotas.max_wait(key[0])
        ram, vram = self._state.ledger.capacity(node)
        body = pod_reservation(
            seen.obj, claim, node, max_wait=max_wait, node_ram_mb=ram, node_vram_mb=vram
        )
        if not wait:
            body["spec"].pop("wait", None)
        path = resource_path("headroom.dev", "v1alpha1", "reservations", key[0])
        try:
            created = await call(lambda: self._transport.create(path, body))
        except ApiError as error:
            if error.status != 409:
                raise
            created = await call(lambda: self._transport.get(reservation_path(*key)))
        if owning_pod_uid(created) is None:  # a tenant's own reservation has the pod's name
            self._backoff(seen)
            self._say(
                seen,
                EventReason.RESERVATION_NAME_TAKEN,
                f"a Reservation named {key[1]} that no pod owns exists; delete it, "
                "or the pod stays gated",
                "Warning",
            )
            return False
        self.reservation_seen(created)
        if (created.get("metadata") or {}).get("uid") in self._state.records:
            self._planned.pop(key, None)  # adopted, and already decided
        return True
