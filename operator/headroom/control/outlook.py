"""The answer at create: what the leader's ledger would decide for a Reservation now.

The admission webhook asks it for every Reservation create, real or dry-run, before
the object is stored (``headroom.serving.webhook``). It is answered synchronously on
the main loop, from the ledger as it is, with no API call: the asynchronous decision
in ``status`` stays the truth, and the outlook is what that decision would be if
nothing else happened first. What can happen first is said beside it: reservations
seen earlier on the node, not decided yet, are decided before this one.

Strict mode makes the answer binding. With ``headroom.dev/outlook: strict`` on the
Reservation (an annotation) or on its Namespace (a label), a create the ledger would
reject now is refused, with the reason and numbers, and never exists. In a Namespace
so labelled, one it would admit also takes its room at once
(:mod:`headroom.control.provisional`), so two concurrent creates are never both told
"admitted" for the same last room. Holds follow the label alone, which the operator
reads from the Namespace itself: the annotation is in the review, and a review can
be forged by whoever reaches the webhook's port. No hold is taken while reservations
seen earlier on the node, holding nothing, wait for their decision (they go first,
in creation order), nor for a name the ledger still holds (a delete and create again
whose deletion is not seen yet: decided once it is), nor for the name of a Reservation
known to exist in another phase (Rejected, Reclaimed and kept): the API server refuses
that create as AlreadyExists after the review, and a hold for it would only keep room
from others. A dry run holds nothing.

Only a leader with its ledger rebuilt has an outlook to give; any other replica
says it has none (the serving layer forwards the review to the leader first). With
no outlook, strict mode cannot refuse: the create goes on and is decided as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from headroom.api.claims import pod_claim
from headroom.api.constants import OUTLOOK_MODE, STRICT
from headroom.api.outlook import CAVEAT, Outlook, Verdict
from headroom.api.parse import InvalidValueError
from headroom.api.reasons import Reason
from headroom.control.admission import Admission
from headroom.control.placement import Planned, choose_node, pod_probe
from headroom.control.provisional import ProvisionalHolds
from headroom.control.state import State
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON
from headroom.ledger import Entry
from headroom.ledger.outlook import outlook
from headroom.objects.reservations import reservation_entry

NOT_DECIDING = (
    "this replica does not decide now (a standby, or a leader rebuilding its ledger); "
    "the decision is left to the operator: see the reservation's status"
)


@dataclass(frozen=True, slots=True)
class OutlookAnswer:
    """What a create's review is answered: warnings, and under strict mode maybe a refusal."""

    warnings: list[str] = field(default_factory=list)
    refusal: str | None = None  # refused at create, with this message


