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

Names are deterministic, so "no pod gets two reservations" holds across restarts
and races: a second create answers 409 and the existing one is adopted if it is
this pod incarnation's.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from headroom.api.claims import PodClaim, pod_claim
from headroom.api.constants import OWNER_LABEL
from headroom.api.parse import InvalidValueError
from headroom.api.paths import PODS, pod_path, reservation_path, resource_path
from headroom.api.reasons import Phase, Reason
from headroom.api.refs import ObjectRef
from headroom.control.placement import choose_node
from headroom.control.state import PodKey, Record, State, deliver_listed, pod_key
from headroom.control.tasks import BackgroundTasks
from headroom.control.telemetry import NoTelemetry, Telemetry
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport, list_all
from headroom.objects.pods import (
    bound_node,
    condition_patch,
    condition_reason,
    is_finished,
    is_gated,
    owning_pod_uid,
    pod_reservation,
    ungate_patch,
)

log = logging.getLogger(__name__)
CLAIM_SELECTOR = "headroom.dev/claim=true"
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


class _DeposedError(Exception):
    """This process may no longer act (it lost the Lease): stop, write nothing."""


@dataclass(slots=True)
class ClaimPod:
    """An opted-in pod as last seen, and where its gate stands."""

    obj: JSON
    uid: str
    gated_at: float | None = None  # monotonic, when first seen gated
    said: str = ""  # the last Event posted about it (one per state)
    retry_after: float = 0.0  # monotonic; no new reservation before
    retries: int = 0
    refused: str = ""  # the uid of its last reservation seen finally refused
    seen_at: float = 0.0  # monotonic: when a watch (or the list asked then) showed it
    # Facts that never go back for one incarnation, kept once seen: a watch event that
    # lags a newer list may show the pod as it was (unbound, running) a moment later.
    node: str | None = None  # the node it was bound to
    ended: bool = False  # Succeeded or Failed
    expired: bool = False  # ran, and its reservation was reclaimed Expired: no other one


