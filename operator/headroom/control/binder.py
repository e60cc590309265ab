"""kube-scheduler's bind, done by the leader: admit the pod's claim on the chosen node,
write the decision, then post the Binding.

The second kube-scheduler (profile ``headroom``) has chosen a node among those the
ledger said had room (:mod:`headroom.control.extender`); its bind verb calls here
instead of its DefaultBinder. Nothing is bound before its admission is written: the
Binding follows the written decision, so a crash at any step leaves either no pod
bound, or a bound pod whose reservation is Admitted on its node
(``docs/development/design-scheduler-extender.md``, "Bind").

Steps, for one pod at a time (a lock per pod: two scheduler replicas, or a retry
while an earlier call still runs, never bind one pod twice):

1. The pod as it is now (one GET, the only one as a rule): its uid must be the call's
   (else it was replaced).
   Already bound: success if to this node and its reservation is held there (an
   earlier call whose answer was lost), else an error.
2. Its reservation, named as the pod and owned by it (the gate path's shape, made by
   :class:`headroom.control.gates.Gates`): one for another node, another claim or
   another incarnation, or finally refused, is deleted (uid precondition) and the
   ledger's release awaited; then one is made for this node with no ``spec.wait``,
   so the ledger decides it at once: Admitted, or Rejected with its reason, which is
   the scheduler's error (it backs off; the next filter sees the ledger as it is).
3. The decision written (the reservation's status says it): only then is the pod
   bound, with a Binding that carries the pod's ``uid`` and ``resourceVersion`` as
   preconditions, so a pod edited since it was read (its claim resized, or the owner
   label added by the bind itself) is not bound
   on the old claim's admission: it is read again and, if its claim is unchanged,
   bound once more; otherwise the scheduler's next cycle decides again.

A quota's lifetime ends the pod by then: ``spec.activeDeadlineSeconds`` is set before
the Binding, as the gate path's ungate patch does (the kubelet counts from the start).
The patch answers with the pod as it is now, whose version the Binding then carries: a
pod whose claim changed since it was read is read again and judged, never bound on the
old claim's admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from headroom.api.claims import PodClaim, is_claim_pod, pod_claim
from headroom.api.constants import DEVICES_ANNOTATION, RESERVATION_ANNOTATION
from headroom.api.parse import InvalidValueError
from headroom.api.paths import pod_path
from headroom.control.podactions import Known
from headroom.control.podcalls import DeposedError, WithdrawnError, runs_long_enough
from headroom.control.state import PodKey, Record
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError
from headroom.objects.podreservations import differences, for_another_claim
from headroom.objects.pods import active_deadline, bound_node, is_finished, is_gated

log = logging.getLogger(__name__)

#: How long one bind may take, under the scheduler's ``httpTimeout`` (5 s by default):
#: past it the answer is an error and the scheduler tries the pod again.
BIND_DEADLINE = 4.0
_BINDING_ATTEMPTS = 3  # a pod written between the read and the Binding: read again
_RECHECK = 0.25  # seconds between looks at the ledger if no change was signalled


@dataclass(frozen=True, slots=True)
class BindCall:
    """kube-scheduler's ExtenderBindingArgs."""

    namespace: str
    name: str
    uid: str
    node: str


class BindError(Exception):
    """Why the pod was not bound; the scheduler's error, and it tries again."""


class BindGates(Protocol):
    """What the binder needs of :class:`headroom.control.gates.Gates`, which makes and
    follows pods' reservations for both placements."""

    def bind_lock(self, key: PodKey) -> AbstractAsyncContextManager[None]: ...
    def reservation_of(self, key: PodKey) -> Known | None: ...
    def record_of(self, key: PodKey, pod_uid: str) -> Record | None: ...
    def holds(self, uid: str) -> bool: ...
    async def changed(self, key: PodKey) -> None: ...
    async def released(self, uid: str) -> None: ...
    async def fresh(self, key: PodKey) -> JSON | None: ...
    async def make_for_bind(self, key: PodKey, pod: JSON, claim: PodClaim, node: str) -> bool: ...
    async def delete_reservation(self, key: PodKey, uid: str) -> None: ...
    async def patch_pod(self, key: PodKey, operations: list[JSON]) -> JSON: ...
    async def post(
        self, path: str, body: JSON, *, only_while: Callable[[], bool] = ...
    ) -> JSON: ...


