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
  (``OverCommitted``), never pretended away;
- Succeeded or Failed: its reservation is reclaimed at once (``OwnerPodFinished``),
  or, if it still waits in a queue (decided after the pod ended), deleted.
  A deleted pod's reservation goes with the pod's owner label (``headroom.control
  .owners``) and with the garbage collector (its ownerReference); no finalizer is
  ever involved, so nothing waits for the operator.

Every pass makes the pod's condition ``headroom.dev/Admitted`` match its reservation,
whatever was written before (a restart, a lost answer). A create is tried once while
the placement lock is held; one that fails is tried again later with a per-pod
backoff, so one namespace's failing creates never stall another's pods.

Names are deterministic, so "no pod gets two reservations" holds across restarts
and races: a second create answers 409 and the existing one is adopted if it is
this pod incarnation's.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from headroom.api.claims import PodClaim, is_claim_pod, pod_claim
from headroom.api.constants import OWNER_LABEL
from headroom.api.parse import InvalidValueError
from headroom.api.paths import PODS, pod_path, reservation_path, resource_path
from headroom.api.reasons import Phase, Reason
from headroom.control.placement import choose_node
from headroom.control.podcalls import Caller, ClaimPod, Known, PodCalls
from headroom.control.state import PodKey, Record, State, deliver_listed, pod_key
from headroom.control.telemetry import Telemetry
from headroom.kube.clock import Clock
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, Transport, list_all
from headroom.objects.podreservations import (
    booked,
    differences,
    for_another_claim,
)
from headroom.objects.pods import (
    bound_node,
    condition_reason,
    is_finished,
    is_gated,
    may_run_on,
    owning_pod_uid,
    pod_reservation,
)

log = logging.getLogger(__name__)
#: The pods watch selects nothing: a pod our gate holds is followed whatever its labels
#: (a label can be removed; a field selector cannot see scheduling gates).
CLAIM_SELECTOR = None
_RETRY_FIRST, _RETRY_CAP = 10.0, 300.0  # a new reservation after a refusal, per pod


def _created(pod: JSON) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def _over(record: Record) -> bool:
    return record.decision.reason == Reason.OVER_COMMITTED


def _expired(record: Record) -> bool:
    return record.decision.phase == Phase.RECLAIMED and record.decision.reason == Reason.EXPIRED


def _ran_out(seen: ClaimPod) -> bool:
    """Whether the pod ran and its reservation was reclaimed Expired (seen now, or said in
    its condition before a restart): it never gets another, or a quota's lifetime would
    be renewed for as long as the pod runs."""
    return seen.expired or condition_reason(seen.obj) == Reason.EXPIRED


def _followed(pod: JSON) -> bool:
    """Opted in, or held by our gate (an opted-in pod that lost its label, say)."""
    return is_claim_pod(pod) or is_gated(pod)


