"""The answer at create: what the leader's ledger would decide for a Reservation now.

The admission webhook asks it for every Reservation create, real or dry-run, before
the object is stored (``headroom.serving.webhook``). It is answered synchronously on
the main loop, from the ledger as it is, with no API call: the asynchronous decision
in ``status`` stays the truth, and the outlook is what that decision would be if
nothing else happened first. What can happen first is said beside it: reservations
seen earlier on the node, not decided yet, are decided before this one.

Strict mode (``headroom.dev/outlook: strict``, an annotation on the Reservation or a
label on its Namespace) makes the answer binding: a create the ledger would reject
now is refused, with the reason and numbers, and never exists; one it would admit
takes its room at once (:mod:`headroom.control.provisional`), so two concurrent
creates are never both told "admitted" for the same last room. A dry run is
answered the same way and holds nothing.

Only a leader with its ledger rebuilt has an outlook to give; any other replica
says it has none (the serving layer forwards the review to the leader first). With
no outlook, strict mode cannot refuse: the create goes on and is decided as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from headroom.api.constants import OUTLOOK_MODE, STRICT
from headroom.api.outlook import CAVEAT, Outlook, Verdict
from headroom.api.parse import InvalidValueError
from headroom.api.reasons import Reason
from headroom.control.admission import Admission
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
    ) -> None:
        """``deciding``: whether this replica leads with its ledger rebuilt now.
        ``strict``: strict FIFO on each node's queue (``queueing.strict``)."""
        self._state, self._admission, self._clock = state, admission, clock
        self._deciding, self._holds, self._strict_fifo = deciding, holds, strict

    def answer(self, obj: JSON, *, dry_run: bool = False) -> OutlookAnswer:
        """The answer to creating ``obj``: its outlook (then any caveat) as warnings; under
        strict mode a refusal, or the room held for it (not for a dry run)."""
        uid = (obj.get("metadata") or {}).get("uid")
        if not dry_run and isinstance(uid, str) and uid in self._holds:
            # The same create reviewed again (the API server retried its call): answered as
            # the first time, from the ledger without the room held for it, then held again.
            self._holds.give_back(uid)
        entry, found = self._foresee(obj)
        strict = self._strict_mode(obj)
        if strict and found.verdict is Verdict.REJECTED:
            return OutlookAnswer(
                [found.warning()],
                f"{found.reason}: {found.detail} (refused at create: {OUTLOOK_MODE} is {STRICT})",
            )
        held = (
            strict
            and not dry_run
            and found.verdict is Verdict.ADMITTED
            and entry is not None
            and isinstance(uid, str)
            and self._holds.take(uid, entry, self._clock.now())
        )
        said = [found.warning()]
        if held:
            said.append(f"its room is held for it until it is decided ({OUTLOOK_MODE}: {STRICT})")
        elif found.verdict is not Verdict.UNKNOWN and found.node is not None:
            earlier = self._admission.undecided_on(found.node)
            if earlier:
                said.append(
                    f"{CAVEAT}{earlier} reservation(s) on {found.node} seen earlier are not "
                    "decided yet and go first"
                )
        return OutlookAnswer(said)

    def warnings(self, obj: JSON) -> list[str]:
        """The warnings alone (no strict mode, no hold): what a dry run would be told."""
        return self.answer(obj, dry_run=True).warnings

    def outlook(self, obj: JSON) -> Outlook:
        """What deciding ``obj`` now would give (no hold, no wait, no counter)."""
        return self._foresee(obj)[1]

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
        return entry, outlook(ledger, entry, now, entry.wait_until, strict=self._strict_fifo)

    def _strict_mode(self, obj: JSON) -> bool:
        metadata = obj.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        if isinstance(annotations, dict) and annotations.get(OUTLOOK_MODE) == STRICT:
            return True
        namespace = metadata.get("namespace") or ""
        return self._state.ledger.quotas.labels_of(namespace).get(OUTLOOK_MODE) == STRICT
