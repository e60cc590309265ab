"""The API calls of pod gating, and the plumbing that runs them one pod at a time.

Split from :mod:`headroom.control.gates`, which decides what a pod needs next; this
module does it: delete a reservation the pod cannot use, pin and ungate, let a pod
that claims nothing go, write the pod's condition. Per pod, at most one call is in
flight (``_run``); a change seen meanwhile makes the pod looked at again when it
ends, and a call that failed is tried again after a per-pod backoff, so one pod's
trouble never holds up another's.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from headroom.api.constants import CLAIM_LABEL, RESERVATION_ANNOTATION, SCHEDULING_GATE
from headroom.api.paths import pod_path, reservation_path
from headroom.api.reasons import Reason
from headroom.api.refs import ObjectRef
from headroom.control.state import PodKey, Record, State
from headroom.control.tasks import BackgroundTasks
from headroom.control.telemetry import NoTelemetry, Telemetry
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport
from headroom.objects.podreservations import (
    Booked,
    gate_removal_patch,
    pod_condition,
)
from headroom.objects.pods import (
    CONDITION,
    condition_patch,
    is_gated,
    ungate_patch,
)

log = logging.getLogger(__name__)
_CREATE_TIMEOUT = 10.0  # seconds one create may hold the placement lock


@dataclass(frozen=True, slots=True)
class Known:
    """A pod-owned Reservation named as a pod: its uid, its owner's uid, what it books."""

    uid: str
    pod_uid: str
    book: Booked


#: How a call is made: ``PodCalls._call`` (retried) or ``PodCalls._once``.
Caller = Callable[[Callable[[], Awaitable[JSON]]], Awaitable[JSON]]


class DeposedError(Exception):
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
    sent: tuple[str, ...] = ()  # the condition last written, and the pod version it saw
    failures: int = 0  # API calls that failed in a row (its next try backs off)
    seen_at: float = 0.0  # monotonic: when a watch (or the list asked then) showed it
    # Facts that never go back for one incarnation, kept once seen: a watch event that
    # lags a newer list may show the pod as it was (unbound, running) a moment later.
    node: str | None = None  # the node it was bound to
    ended: bool = False  # Succeeded or Failed
    expired: bool = False  # ran, and its reservation was reclaimed Expired: no other one


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
        self._pods: dict[PodKey, ClaimPod] = {}
        self._reservations: dict[PodKey, Known] = {}
        self._busy: set[PodKey] = set()  # a create or an ungate is in flight
        self._stirred: set[PodKey] = set()  # something changed while it was
        self._tasks = BackgroundTasks()
        self._timers: dict[PodKey, asyncio.TimerHandle] = {}
        self.started = False  # nothing is done before the ledger is rebuilt

    def poke(self, key: PodKey) -> None:
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

    async def _let_go(self, key: PodKey, seen: ClaimPod, known: Known | None) -> None:
        """A pod our gate holds that claims nothing (its label removed, or never there):
        whatever it booked is released, and our gate goes, so it schedules as any pod."""
        if known is not None:
            await self._replace(key, known.uid)
        operations = gate_removal_patch(seen.obj)
        if operations is None:
            return
        self._say(
            seen,
            "NotClaimed",
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
            self._stirred.add(key)

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
        self._say(seen, "Admitted", self._admitted_message(pod, record))

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
                raise DeposedError
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

    async def _once(self, call: Callable[[], Awaitable[JSON]]) -> JSON:
        """One attempt, bounded in time; any failure is raised (the pod is tried again later)."""
        if not self._may_act():
            raise DeposedError
        try:
            return await asyncio.wait_for(call(), _CREATE_TIMEOUT)
        except TimeoutError as error:
            raise ApiUnavailableError(f"no answer in {_CREATE_TIMEOUT:.0f}s") from error

    def _admitted_message(self, pod: JSON, record: Record) -> str:
        devices = record.decision.devices
        on = f"; GPU devices {','.join(sorted(devices))}" if devices else ""
        if RESERVATION_ANNOTATION not in ((pod.get("metadata") or {}).get("annotations") or {}):
            return f"recorded on node {record.node}, where it runs; reservation {record.name}{on}"
        return f"pinned to node {record.node}; reservation {record.name}{on}"

    # -- plumbing -----------------------------------------------------------------------------

    def _run(self, key: PodKey, coroutine: Coroutine[Any, Any, None]) -> None:
        self._busy.add(key)

        async def one_at_a_time() -> None:
            delay = 0.0
            try:
                await coroutine
            except DeposedError:
                self._busy.discard(key)
                return  # the next leader does it
            except (ApiError, ApiUnavailableError) as error:
                delay = self._failed(key)
                log.warning("pod %s/%s: %s; tried again in %.1fs", *key, error, delay)
            except Exception:
                log.exception("pod %s/%s not handled", *key)
            else:
                self._succeeded(key)
            finally:
                self._busy.discard(key)
            if delay > 0:
                self._stirred.discard(key)
                self._later(key, delay)
            elif key in self._stirred:
                self._stirred.discard(key)
                self.poke(key)

        self._tasks.spawn(one_at_a_time())

    def _failed(self, key: PodKey) -> float:
        """The pod's next try: backed off per pod (0.5 s doubling to 30 s, jittered)."""
        seen = self._pods.get(key)
        failures = 0
        if seen is not None:
            seen.failures += 1
            failures = seen.failures
        ceiling = min(30.0, 0.5 * 2.0 ** min(failures, 10))
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    def _succeeded(self, key: PodKey) -> None:
        seen = self._pods.get(key)
        if seen is not None:
            seen.failures = 0

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
        """One Event per state of the pod (not one per poke); the condition to match."""
        said = f"{reason}:{message}"
        if seen.said != said:
            seen.said = said
            meta = seen.obj.get("metadata") or {}
            ref = ObjectRef("v1", "Pod", str(meta.get("name")), seen.uid, meta.get("namespace"))
            self._events.record(ref, reason, message, kind)
        self._condition(seen, reason, message)

    def _condition(self, seen: ClaimPod, reason: str, message: str) -> None:
        """Make the pod's condition say this, unless it does (level-triggered: a condition
        lost to a restart or to someone's patch is written again at the next pass)."""
        status = "True" if reason in ("Admitted", "OverCommitted") else "False"
        wanted = (status, reason, message[:1024])
        if pod_condition(seen.obj, CONDITION) == wanted:
            return
        version = str((seen.obj.get("metadata") or {}).get("resourceVersion", ""))
        if seen.sent == (*wanted, version):
            return  # written from this view of the pod already; the watch will tell
        sent = seen.sent = (*wanted, version)
        meta = seen.obj.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        now = self._clock.now().isoformat().replace("+00:00", "Z")
        patch = condition_patch(seen.obj, status, reason, message, now)
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
            seen = self._pods.get(key)
            if seen is not None and seen.sent == sent:
                seen.sent = ()
                self._later(key, self._failed(key))

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        await self._tasks.stop()
