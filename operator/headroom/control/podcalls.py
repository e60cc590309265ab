"""The API calls of pod gating, run from the pods' keyed work queue.

Split from :mod:`headroom.control.gates` (the reconcile of one pod key) and
:mod:`headroom.control.podactions` (what a pod needs next, decided purely); this
module does it: delete a reservation the pod cannot use, pin and ungate, let a pod
that claims nothing go, write the pod's condition. The queue
(:class:`headroom.kube.workqueue.WorkQueue`) runs one pass per pod at a time: a
change seen meanwhile makes the pod looked at again when the pass ends, and a pass
whose call failed is tried again after the pod's own backoff, so one pod's trouble
never holds up another's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Literal

from headroom.api.claims import pod_claim
from headroom.api.constants import CLAIM_LABEL, FENCE_ANNOTATION, ROOM_ANNOTATION, SCHEDULING_GATE
from headroom.api.parse import InvalidValueError
from headroom.api.paths import pod_path, reservation_path
from headroom.api.reasons import EventReason, Reason
from headroom.api.refs import ObjectRef
from headroom.control.podactions import ClaimPod, Known, admitted_message
from headroom.control.state import PodKey, Record, State
from headroom.control.tasks import BackgroundTasks
from headroom.control.telemetry import NoTelemetry, Telemetry
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.events import EventRecorder
from headroom.kube.retry import retry_call, transient
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport
from headroom.kube.workqueue import WorkQueue
from headroom.objects.podreservations import (
    annotation_patch,
    differences,
    gate_removal_patch,
    pod_condition,
)
from headroom.objects.pods import (
    CONDITION,
    bound_node,
    condition_patch,
    is_gated,
    ungate_patch,
)

log = logging.getLogger(__name__)
_CREATE_TIMEOUT = 10.0  # seconds one create may hold the placement lock
#: No ungate or Binding is sent with less of its reservation's lifetime left: the API
#: server's shortest ``activeDeadlineSeconds`` is 1 s, so a pod let out later could not
#: be made to end by then, and its reservation runs out while the call is on its way.
UNGATE_MARGIN = timedelta(seconds=1)


#: How a call is made: ``PodCalls._call`` (retried) or ``PodCalls._once``.
Caller = Callable[[Callable[[], Awaitable[JSON]]], Awaitable[JSON]]


class DeposedError(Exception):
    """This process may no longer act (it lost the Lease): stop, write nothing."""


class WithdrawnError(Exception):
    """The admission a call was to carry out is no longer the ledger's: not sent."""


def runs_long_enough(record: Record, now: datetime) -> bool:
    """Whether ``record``'s lifetime, if it has one, has ``UNGATE_MARGIN`` still to run."""
    expiry = record.decision.expires_at
    return expiry is None or expiry - now >= UNGATE_MARGIN