class Gates:
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
        self._state, self._transport, self._events, self._clock = state, transport, events, clock
        self._reclaim, self._may_act, self._rng = reclaim, may_act, rng
        self._telemetry = telemetry or NoTelemetry()
        self._pods: dict[PodKey, ClaimPod] = {}
        self._reservations: dict[PodKey, tuple[str, str | None]] = {}  # -> (its uid, pod uid)
        self._pod_of: dict[str, PodKey] = {}  # reservation uid -> the pod key it is named for
        self._unlisted: set[tuple[PodKey, str]] = set()  # pods a list lacked: gone?
        self._busy: set[PodKey] = set()  # a create or an ungate is in flight
        self._stirred: set[PodKey] = set()  # something changed while it was
        # Reservations are created one at a time, in the order pods were seen (a fair
        # lock), so the decider sees them in the pods' creation order; and what is
        # created but not decided yet counts against its node when the next is placed.
        self._creating = asyncio.Lock()
        self._planned: dict[PodKey, tuple[str, int, int]] = {}  # -> (node, RAM, VRAM)
        self._tasks = BackgroundTasks()
        self._timers: dict[PodKey, asyncio.TimerHandle] = {}
        self.started = False  # nothing is done before the ledger is rebuilt

    # -- what the operator sees --------------------------------------------------------------

    @property
    def gated(self) -> int:
        """Pods held by our gate now."""
        return sum(1 for pod in self._pods.values() if is_gated(pod.obj))

    def on_pod(self, event_type: str | None, obj: JSON, *, listed_at: float | None = None) -> None:
        meta = obj.get("metadata") or {}
        key = pod_key(obj)
        uid = str(meta.get("uid", ""))
        if event_type == "DELETED":
            seen = self._pods.get(key)
            if seen is not None and seen.uid == uid:
                del self._pods[key]
                self._tasks.spawn(self._gone(key, uid))
            return
        seen = self._pods.get(key)
        if listed_at is not None and seen is not None and seen.seen_at >= listed_at:
            return  # a watch event since the list was asked for is newer
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
        for key in [k for k in self._pods if k not in listed]:
            del self._pods[key]
        # A pod deleted while nobody watched (the operator down, a watch gap): its
        # reservation, if it holds nothing, goes now, not at the next resync.
        for key, (_, pod_uid) in list(self._reservations.items()):
            if key not in listed and pod_uid is not None:
                self._unlisted.add((key, pod_uid))
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
        if self._reservations.get(key, ("", None))[0] != uid:
            self._reservations[key] = (uid, pod_uid)
            self._pod_of[uid] = key
            self.poke(key)

    def reservation_gone(self, uid: str) -> None:
        key = self._pod_of.pop(uid, None)
        if key is not None:
            self._planned.pop(key, None)
        if key is not None and self._reservations.get(key, ("", None))[0] == uid:
            del self._reservations[key]
            self.poke(key)

    def decided(self, record: Record) -> None:
        """A decision reached its object: a gated pod may go now."""
        key = (record.namespace, record.name)
        self._planned.pop(key, None)  # the ledger holds it now, or never will
        if key in self._reservations:
            self.poke(key)

    def nodes_changed(self) -> None:
        """A node came, went or changed: pods that found no node may find one now."""
        for key, pod in self._pods.items():
            if key not in self._reservations and is_gated(pod.obj):
                self.poke(key)

    def bound_to(self, namespace: str, pod: str) -> str | None:
        """The node a claiming pod runs on, if any (a bound pod has no gate); what the
        admission of its reservation reads, so from the facts kept, not the last event."""
        seen = self._pods.get((namespace, pod))
        if seen is None or seen.ended or is_finished(seen.obj):
            return None
        return seen.node

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
        try:
            claim = pod_claim(pod)
        except InvalidValueError as error:
            self._say(seen, "BadClaim", f"{error}; not gated by Headroom", "Warning")
            return
        known = self._reservations.get(key)
        wait = seen.retry_after - self._clock.monotonic()
        if known is None and wait > 0:
            self._later(key, wait)  # refused a moment ago: not again at once
            return
        if known is not None and known[1] != seen.uid:
            # Left by an earlier pod of the same name (its owner is gone: the garbage
            # collector deletes it too); this pod gets its own.
            self._run(key, self._replace(key, known[0]))
        elif is_gated(pod):
            if known is None:
                self._run(key, self._create(key, seen, claim))
            elif record is not None and record.held and record.confirmed:
                self._run(key, self._ungate(key, seen, record))
            elif record is not None and record.confirmed:
                self._refused(key, seen, claim, record)
        elif record is not None and record.confirmed and _expired(record):
            self._say_ran_out(seen, record)
        elif known is None and not _ran_out(seen) and (node := bound_node(pod)) is not None:
            self._run(key, self._create(key, seen, claim, node=node))  # the webhook missed it
        elif record is not None and record.confirmed and record.held and _over(record):
            self._say(seen, "OverCommitted", record.decision.message, "Warning")

    def _record(self, key: PodKey, seen: ClaimPod) -> Record | None:
        known = self._reservations.get(key)
        if known is None or known[1] != seen.uid:
            return None
        return self._state.records.get(known[0])

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
        if node is not None:  # already placed by the scheduler: nothing to choose
            await self._make(key, seen, claim, node)
            return
        async with self._creating:
            now = self._clock.now()
            placement = choose_node(self._state, self._planned.values(), seen.obj, claim, now)
            node = placement.node
            if node is None:  # nothing is made until a node, a quota or the pod changes
                self._say(seen, placement.reason, placement.why, "Warning")
                return
            self._planned[key] = (node, claim.ram_mb, claim.vram_mb)
            try:
                await self._make(key, seen, claim, node)
            except BaseException:
                self._planned.pop(key, None)
                raise

    async def _make(self, key: PodKey, seen: ClaimPod, claim: PodClaim, node: str) -> None:
        if (seen.obj.get("metadata") or {}).get("labels", {}).get(OWNER_LABEL) != "true":
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
        max_wait = self._state.ledger.quotas.max_wait(key[0])
        body = pod_reservation(seen.obj, claim, node, max_wait=max_wait)
        path = resource_path("headroom.dev", "v1alpha1", "reservations", key[0])
        try:
            created = await self._call(lambda: self._transport.create(path, body))
        except ApiError as error:
            if error.status != 409:
                raise
            created = await self._call(lambda: self._transport.get(reservation_path(*key)))
        if owning_pod_uid(created) is None:  # a tenant's own reservation has the pod's name
            self._backoff(seen)
            self._say(
                seen,
                "ReservationNameTaken",
                f"a Reservation named {key[1]} that no pod owns exists; delete it, "
                "or the pod stays gated",
                "Warning",
            )
            return
        self.reservation_seen(created)
        if (created.get("metadata") or {}).get("uid") in self._state.records:
            self._planned.pop(key, None)  # adopted, and already decided

    async def _gone(self, key: PodKey, pod_uid: str) -> None:
        """A claiming pod left the watch: deleted, or only unlabelled? If it is gone, a
        reservation of its that holds nothing (it waited) is deleted now; one that holds
        memory is reclaimed through its owner label (``OwnerPodDeleted``), and the
        garbage collector deletes either with the pod."""
        known = self._reservations.get(key)
        if known is None or known[1] != pod_uid or not self.started or not self._may_act():
            return
        record = self._state.records.get(known[0])
        if record is not None and record.held:
            return
        try:
            pod = await self._call(lambda: self._transport.get(pod_path(*key)))
            if (pod.get("metadata") or {}).get("uid") == pod_uid:
                return  # still there, only unlabelled: its reservation stays
        except ApiError as error:
            if not error.not_found:
                log.warning("pod %s/%s not read (%s); the resync looks again", *key, error)
                return
        except _DeposedError:
            return
        try:
            await self._replace(key, known[0])
        except (ApiError, _DeposedError) as error:
            log.warning("reservation of pod %s/%s not deleted (%s)", *key, error)

    async def _replace(self, key: PodKey, uid: str) -> None:
        """Delete a reservation this pod cannot use (an earlier pod's, or one refused)."""
        try:
            await self._call(lambda: self._transport.delete(reservation_path(*key), uid=uid))
        except ApiError as error:
            if not (error.not_found or error.conflict):
                raise
        self.reservation_gone(uid)

    async def _ungate(self, key: PodKey, seen: ClaimPod, record: Record) -> None:
        devices = record.decision.devices
        expiry = record.decision.expires_at  # a quota's lifetime: the pod ends by then
        left = expiry - self._clock.now() if expiry is not None else None
        operations = ungate_patch(seen.obj, record.node, record.name, devices, time_left=left)
        if operations is None:
            return
        try:
            pod = await self._call(lambda: self._transport.json_patch(pod_path(*key), operations))
        except ApiError as error:
            if error.not_found:
                return  # gone: its owner label releases the reservation
            current = await self._fresh(key)
            same = current is not None and (current.get("metadata") or {}).get("uid") == seen.uid
            if same and current is not None and is_gated(current) and error.status != 409:
                again = ungate_patch(current, record.node, record.name, devices, time_left=left)
                if again != operations:
                    # Sent from a stale view (another controller moved the gates, say):
                    # not a refusal. Again, from the pod as it is now.
                    self._stirred.add(key)
                    return
                self._telemetry.ungate_failed(error.reason or str(error.status))
                why = f"pod {key[1]} could not be pinned to {record.node} and ungated: "
                self._reclaim(record, Reason.UNGATE_REFUSED, why + error.message)
                self._say(seen, "UngateRefused", why + error.message, "Warning")
            return
        seen.obj = pod
        if seen.gated_at is not None:
            self._telemetry.ungated(self._clock.monotonic() - seen.gated_at)
        on = f"; GPU devices {','.join(sorted(devices))}" if devices else ""
        self._say(seen, "Admitted", f"pinned to node {record.node}; reservation {record.name}{on}")

    async def _fresh(self, key: PodKey) -> JSON | None:
        try:
            pod = await self._call(lambda: self._transport.get(pod_path(*key)))
        except ApiError as error:
            if error.not_found:
                return None
            raise
        seen = self._pods.get(key)
        if seen is not None and seen.uid == (pod.get("metadata") or {}).get("uid"):
            seen.obj = pod
        return pod

    async def _call(self, call: Callable[[], Awaitable[JSON]]) -> JSON:
        """Retry what got no answer (or 429/5xx); an answer that says no is raised."""
        backoff = Backoff(base=0.2, cap=10.0, rng=self._rng)
        while True:
            if not self._may_act():
                raise _DeposedError
            try:
                return await call()
            except ApiError as error:
                if not error.retriable:
                    raise
                failure: Exception = error
            except ApiUnavailableError as error:
                failure = error
            delay = backoff.next()
            log.warning("gating call failed (%s); again in %.1fs", failure, delay)
            await asyncio.sleep(delay)

    # -- plumbing -----------------------------------------------------------------------------

    def _run(self, key: PodKey, coroutine: Coroutine[Any, Any, None]) -> None:
        self._busy.add(key)

        async def one_at_a_time() -> None:
            try:
                await coroutine
            except _DeposedError:
                self._busy.discard(key)
                return  # the next leader does it
            except (ApiError, ApiUnavailableError) as error:
                log.warning("pod %s/%s: %s; tried again", *key, error)
                self._later(key, _RETRY_FIRST)
            except Exception:
                log.exception("pod %s/%s not handled", *key)
            finally:
                self._busy.discard(key)
            if key in self._stirred:
                self._stirred.discard(key)
                self.poke(key)

        self._tasks.spawn(one_at_a_time())

    def _later(self, key: PodKey, delay: float) -> None:
        if key in self._timers:
            return
        loop = asyncio.get_running_loop()

        def again() -> None:
            self._timers.pop(key, None)
            self.poke(key)

        self._timers[key] = loop.call_later(delay, again)

    def _say(
        self,
        seen: ClaimPod,
        reason: str,
        message: str,
        kind: Literal["Normal", "Warning"] = "Normal",
    ) -> None:
        """One Event per state of the pod (not one per poke)."""
        said = f"{reason}:{message}"
        if seen.said == said:
            return
        seen.said = said
        meta = seen.obj.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        self._events.record(ObjectRef("v1", "Pod", key[1], seen.uid, key[0]), reason, message, kind)
        admitted = "True" if reason in ("Admitted", "OverCommitted") else "False"
        now = self._clock.now().isoformat().replace("+00:00", "Z")
        patch = condition_patch(seen.obj, admitted, reason, message, now)
        self._tasks.spawn(self._set_condition(key, patch))

    async def _set_condition(self, key: PodKey, patch: list[JSON]) -> None:
        """Best effort: the Event says the same, and the next change writes it again."""
        if not self._may_act():
            return
        try:
            await self._transport.json_patch(pod_path(*key) + "/status", patch)
        except (ApiError, ApiUnavailableError) as error:
            log.debug("condition of pod %s/%s not written: %s", *key, error)

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        await self._tasks.stop()