class Gates(PodCalls):
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
    ) -> None:
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

    # -- what the operator sees --------------------------------------------------------------

    @property
    def gated(self) -> int:
        """Pods held by our gate now."""
        return sum(1 for pod in self._pods.values() if is_gated(pod.obj))

    def on_pod(self, event_type: str | None, obj: JSON, *, listed_at: float | None = None) -> None:
        meta = obj.get("metadata") or {}
        key = pod_key(obj)
        uid = str(meta.get("uid", ""))
        seen = self._pods.get(key)
        if event_type == "DELETED":
            if seen is not None and seen.uid == uid:
                del self._pods[key]
                self._tasks.spawn(self._gone(key, uid))
            return
        if listed_at is not None and seen is not None and seen.seen_at >= listed_at:
            return  # a watch event since the list was asked for is newer
        if not _followed(obj):
            # Neither opted in nor gated (its label went after its gate did): no longer
            # ours to follow; a reservation it holds stays, as any owner pod's does.
            if seen is not None and seen.uid == uid:
                del self._pods[key]
            return
        if seen is None or seen.uid != uid:
            seen = self._pods[key] = ClaimPod(obj, uid)
        seen.obj = obj
        seen.seen_at = self._clock.monotonic() if listed_at is None else listed_at
        seen.node = seen.node or bound_node(obj)
        seen.ended = seen.ended or is_finished(obj)
        if is_gated(obj) and seen.gated_at is None:
            seen.gated_at = self._clock.monotonic()
        self.poke(key)

    async def relist(self) -> str:
        asked = self._clock.monotonic()
        pods, version = await list_all(self._transport, PODS, label_selector=CLAIM_SELECTOR)
        self.take(pods, listed_at=asked)
        return version

    def take(self, pods: list[JSON], *, listed_at: float) -> None:
        listed = deliver_listed(pods, self.on_pod, listed_at=listed_at)
        for key in [k for k, seen in self._pods.items() if k not in listed]:
            if self._pods[key].seen_at < listed_at:  # a watch may have seen it since
                del self._pods[key]
        # A pod deleted while nobody watched (the operator down, a watch gap): its
        # reservation, if it holds nothing, goes now, not at the next resync.
        for key, known in list(self._reservations.items()):
            if key not in listed and key not in self._pods:
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
            self.poke(key)

    def reservation_gone(self, uid: str) -> None:
        key = self._pod_of.pop(uid, None)
        if key is not None:
            self._planned.pop(key, None)
        known = self._reservations.get(key) if key is not None else None
        if key is not None and known is not None and known.uid == uid:
            del self._reservations[key]
            self.poke(key)

    def decided(self, record: Record) -> None:
        """A decision reached its object: a gated pod may go now."""
        key = (record.namespace, record.name)
        self._planned.pop(key, None)  # the ledger holds it now, or never will
        if key in self._reservations:
            self.poke(key)

    def nodes_changed(self) -> None:
        """A node came, went or changed: pods that found no node may find one now, and a
        pod whose node no longer suits it (tainted, cordoned, relabelled) is placed again."""
        for key, pod in self._pods.items():
            if is_gated(pod.obj):
                self.poke(key)

    def start(self) -> None:
        self.started = True
        self._check_unlisted()
        for key in sorted(self._pods, key=lambda k: (_created(self._pods[k].obj), k)):
            self.poke(key)

    # -- bringing a pod and its reservation into agreement --------------------------------------

    def poke(self, key: PodKey) -> None:
        """Do what the pod needs next, if anything (never more than one thing at a time)."""
        seen = self._pods.get(key)
        if key in self._busy:
            self._stirred.add(key)  # looked at again when the call in flight ends
            return
        if seen is None or not self.started or not self._may_act():
            return
        try:
            self._step(key, seen)
        except Exception:  # one pod must never stop the others
            log.exception("pod %s/%s not handled", *key)

    def _step(self, key: PodKey, seen: ClaimPod) -> None:
        pod = seen.obj
        record = self._record(key, seen)
        if is_finished(pod):
            if record is not None and record.held:
                phase = (pod.get("status") or {}).get("phase")
                self._reclaim(record, Reason.OWNER_POD_FINISHED, f"pod {key[1]} {phase}")
            elif record is not None and record.confirmed and record.decision.phase == Phase.QUEUED:
                self._run(key, self._replace(key, record.uid))  # waits for nobody: deleted
            return
        known = self._reservations.get(key)
        if known is not None and known.pod_uid != seen.uid:
            # Left by an earlier pod of the same name (its owner is gone: the garbage
            # collector deletes it too); this pod gets its own.
            self._run(key, self._replace(key, known.uid))
            return
        if not is_claim_pod(pod):  # gated, but it claims nothing (any more)
            self._run(key, self._let_go(key, seen, known))
            return
        try:
            claim = pod_claim(pod)
        except InvalidValueError as error:
            self._bad_claim(key, seen, known, str(error))
            return
        wait = seen.retry_after - self._clock.monotonic()
        if known is None and wait > 0:
            self._later(key, wait)  # refused a moment ago: not again at once
        elif is_gated(pod):
            self._gated(key, seen, claim, known, record)
        elif record is not None and record.confirmed and _expired(record):
            self._say_ran_out(seen, record)
        elif known is None and not _ran_out(seen) and (node := bound_node(pod)) is not None:
            self._run(key, self._create(key, seen, claim, node=node))  # the webhook missed it
        elif record is not None and record.confirmed and record.held:
            if _over(record):
                self._say(seen, "OverCommitted", record.decision.message, "Warning")
            else:  # written again whenever the pod's condition says otherwise
                self._condition(seen, "Admitted", self._admitted_message(pod, record))

    def _gated(
        self,
        key: PodKey,
        seen: ClaimPod,
        claim: PodClaim,
        known: Known | None,
        record: Record | None,
    ) -> None:
        if known is None:
            self._run(key, self._create(key, seen, claim))
            return
        differ = differences(known.book, key[1], claim)
        if differ and for_another_claim(known.book, key[1]):  # its claim was edited
            self._say(
                seen,
                "ClaimChanged",
                f"the Reservation {key[1]} was made for another claim ({'; '.join(differ)}); "
                "it is released and one made for the pod's claim now",
            )
            self._run(key, self._replace(key, known.uid))
            return
        if differ:  # not what the operator makes for this claim: it lets nobody out
            self._say(
                seen,
                "ReservationNameTaken",
                f"the Reservation {key[1]}, owned by this pod, is not the one Headroom makes "
                f"for its claim ({'; '.join(differ)}); delete it and one is made, or the pod "
                "stays gated",
                "Warning",
            )
            return
        facts = self._state.node_facts.get(known.book.node)
        if facts is not None and not may_run_on(seen.obj, facts):
            # Its nodeSelector or affinity narrowed, or the node tainted or cordoned since
            # it was placed: pinned there it would never be scheduled.
            self._say(
                seen,
                "NodeUnsuitable",
                f"node {known.book.node} no longer suits the pod (its node selector, "
                "affinity or tolerations against the node's labels, taints and cordon); "
                "its reservation there is released and it is placed again",
            )
            self._run(key, self._replace(key, known.uid))
        elif record is not None and record.held and record.confirmed:
            self._run(key, self._ungate(key, seen, record))
        elif record is not None and record.confirmed:
            self._refused(key, seen, claim, record)

    def _bad_claim(self, key: PodKey, seen: ClaimPod, known: Known | None, error: str) -> None:
        if not is_gated(seen.obj):
            self._say(seen, "BadClaim", f"{error}; not gated by Headroom", "Warning")
            return
        if known is not None:  # what it booked is no longer what it claims
            self._run(key, self._replace(key, known.uid))
        self._say(
            seen,
            "BadClaim",
            f"{error}; it holds no reservation and stays gated until its claim is read",
            "Warning",
        )

    def _record(self, key: PodKey, seen: ClaimPod) -> Record | None:
        known = self._reservations.get(key)
        if known is None or known.pod_uid != seen.uid:
            return None
        return self._state.records.get(known.uid)

    def _say_ran_out(self, seen: ClaimPod, record: Record) -> None:
        seen.expired = True
        self._say(
            seen,
            "Expired",
            f"reservation {record.name} {record.decision.message}, the lifetime its quota "
            "gives; the pod gets no other reservation",
            "Warning",
        )

    def _refused(self, key: PodKey, seen: ClaimPod, claim: PodClaim, record: Record) -> None:
        decision = record.decision
        if decision.phase == Phase.QUEUED:
            where = f" at position {decision.position}" if decision.position else ""
            self._say(
                seen, "Waiting", f"waits for room on node {record.node}{where}: {decision.message}"
            )
            return
        if decision.phase == Phase.RECLAIMED and decision.reason == Reason.OWNER_POD_FINISHED:
            return
        self._say(seen, str(decision.reason), decision.message, "Warning")
        if decision.reason == Reason.WAIT_TIMEOUT and claim.wait is not None:
            return  # its own wait ran out: it stays gated, and says why
        if seen.refused != record.uid:  # first seen refused: it stays visible a while
            seen.refused = record.uid
            self._backoff(seen)
        wait = seen.retry_after - self._clock.monotonic()
        if wait > 0:
            self._later(key, wait)
            return
        self._run(key, self._replace(key, record.uid))  # then a new one is made

    def _backoff(self, seen: ClaimPod) -> None:
        seen.retries += 1
        delay = min(_RETRY_FIRST * 2 ** min(seen.retries - 1, 10), _RETRY_CAP)
        seen.retry_after = self._clock.monotonic() + delay

    # -- the API calls ---------------------------------------------------------------------------

    async def _create(
        self, key: PodKey, seen: ClaimPod, claim: PodClaim, *, node: str | None = None
    ) -> None:
        await self._label_owner(key, seen)
        if node is not None:  # already placed by the scheduler: nothing to choose
            await self._make(key, seen, claim, node, self._call)
            return
        async with self._creating:
            now = self._clock.now()
            placement = choose_node(self._state, self._planned.values(), seen.obj, claim, now)
            node = placement.node
            if node is None:  # nothing is made until a node, a quota or the pod changes
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

    async def _label_owner(self, key: PodKey, seen: ClaimPod) -> None:
        if (seen.obj.get("metadata") or {}).get("labels", {}).get(OWNER_LABEL) == "true":
            return
        await self._call(  # its deletion is then followed like any owner pod's
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
        self, key: PodKey, seen: ClaimPod, claim: PodClaim, node: str, call: Caller
    ) -> bool:
        """Create the pod's reservation (or adopt the one there); whether it is the pod's."""
        max_wait = self._state.ledger.quotas.max_wait(key[0])
        ram, vram = self._state.ledger.capacity(node)
        body = pod_reservation(
            seen.obj, claim, node, max_wait=max_wait, node_ram_mb=ram, node_vram_mb=vram
        )
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
                "ReservationNameTaken",
                f"a Reservation named {key[1]} that no pod owns exists; delete it, "
                "or the pod stays gated",
                "Warning",
            )
            return False
        self.reservation_seen(created)
        if (created.get("metadata") or {}).get("uid") in self._state.records:
            self._planned.pop(key, None)  # adopted, and already decided
        return True
