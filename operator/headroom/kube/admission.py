"""Admission: one decider, in creation order, decisions in memory before any await.

Reservations waiting for a decision sit in a queue keyed by uid. One task drains
it: each batch is sorted by creation time (ties by the order the watch delivered
them, which follows etcd's revision order), and each reservation is decided by
the pure ledger synchronously, so two reservations can never both take the same
last bit of headroom. Only then is the decision written to status; writes proceed
concurrently, and a write that fails rolls its entry back out of the ledger and
puts the reservation back in the queue.

Memory stays flat under a burst: the queue keeps only the fields a decision reads
(not managedFields and other annotations), and at most ``MAX_WRITES_IN_FLIGHT``
decisions are being written at once; the decider waits for a free slot *between*
decisions, never inside one. Without that bound a backlog of 30,000 became 30,000
write tasks at once and the operator grew past 1 GB.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from headroom.api.constants import HEARTBEAT_ANNOTATION
from headroom.api.reasons import Phase, Reason
from headroom.kube.client import JSON, ApiError, KubeClient
from headroom.kube.events import EventRecorder
from headroom.kube.metrics import OperatorMetrics
from headroom.kube.objects import reservation_entry
from headroom.kube.state import State, Tracked
from headroom.kube.status import decision_status, reservation_ref, write_status

log = logging.getLogger(__name__)
_RETRY_DELAY = 0.5
_MAX_RETRY_DELAY = 5.0
MAX_WRITES_IN_FLIGHT = 128  # twice the client's connection pool: it stays saturated


@dataclass(slots=True)
class Pending:
    uid: str
    namespace: str
    name: str
    obj: JSON
    order: tuple[str, int]
    seen: float = field(default_factory=time.monotonic)


class Admission:
    def __init__(
        self, state: State, client: KubeClient, events: EventRecorder, metrics: OperatorMetrics
    ) -> None:
        self._state, self._client, self._events, self._metrics = state, client, events, metrics
        self._queue: dict[str, Pending] = {}
        self._wake = asyncio.Event()
        self._sequence = itertools.count()
        self._writes: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(MAX_WRITES_IN_FLIGHT)
        self.run_id = uuid.uuid4().hex[:8]
        self._decisions = itertools.count(1)

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, obj: JSON) -> None:
        """Queue an undecided reservation (idempotent: a uid is queued once)."""
        obj = _essentials(obj)
        metadata = obj["metadata"]
        uid = metadata["uid"]
        if uid in self._queue:
            self._queue[uid].obj = obj  # newest body, e.g. a heartbeat annotation
            return
        order = (metadata.get("creationTimestamp", ""), next(self._sequence))
        self._queue[uid] = Pending(uid, metadata["namespace"], metadata["name"], obj, order)
        self._wake.set()

    def withdraw(self, uid: str) -> None:
        self._queue.pop(uid, None)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="admission")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            for pending in sorted(self._queue.values(), key=lambda p: p.order):
                await self._slots.acquire()  # between decisions: the ledger is consistent
                if self._queue.get(pending.uid) is not pending:  # withdrawn while waiting
                    self._slots.release()
                    continue
                del self._queue[pending.uid]
                try:
                    self._decide(pending)
                except Exception as error:  # one reservation must not stop the others
                    log.exception("deciding %s/%s failed", pending.namespace, pending.name)
                    self._refuse(pending, error)

    def _decide(self, pending: Pending) -> None:
        """Decide one reservation and start its status write. No await in here."""
        state, now = self._state, datetime.now(UTC)
        decision_id = f"{self.run_id}-{next(self._decisions)}"
        try:
            entry = reservation_entry(pending.obj, now)
        except ValueError as error:
            state.rejected.add(pending.uid)
            self._start_write(
                pending, False, Reason.INVALID_SPEC, str(error), now, decision_id, None
            )
            return
        entry_id = entry.id
        if entry_id in state.tracked:  # a namesake from before a missed DELETED event
            state.release(entry_id)
        decision = state.ledger.reserve(entry, now)
        if decision.admitted:
            owner_pod = entry.owner.pod if entry.owner else None
            state.track(
                entry,
                Tracked(
                    pending.uid,
                    pending.namespace,
                    pending.name,
                    entry.node,
                    owner_pod,
                    entry.last_heartbeat,
                ),
            )
        else:
            state.rejected.add(pending.uid)
        self._start_write(
            pending,
            decision.admitted,
            decision.reason,
            decision.message,
            now,
            decision_id,
            entry.last_heartbeat,
        )

    def _refuse(self, pending: Pending, error: Exception) -> None:
        """A decision that raised: Rejected InvalidSpec with the error, nothing held."""
        now = datetime.now(UTC)
        entry_id, state = f"{pending.namespace}/{pending.name}", self._state
        tracked = state.tracked.get(entry_id)
        if tracked is not None and tracked.uid == pending.uid:
            state.release(entry_id, pending.uid)
        elif tracked is None and state.ledger.get(entry_id) is not None:
            state.ledger.release(entry_id)  # reserved, then failed before it was tracked
        state.rejected.add(pending.uid)
        message = f"the operator could not decide this reservation: {error}"[:1024]
        decision_id = f"{self.run_id}-{next(self._decisions)}"
        self._start_write(pending, False, Reason.INVALID_SPEC, message, now, decision_id, None)

    def _start_write(
        self,
        pending: Pending,
        admitted: bool,
        reason: Reason,
        message: str,
        now: datetime,
        decision_id: str,
        heartbeat: datetime | None,
    ) -> None:
        generation = pending.obj["metadata"].get("generation")
        status = decision_status(
            admitted=admitted,
            reason=reason,
            message=message,
            now=now,
            generation=generation,
            decision_id=decision_id,
            last_heartbeat=heartbeat,
            stamp=self._state.stamper.sign(
                pending.uid, decision_id, str(Phase.ADMITTED if admitted else Phase.REJECTED)
            ),
        )
        task = asyncio.create_task(self._write(pending, admitted, reason, message, status))
        self._writes.add(task)
        task.add_done_callback(self._write_done)

    def _write_done(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        self._slots.release()

    async def _write(
        self, pending: Pending, admitted: bool, reason: Reason, message: str, status: JSON
    ) -> None:
        """Write the decision until the API gives a definite answer.

        A timeout, a dropped connection or a 5xx may or may not have landed, so the
        decision stays in the ledger (never overcommitting) and the *same* decision is
        written again: idempotent, never a second decision. Only a definite refusal
        rolls it back; a deleted object or a namesake (uid test failed) releases it.
        """
        state, entry_id = self._state, f"{pending.namespace}/{pending.name}"
        delay = _RETRY_DELAY
        while True:
            try:
                await write_status(
                    self._client, pending.namespace, pending.name, pending.uid, status
                )
                break
            except ApiError as error:
                if error.not_found or error.status == 422:  # deleted, or a namesake now
                    state.release(entry_id, pending.uid)
                    state.rejected.discard(pending.uid)
                    return
                if error.status != 429 and error.status < 500:
                    self._roll_back(pending, entry_id, error)
                    return
                failure: Exception = error
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                failure = error
            if not (state.holds(entry_id, pending.uid) or pending.uid in state.rejected):
                return  # deleted meanwhile: nothing left to write
            self._metrics.status_write_failures.inc()
            log.warning("status of %s not confirmed (%s); writing it again", entry_id, failure)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY_DELAY)
        self._metrics.admission_latency.observe(time.monotonic() - pending.seen)
        self._metrics.decisions.labels(status["phase"]).inc()
        self._events.record(
            reservation_ref(pending.namespace, pending.name, pending.uid),
            str(reason),
            message,
            "Normal" if admitted else "Warning",
        )

    def _roll_back(self, pending: Pending, entry_id: str, error: Exception) -> None:
        log.warning(
            "status of %s not written (%s); decision rolled back, retrying", entry_id, error
        )
        self._metrics.status_write_failures.inc()
        self._state.release(entry_id, pending.uid)
        self._state.rejected.discard(pending.uid)
        loop = asyncio.get_running_loop()
        loop.call_later(_RETRY_DELAY, self._requeue, pending)

    def _requeue(self, pending: Pending) -> None:
        if pending.uid not in self._queue:
            self._queue[pending.uid] = pending
            self._wake.set()


def _essentials(obj: JSON) -> JSON:
    """What a decision reads from a Reservation; the rest of the body is not kept."""
    metadata = obj["metadata"]
    kept = {
        key: metadata[key]
        for key in ("uid", "namespace", "name", "creationTimestamp", "generation")
        if key in metadata
    }
    beat = (metadata.get("annotations") or {}).get(HEARTBEAT_ANNOTATION)
    if beat is not None:
        kept["annotations"] = {HEARTBEAT_ANNOTATION: beat}
    status = obj.get("status") or {}
    slim: JSON = {"metadata": kept, "spec": obj.get("spec")}
    if "lastHeartbeat" in status:
        slim["status"] = {"lastHeartbeat": status["lastHeartbeat"]}
    return slim
