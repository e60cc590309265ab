"""The answer at create: what the leader's ledger would decide for a Reservation now.

The admission webhook asks it for every Reservation create, real or dry-run, before
the object is stored (``headroom.serving.webhook``). It is answered synchronously on
the main loop, from the ledger as it is, with no API call and no change: the
asynchronous decision in ``status`` stays the truth, and the outlook is only what
that decision would be if nothing else happened first. What can happen first is
said beside it: reservations seen earlier on the node, not decided yet, are
decided before this one.

Only a leader with its ledger rebuilt has an outlook to give; any other replica
says it has none (the serving layer may forward the review to the leader first).
"""

from __future__ import annotations

from collections.abc import Callable

from headroom.api.outlook import CAVEAT, Outlook, Verdict
from headroom.api.parse import InvalidValueError
from headroom.api.reasons import Reason
from headroom.control.admission import Admission
from headroom.control.state import State
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON
from headroom.ledger.outlook import outlook
from headroom.objects.reservations import reservation_entry

NOT_DECIDING = (
    "this replica does not decide now (a standby, or a leader rebuilding its ledger); "
    "the decision is left to the operator: see the reservation's status"
)


class ReservationOutlook:
    """Answers "what would happen to this Reservation?" from the ledger, changing nothing."""

    def __init__(
        self,
        state: State,
        admission: Admission,
        clock: Clock,
        *,
        deciding: Callable[[], bool],
        strict: bool = False,
    ) -> None:
        """``deciding``: whether this replica leads with its ledger rebuilt now."""
        self._state, self._admission, self._clock = state, admission, clock
        self._deciding, self._strict = deciding, strict

    def warnings(self, obj: JSON) -> list[str]:
        """The admission warnings for creating ``obj``: its outlook, then any caveat."""
        found = self.outlook(obj)
        said = [found.warning()]
        if found.verdict is not Verdict.UNKNOWN and found.node is not None:
            earlier = self._admission.undecided_on(found.node)
            if earlier:
                said.append(
                    f"{CAVEAT}{earlier} reservation(s) on {found.node} seen earlier are not "
                    "decided yet and go first"
                )
        return said

    def outlook(self, obj: JSON) -> Outlook:
        """What deciding ``obj`` now would give (no hold, no wait, no counter)."""
        if not self._deciding():
            return Outlook(Verdict.UNKNOWN, NOT_DECIDING)
        now = self._clock.now()
        try:
            entry = reservation_entry(obj, now)
        except InvalidValueError as error:
            return Outlook(Verdict.REJECTED, str(error), reason=str(Reason.INVALID_SPEC))
        namespace = (obj.get("metadata") or {}).get("namespace") or ""
        pod = entry.owner.pod
        if pod is not None and (namespace, pod) not in self._state.owner_pods:
            return Outlook(
                Verdict.UNKNOWN,
                f"spec.owner.pod: pod {pod} is not known to the operator yet; it is decided "
                f"once the pod is read (rejected if it does not exist in {namespace})",
            )
        return outlook(self._state.ledger, entry, now, entry.wait_until, strict=self._strict)