class Binder:
    """Binds pods for kube-scheduler, on reservations made and followed by ``gates``."""

    def __init__(self, gates: BindGates, clock: Clock, *, deadline: float = BIND_DEADLINE):
        self._gates, self._clock, self._deadline = gates, clock, deadline

    async def bind(self, call: BindCall) -> str:
        """Admit and bind; the empty string on success, else the error for the scheduler."""
        key = (call.namespace, call.name)
        try:
            async with asyncio.timeout(self._deadline), self._gates.bind_lock(key):
                await self._bind(key, call)
            return ""
        except BindError as error:
            return str(error)
        except TimeoutError:
            return f"pod {call.namespace}/{call.name}: not admitted in {self._deadline:.0f}s"
        except DeposedError:
            return "this replica no longer leads; the next leader decides"
        except (ApiError, ApiUnavailableError) as error:
            return f"pod {call.namespace}/{call.name}: {error}"

    async def _bind(self, key: PodKey, call: BindCall) -> None:
        pod = await self._pod(key, call.uid)
        claim = _claim_of(pod)
        bound = bound_node(pod)
        if bound is not None:
            record = self._gates.record_of(key, call.uid)
            if bound == call.node and (claim is None or (record is not None and record.held)):
                return  # an earlier call bound it; its answer was lost
            raise BindError(f"pod {key[0]}/{key[1]} is bound to node {bound} already")
        if claim is None:  # claims nothing (now): bound as the DefaultBinder would
            known = self._gates.reservation_of(key)
            if known is not None and known.pod_uid == call.uid:  # booked while it claimed
                await self._gates.delete_reservation(key, known.uid)
            await self._binding(key, pod, call.node, {})
            return
        record = await self._admitted(key, pod, claim, call)
        for attempt in range(_BINDING_ATTEMPTS):
            # The Binding carries the resourceVersion of a read whose claim is the one
            # admitted: first the read above (nothing writes the pod meanwhile, as a rule:
            # a read fewer per pod); a conflict (written since) reads it and tries again.
            if attempt:
                pod = await self._pod(key, call.uid)
                if bound_node(pod) == call.node:
                    return
                if bound_node(pod) is not None or _claim_of(pod) != claim:
                    raise BindError(f"pod {key[0]}/{key[1]} changed while it was bound; again")
            pod = await self._with_deadline(key, pod, record)
            if bound_node(pod) is not None or _claim_of(pod) != claim:
                # The deadline patch answers with the pod as it is now: written since the
                # read (its claim resized while it was decided), its new version must not
                # carry the Binding on the old claim's admission. Read it and judge again.
                if attempt == _BINDING_ATTEMPTS - 1:
                    raise BindError(f"pod {key[0]}/{key[1]} changed while it was bound; again")
                continue
            try:
                await self._binding(
                    key, pod, call.node, _told(record),
                    only_while=lambda: self._still_admitted(key, call.uid, record),
                )  # fmt: skip
                return
            except WithdrawnError:
                raise BindError(
                    f"the reservation of pod {key[0]}/{key[1]} changed or runs out; again"
                ) from None
            except ApiError as error:
                if not error.conflict or attempt == _BINDING_ATTEMPTS - 1:
                    raise

    def _still_admitted(self, key: PodKey, uid: str, record: Record) -> bool:
        """Whether ``record`` is still the pod's reservation's decision, Admitted, with
        time to run (read right before each attempt at the Binding: nothing that awaited
        since, a failed attempt's retry included, may have replaced or reclaimed it)."""
        known = self._gates.reservation_of(key)
        return (
            known is not None
            and known.uid == record.uid
            and self._gates.record_of(key, uid) is record
            and record.held
            and runs_long_enough(record, self._clock.now())
        )

    async def _pod(self, key: PodKey, uid: str) -> JSON:
        pod = await self._gates.fresh(key)
        if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
            raise BindError(f"pod {key[0]}/{key[1]} with uid {uid} no longer exists")
        if is_finished(pod) or (pod.get("metadata") or {}).get("deletionTimestamp"):
            raise BindError(f"pod {key[0]}/{key[1]} is ending")
        if is_gated(pod):
            raise BindError(f"pod {key[0]}/{key[1]} has scheduling gates")
        return pod

    async def _admitted(self, key: PodKey, pod: JSON, claim: PodClaim, call: BindCall) -> Record:
        """The pod's reservation Admitted on ``call.node`` for ``claim``, decision written."""
        made = False
        while True:
            known = self._gates.reservation_of(key)
            record = self._gates.record_of(key, call.uid)
            if known is None:
                if made:  # created, and gone since (deleted by someone): not again
                    raise BindError(f"the reservation of pod {key[0]}/{key[1]} was deleted")
                if not await self._gates.make_for_bind(key, pod, claim, call.node):
                    raise BindError(f"a Reservation named {key[1]} that no pod owns exists")
                made = True
                continue
            differ = differences(known.book, key[1], claim)
            if known.pod_uid == call.uid and differ and not for_another_claim(known.book, key[1]):
                raise BindError(  # a tenant's own object of that name: not ours to delete
                    f"the Reservation {key[1]}, owned by this pod, is not the one Headroom "
                    f"makes for its claim ({'; '.join(differ)})"
                )
            confirmed_refusal = record is not None and record.confirmed and not record.held
            if made and confirmed_refusal and record is not None:
                raise BindError(f"{record.decision.reason}: {record.decision.message}")
            if (
                known.pod_uid != call.uid
                or differ
                or known.book.node != call.node
                or confirmed_refusal
            ):
                await self._gates.delete_reservation(key, known.uid)
                while self._gates.holds(known.uid):  # then nothing is counted twice
                    await _until(self._gates.released(known.uid))
                continue
            if record is not None and record.confirmed and record.held:
                return record
            await _until(self._gates.changed(key))

    async def _with_deadline(self, key: PodKey, pod: JSON, record: Record) -> JSON:
        """The pod, given ``activeDeadlineSeconds`` if its reservation has a lifetime."""
        expiry = record.decision.expires_at
        if expiry is None:
            return pod
        seconds = active_deadline(pod, expiry - self._clock.now())
        if seconds is None:
            return pod
        meta = pod.get("metadata") or {}
        return await self._gates.patch_pod(
            key,
            [
                {"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
                {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": seconds},
            ],
        )

    async def _binding(
        self,
        key: PodKey,
        pod: JSON,
        node: str,
        told: dict[str, str],
        *,
        only_while: Callable[[], bool] = lambda: True,
    ) -> None:
        meta = pod.get("metadata") or {}
        binding_meta: JSON = {
            "name": key[1],
            "namespace": key[0],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        }
        if told:
            binding_meta["annotations"] = told
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": binding_meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._gates.post(pod_path(*key) + "/binding", body, only_while=only_while)
        log.info("pod %s/%s bound to %s", *key, node)


async def _until(signal: Coroutine[Any, Any, None]) -> None:
    """Wait for ``signal``, or ``_RECHECK`` seconds: a missed signal costs a look, no more."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_RECHECK):
            await signal


def _claim_of(pod: JSON) -> PodClaim | None:
    """The pod's claim; None if it claims nothing; a bad one is the scheduler's error."""
    if not is_claim_pod(pod):
        return None
    try:
        return pod_claim(pod)
    except InvalidValueError as error:
        raise BindError(f"BadClaim: {error}") from None


def _told(record: Record) -> dict[str, str]:
    """The annotations the Binding writes into the pod with its node."""
    told = {RESERVATION_ANNOTATION: record.name}
    if record.decision.devices:
        told[DEVICES_ANNOTATION] = ",".join(sorted(record.decision.devices))
    return told