class ReservationOutlook:
    """Answers "what would happen to this Reservation?" from the ledger."""

    def __init__(
        self,
        state: State,
        admission: Admission,
        clock: Clock,
        *,
        deciding: Callable[[], bool],
        holds: ProvisionalHolds,
        strict: bool = False,
        planned: Callable[[], Iterable[Planned]] = list,
        scheduler: str | None = None,
    ) -> None:
        """``deciding``: whether this replica leads with its ledger rebuilt now.
        ``strict``: strict FIFO on each node's queue (``queueing.strict``). ``planned()``:
        what the gate created for pods and is not decided yet. ``scheduler``: the
        schedulerName opted-in pods get (placement by kube-scheduler), None: gated."""
        self._state, self._admission, self._clock = state, admission, clock
        self._deciding, self._holds, self._strict_fifo = deciding, holds, strict
        self._planned, self._scheduler = planned, scheduler

    def answer(self, obj: JSON, *, dry_run: bool = False) -> OutlookAnswer:
        """The answer to creating ``obj``: its outlook (then any caveat) as warnings; under
        strict mode a refusal, or the room held for it (not for a dry run)."""
        uid = (obj.get("metadata") or {}).get("uid")
        if not dry_run and isinstance(uid, str) and uid in self._holds:
            # The same create reviewed again (the API server retried its call): answered as
            # the first time, from the ledger without the room held for it, then held again.
            self._holds.give_back(uid)
        entry, found = self._foresee(obj)
        metadata = obj.get("metadata") or {}
        labelled = self._namespace_strict(str(metadata.get("namespace") or ""))
        if (labelled or _annotated_strict(metadata)) and found.verdict is Verdict.REJECTED:
            return OutlookAnswer(
                [found.warning()],
                f"{found.reason}: {found.detail} (refused at create: {OUTLOOK_MODE} is {STRICT})",
            )
        said = [found.warning()]
        if found.verdict is Verdict.UNKNOWN or found.node is None:
            return OutlookAnswer(said)
        earlier = self._admission.undecided_on(found.node, unless=self._holds.__contains__)
        if (
            labelled
            and not dry_run
            and not earlier
            and found.verdict is Verdict.ADMITTED
            and entry is not None
            and isinstance(uid, str)
            and self._holds.take(uid, entry, self._clock.now())
        ):
            said.append(f"its room is held for it until it is decided ({OUTLOOK_MODE}: {STRICT})")
        elif earlier:
            said.append(
                f"{CAVEAT}{earlier} reservation(s) on {found.node} seen earlier are not "
                "decided yet and go first"
            )
        return OutlookAnswer(said)

    def pod_answer(self, pod: JSON) -> OutlookAnswer:
        """The warnings for creating an opted-in pod the webhook gates: where its
        reservation would go (the gate's own choice of node) and what the ledger would
        decide there, or why it would wait for a node. Never a refusal: what the gate
        refuses (a claim it cannot read) it refuses itself."""
        if not self._deciding():
            return OutlookAnswer([Outlook(Verdict.UNKNOWN, NOT_DECIDING).warning()])
        if self._scheduler is not None:
            detail = (
                f"kube-scheduler (schedulerName {self._scheduler}) chooses its node among "
                "those where the ledger has room"
            )
            return OutlookAnswer([Outlook(Verdict.UNKNOWN, detail).warning()])
        try:
            claim = pod_claim(pod)
        except InvalidValueError:
            return OutlookAnswer()
        now = self._clock.now()
        placement = choose_node(self._state, self._planned(), pod, claim, now)
        if placement.node is None:
            return OutlookAnswer([Outlook(Verdict.UNKNOWN, placement.why).warning()])
        probe = pod_probe(self._state, pod, claim, now)
        probe.node = placement.node
        found = outlook(self._state.ledger, probe, now, probe.wait_until, strict=self._strict_fifo)
        return OutlookAnswer([found.warning()])

    def _foresee(self, obj: JSON) -> tuple[Entry | None, Outlook]:
        if not self._deciding():
            return None, Outlook(Verdict.UNKNOWN, NOT_DECIDING)
        now = self._clock.now()
        try:
            entry = reservation_entry(obj, now)
        except InvalidValueError as error:
            return None, Outlook(Verdict.REJECTED, str(error), reason=str(Reason.INVALID_SPEC))
        namespace = (obj.get("metadata") or {}).get("namespace") or ""
        pod = entry.owner.pod
        if pod is not None and (namespace, pod) not in self._state.owner_pods:
            return None, Outlook(
                Verdict.UNKNOWN,
                f"spec.owner.pod: pod {pod} is not known to the operator yet; it is decided "
                f"once the pod is read (rejected if it does not exist in {namespace})",
            )
        ledger = self._state.ledger
        if ledger.get(entry.id) is not None:
            return None, Outlook(
                Verdict.UNKNOWN,
                f"a reservation named {entry.id} is still held (deleted, its deletion not "
                "seen yet?); this one is decided once it is gone",
            )
        existing = self._state.named(entry.id)
        if existing is not None:  # Rejected or Reclaimed, kept: the API server refuses the name
            return None, Outlook(
                Verdict.UNKNOWN,
                f"a reservation named {entry.id} exists ({existing.decision.phase}); this "
                "create fails unless it is gone, and is then decided once seen",
            )
        return entry, outlook(ledger, entry, now, entry.wait_until, strict=self._strict_fifo)

    def _namespace_strict(self, namespace: str) -> bool:
        return self._state.ledger.quotas.labels_of(namespace).get(OUTLOOK_MODE) == STRICT


def _annotated_strict(metadata: JSON) -> bool:
    annotations = metadata.get("annotations") or {}
    return isinstance(annotations, dict) and annotations.get(OUTLOOK_MODE) == STRICT