class PodCalls:
    """What Gates acts with: the pods it follows, their reservations, and the calls."""

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
        self._claim_pods: dict[PodKey, ClaimPod] = {}
        self._reservations: dict[PodKey, Known] = {}
        self._tasks = BackgroundTasks()  # condition writes and checks of pods gone
        # Per-pod failures back off 1 s doubling to 30 s, jittered.
        self._queue: WorkQueue[PodKey] = WorkQueue(
            self._reconcile, clock=clock, rng=rng, base=1.0, cap=30.0, name="gated pod"
        )
        self.started = False  # nothing is done before the ledger is rebuilt
        # Binds in flight (:mod:`headroom.control.binder`) wait on these, not on a timer.
        self._changes: dict[PodKey, asyncio.Event] = {}  # the pod or its reservation changed
        self._releases: dict[str, asyncio.Event] = {}  # reservation uid -> the ledger let it go
        # One bind or fence of a pod at a time: its lock, and how many hold or wait for it.
        self._binds: dict[PodKey, tuple[asyncio.Lock, int]] = {}

    def poke(self, key: PodKey) -> None:
        """Look at the pod again: its key goes on the work queue."""
        if self.started:
            self._queue.add(key)
        changed = self._changes.pop(key, None)
        if changed is not None:
            changed.set()

    def _released(self, uid: str) -> None:
        released = self._releases.pop(uid, None)
        if released is not None:
            released.set()

    # -- what a bind reads and does (the binder's ``BindGates``) ---------------------------------

    @contextlib.asynccontextmanager
    async def bind_lock(self, key: PodKey) -> AsyncIterator[None]:
        """Held while the pod is bound or fenced: never both, never two binds at once.
        The lock is dropped only when no one holds *or waits for* it: one dropped while
        a waiter was about to take it would let a newcomer take a second lock."""
        lock, users = self._binds.get(key, (asyncio.Lock(), 0))
        self._binds[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._binds[key]
            if users == 1:
                del self._binds[key]
            else:
                self._binds[key] = (lock, users - 1)

    def binding(self, key: PodKey) -> bool:
        """Whether a bind (or fence) of the pod runs or waits to."""
        return key in self._binds

    def reservation_of(self, key: PodKey) -> Known | None:
        return self._reservations.get(key)

    def record_of(self, key: PodKey, pod_uid: str) -> Record | None:
        """The decision about the pod's reservation, if it was made for incarnation ``pod_uid``."""
        known = self._reservations.get(key)
        if known is None or known.pod_uid != pod_uid:
            return None
        return self._state.records.get(known.uid)

    def record_for_claim(self, key: PodKey, pod: JSON) -> Record | None:
        """The decision about the pod's reservation if it was made for this incarnation
        and, unless it holds an admission, for its claim as it is now (one that waits for
        a claim edited since is replaced at the next queue, not judged as the pod's)."""
        known = self._reservations.get(key)
        record = self.record_of(key, str((pod.get("metadata") or {}).get("uid", "")))
        if known is None or record is None:
            return None
        if record.held:  # its node passes; the bind replaces it if the claim changed
            return record
        try:
            claim = pod_claim(pod)
        except InvalidValueError:
            return None
        return None if differences(known.book, key[1], claim) else record

    def holds(self, uid: str) -> bool:
        """Whether the ledger still has reservation ``uid`` (its deletion not seen yet)."""
        return uid in self._state.records

    async def changed(self, key: PodKey) -> None:
        """Until the pod or its reservation changes (the caller bounds the wait)."""
        await self._changes.setdefault(key, asyncio.Event()).wait()

    async def released(self, uid: str) -> None:
        """Until the ledger no longer holds reservation ``uid`` (its deletion was seen)."""
        if uid in self._state.records:
            await self._releases.setdefault(uid, asyncio.Event()).wait()

    async def fresh(self, key: PodKey) -> JSON | None:
        """The pod as the API has it now (None: it does not exist)."""
        return await self._fresh(key)

    async def delete_reservation(self, key: PodKey, uid: str) -> None:
        await self._replace(key, uid)

    async def patch_pod(self, key: PodKey, operations: list[JSON]) -> JSON:
        return await self._call(lambda: self._transport.json_patch(pod_path(*key), operations))

    async def post(
        self, path: str, body: JSON, *, only_while: Callable[[], bool] = lambda: True
    ) -> JSON:
        """Create ``body`` at ``path``, retried; every attempt is made only while
        ``only_while()`` holds, else :class:`WithdrawnError`."""

        async def create() -> JSON:
            if not only_while():
                raise WithdrawnError
            return await self._transport.create(path, body)

        return await self._call(create)

    async def _reconcile(self, key: PodKey) -> None:
        raise NotImplementedError

    def reservation_gone(self, uid: str) -> None:
        raise NotImplementedError

    async def _gone(self, key: PodKey, pod_uid: str) -> None:
        """A claiming pod left the watch: deleted, or only unlabelled? If it is gone, a
        reservation of its that holds nothing (it waited) is deleted now; one that holds
        memory is reclaimed through its owner label (``OwnerPodDeleted``), and the
        garbage collector deletes either with the pod."""
        known = self._reservations.get(key)
        if known is None or known.pod_uid != pod_uid or not self.started or not self._may_act():
            return
        record = self._state.records.get(known.uid)
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
        except DeposedError:
            return
        try:
            await self._replace(key, known.uid)
        except (ApiError, DeposedError) as error:
            log.warning("reservation of pod %s/%s not deleted (%s)", *key, error)

    async def _replace(self, key: PodKey, uid: str) -> None:
        """Delete a reservation this pod cannot use (an earlier pod's, or one refused)."""
        try:
            await self._call(lambda: self._transport.delete(reservation_path(*key), uid=uid))
        except ApiError as error:
            if not (error.not_found or error.conflict):
                raise
        self.reservation_gone(uid)

    async def _let_go(self, key: PodKey, seen: ClaimPod, uid: str | None) -> None:
        """A pod our gate holds that claims nothing (its label removed, or never there):
        whatever it booked (reservation ``uid``) is released, and our gate goes, so it
        schedules as any pod."""
        if uid is not None:
            await self._replace(key, uid)
        operations = gate_removal_patch(seen.obj)
        if operations is None:
            return
        self._say(
            seen,
            EventReason.NOT_CLAIMED,
            f'not labelled {CLAIM_LABEL}: "true", so it claims nothing: its reservation, if '
            f"any, is released and the scheduling gate {SCHEDULING_GATE} removed",
        )
        try:
            seen.obj = await self._call(
                lambda: self._transport.json_patch(pod_path(*key), operations)
            )
        except ApiError as error:
            if error.not_found:
                return
            await self._fresh(key)  # a stale view (the gates moved): again, from the pod now
            self._queue.add(key)

    async def _ungate(self, key: PodKey, seen: ClaimPod, record: Record) -> None:
        """Pin, name and ungate in one patch, while ``record`` admits the pod: every
        attempt (a failed one is retried, for as long as the network takes) is made only
        if the ledger still holds that admission with at least ``UNGATE_MARGIN`` of its
        lifetime left, and sets the deadline from the time left then. An admission
        reclaimed or run out meanwhile is not let out: the pod is looked at again."""
        devices = record.decision.devices
        expiry = record.decision.expires_at  # a quota's lifetime: the pod ends by then
        view = seen.obj  # the pod as the decision saw it: every attempt tests for it
        left = expiry - self._clock.now() if expiry is not None else None
        operations = ungate_patch(view, record.node, record.name, devices, time_left=left)
        if operations is None:
            return

        async def ungate() -> JSON:
            nonlocal left, operations
            if not self._admits(record):
                raise WithdrawnError
            if expiry is not None:  # its deadline as of this attempt
                left = expiry - self._clock.now()
                operations = ungate_patch(view, record.node, record.name, devices, time_left=left)
            return await self._transport.json_patch(pod_path(*key), operations or [])

        try:
            pod = await self._call(ungate)
        except WithdrawnError:
            # Reclaimed meanwhile: the written decision brings the pod back (see
            # ``Gates.decided``). About to run out: the sweep reclaims it within a second or
            # two. Either way it is looked at again then, not at once.
            self._queue.add_after(key, UNGATE_MARGIN.total_seconds())
            return
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
                    self._queue.add(key)
                    return
                self._telemetry.ungate_failed(error.reason or str(error.status))
                why = f"pod {key[1]} could not be pinned to {record.node} and ungated: "
                self._reclaim(record, Reason.UNGATE_REFUSED, why + error.message)
                self._say(seen, Reason.UNGATE_REFUSED, why + error.message, "Warning")
            return
        seen.obj = pod
        if seen.gated_at is not None:
            self._telemetry.ungated(self._clock.monotonic() - seen.gated_at)
        self._say(seen, EventReason.ADMITTED, admitted_message(pod, record))

    def _admits(self, record: Record) -> bool:
        """Whether the ledger still admits the pod on ``record``: its decision, held, with
        ``UNGATE_MARGIN`` of its lifetime (if it has one) still to run."""
        if self._state.records.get(record.uid) is not record or not record.held:
            return False
        return runs_long_enough(record, self._clock.now())

    async def _fence(self, key: PodKey, seen: ClaimPod, record: Record) -> None:
        """Admitted for kube-scheduler's choice, and no Binding came in time: one write on
        the pod first (its resourceVersion moves, so a Binding still on its way, from this
        leader or an earlier one, is refused), then, unless the pod is bound after all,
        its reservation goes. The scheduler's next try decides again."""
        if self.binding(key):
            self._queue.add_after(key, 1.0)  # a bind runs: it ends in time or fails
            return
        async with self.bind_lock(key):
            # Unique, so that a fence written again (its release failed) still moves the
            # pod's resourceVersion.
            value = f"{record.uid}@{self._clock.now().isoformat()}"
            fence = annotation_patch(seen.obj, FENCE_ANNOTATION, value)
            try:
                pod = await self._call(lambda: self._transport.json_patch(pod_path(*key), fence))
            except ApiError as error:
                if error.not_found:
                    return  # gone: its owner label releases the reservation
                raise
            seen.obj = pod
            if bound_node(pod) is not None:
                return  # bound after all: it keeps what it was admitted
            self._say(
                seen,
                EventReason.BIND_TIMEOUT,
                f"admitted on node {record.node} but not bound there by the scheduler in "
                "time; its reservation is released, and the scheduler's next try decides again",
                "Warning",
            )
            await self._replace(key, record.uid)

    async def _nudge(self, key: PodKey, seen: ClaimPod, record: Record) -> None:
        """One write on a pod kube-scheduler left unschedulable, so that it tries the pod
        now: its reservation was admitted from the ledger's queue, or refused (its next
        filter queues it again). Once per reservation."""
        value = f"{record.uid}@{self._clock.now().isoformat()}"
        try:
            seen.obj = await self._call(
                lambda: self._transport.json_patch(
                    pod_path(*key), annotation_patch(seen.obj, ROOM_ANNOTATION, value)
                )
            )
        except ApiError as error:
            if not error.not_found:
                raise
        seen.nudged = record.uid
        self._queue.add(key)  # then, admitted, the bind grace runs

    async def _fresh(self, key: PodKey) -> JSON | None:
        try:
            pod = await self._call(lambda: self._transport.get(pod_path(*key)))
        except ApiError as error:
            if error.not_found:
                return None
            raise
        seen = self._claim_pods.get(key)
        if seen is not None and seen.uid == (pod.get("metadata") or {}).get("uid"):
            seen.obj = pod
        return pod

    async def _call(self, call: Callable[[], Awaitable[JSON]]) -> JSON:
        """Retry what got no answer (or 429/5xx); an answer that says no is raised."""

        async def attempt() -> JSON:
            if not self._may_act():  # deposed meanwhile: not retried, the next leader acts
                raise DeposedError
            return await call()

        def failed(error: Exception, delay: float) -> None:
            log.warning("gating call failed (%s); again in %.1fs", error, delay)

        return await retry_call(
            attempt,
            backoff=Backoff(base=0.2, cap=10.0, rng=self._rng),
            retry_on=transient,
            on_retry=failed,
        )

    async def _once(self, call: Callable[[], Awaitable[JSON]]) -> JSON:
        """One attempt, bounded in time; any failure is raised (the pod is tried again later)."""
        if not self._may_act():
            raise DeposedError
        try:
            return await asyncio.wait_for(call(), _CREATE_TIMEOUT)
        except TimeoutError as error:
            raise ApiUnavailableError(f"no answer in {_CREATE_TIMEOUT:.0f}s") from error

    def _say(
        self,
        seen: ClaimPod,
        reason: Reason | EventReason,
        message: str,
        kind: Literal["Normal", "Warning"] = "Normal",
    ) -> None:
        """One Event per state of the pod (not one per poke); the condition to match."""
        said = f"{reason}:{message}"
        if seen.said != said:
            seen.said = said
            meta = seen.obj.get("metadata") or {}
            ref = ObjectRef("v1", "Pod", str(meta.get("name")), seen.uid, meta.get("namespace"))
            self._events.record(ref, reason, message, kind)
        self._condition(seen, reason, message)

    def _condition(self, seen: ClaimPod, reason: Reason | EventReason, message: str) -> None:
        """Make the pod's condition say this, unless it does (level-triggered: a condition
        lost to a restart or to someone's patch is written again at the next pass)."""
        admitted = reason in (EventReason.ADMITTED, Reason.OVER_COMMITTED)
        status, word = "True" if admitted else "False", str(reason)  # its plain word
        wanted = (status, word, message[:1024])
        if pod_condition(seen.obj, CONDITION) == wanted:
            return
        version = str((seen.obj.get("metadata") or {}).get("resourceVersion", ""))
        if seen.sent == (*wanted, version):
            return  # written from this view of the pod already; the watch will tell
        sent = seen.sent = (*wanted, version)
        meta = seen.obj.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        now = self._clock.now().isoformat().replace("+00:00", "Z")
        patch = condition_patch(seen.obj, status, word, message, now)
        self._tasks.spawn(self._set_condition(key, patch, sent))

    async def _set_condition(self, key: PodKey, patch: list[JSON], sent: tuple[str, ...]) -> None:
        """Best effort, but not forgotten: one that failed is written again at a pass soon
        (a pod that nothing changes, waiting for a node, would otherwise never say why)."""
        if not self._may_act():
            return
        try:
            await self._transport.json_patch(pod_path(*key) + "/status", patch)
        except (ApiError, ApiUnavailableError) as error:
            log.debug("condition of pod %s/%s not written: %s", *key, error)
            seen = self._claim_pods.get(key)
            if seen is not None and seen.sent == sent:
                seen.sent = ()
                self._queue.add_rate_limited(key)

    async def stop(self) -> None:
        await self._queue.shut_down()
        await self._tasks.stop()
