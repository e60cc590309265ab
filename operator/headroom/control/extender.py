"""What the ledger tells kube-scheduler about one pod: filter and prioritize.

A second, stock kube-scheduler (profile ``headroom``) asks the Headroom leader, as
its extender, which of the nodes it found feasible have room in the ledger for the
pod's claim, and how the node policy ranks them
(``docs/development/design-scheduler-extender.md``). Both are reads of the
leader's ledger: nothing is held here, the claim is admitted at bind.

A node without room is *unresolvable*: preemption of other pods never makes ledger
room (their reservations are not theirs to give), so the scheduler is told not to try.
The reason is short and has no numbers (``headroom: InsufficientRAM``), so that the
scheduler's message adds up the nodes per reason; the numbers are the pod's own
condition's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from headroom.api.claims import PodClaim, is_claim_pod, pod_claim
from headroom.api.parse import InvalidValueError
from headroom.api.reasons import Phase, Reason
from headroom.control.placement import pod_probe
from headroom.control.state import Record, State
from headroom.kube.transport import JSON
from headroom.ledger.decisions import QUOTA_REASONS, WAITABLE

#: kube-scheduler's MaxExtenderPriority (k8s.io/kube-scheduler extender/v1).
MAX_SCORE = 10


@dataclass(frozen=True, slots=True)
class Filtered:
    """The nodes with room, and per node without room the reason (unresolvable)."""

    nodes: list[str]
    refused: dict[str, str] = field(default_factory=dict)
    #: Those refused for want of room (node, quota, or waiters ahead): a wait may end it.
    waitable: list[str] = field(default_factory=list)
    #: Its own wait ran out in a queue: it waits for nothing any more.
    gave_up: bool = False

    def reasons(self) -> Counter[str]:
        return Counter(self.refused.values())

    @property
    def for_quota(self) -> bool:
        """Whether a quota refused the pod somewhere: room its quota gets back may come on
        any node (a release elsewhere), not only on those refused for their own room."""
        quota = {f"headroom: {reason}" for reason in QUOTA_REASONS}
        return any(reason in quota for reason in self.refused.values())


def filter_nodes(
    state: State,
    pod: JSON,
    names: list[str],
    now: datetime,
    *,
    own: Record | None = None,
    strict: bool = False,
) -> Filtered:
    """Which of ``names`` have room for ``pod``'s claim now, as the ledger would decide it
    (room, devices, entry cap, the pod's quotas: their node selectors, lifetimes, waits
    and room; and under ``strict`` FIFO, the reservations waiting ahead on the node, as
    the decider's). ``own``: the pod's reservation, if it has one already: admitted (from
    its queue, or at a bind that failed since), its node is the only one that passes, if
    the scheduler still finds it feasible; waiting in a node's queue, that node is its
    queue's to give (``Queued``), the others are judged on their room. A pod that claims
    nothing is the scheduler's alone: every node passes."""
    if not is_claim_pod(pod):
        return Filtered(list(names))
    try:
        claim = pod_claim(pod)
    except InvalidValueError:
        return Filtered([], {name: "headroom: BadClaim" for name in names})
    if own is not None and _own_wait_ran_out(own, claim):
        return Filtered([], {name: "headroom: WaitTimeout" for name in names}, gave_up=True)
    held = own.node if own is not None and own.held else None
    if held is not None and held in names:  # its turn came there: bound there, not moved
        others = {name: "headroom: AdmittedOnAnotherNode" for name in names if name != held}
        return Filtered([held], others)
    queued = own.node if own is not None and own.decision.phase == Phase.QUEUED else None
    probe = pod_probe(state, pod, claim, now)
    if held is not None:
        # Its own entry is in the ledger under its id: probed under that id, every other
        # node would say DuplicateID. (Moved there, the bind releases the one it holds.)
        probe.id = f"{probe.id} (elsewhere)"
    asked = [name for name in names if claim.node in (None, name) and name != queued]
    refusals = state.ledger.refusals(probe, asked, now, strict=strict)
    fits: list[str] = []
    refused: dict[str, str] = {}
    waitable: list[str] = []
    for name in names:
        if claim.node is not None and name != claim.node:
            refused[name] = "headroom: NotTheNamedNode"  # its headroom.dev/node annotation
            continue
        if name == queued:
            refused[name] = "headroom: Queued"  # admitted there in its turn, then nudged
            continue
        refusal = refusals[name]
        if refusal is None:
            fits.append(name)
        else:
            refused[name] = f"headroom: {refusal[0]}"
            if refusal[0] in WAITABLE and refusal[0] is not Reason.NODE_UNKNOWN:
                waitable.append(name)
    return Filtered(fits, refused, waitable)


def _own_wait_ran_out(own: Record, claim: PodClaim) -> bool:
    """Its reservation waited in the ledger's queue as long as the pod asked
    (``headroom.dev/wait``): it gives up, as a gated pod stays gated."""
    decision = own.decision
    return (
        own.confirmed
        and not own.held
        and decision.reason == Reason.WAIT_TIMEOUT
        and claim.wait is not None
    )


def queue_node(state: State, pod: JSON, found: Filtered, now: datetime) -> str | None:
    """Where the pod waits in the ledger's queue when no node has room for it now: of the
    nodes refused for want of room that could hold it once their claims went, the one
    with the most room now (None: none; every refusal is final, or it is too big)."""
    try:
        probe = pod_probe(state, pod, pod_claim(pod), now)
    except InvalidValueError:
        return None
    candidates = []
    for name in sorted(found.waitable):
        probe.node = name
        if state.ledger.could_hold(probe):
            candidates.append(name)
    if not candidates:
        return None
    scores = prioritize(state, pod, candidates, now)
    return max(candidates, key=lambda name: scores.get(name, 0))


def prioritize(
    state: State, pod: JSON, names: list[str], now: datetime, *, binpack: bool = False
) -> dict[str, int]:
    """A score from 0 to ``MAX_SCORE`` per node: by the RAM left after the claim, most
    first (spread, today's gate placement order) or least first (binpack). Only breaks
    ties among the nodes the scheduler finds equal: it never makes a node feasible."""
    try:
        ram = pod_claim(pod).ram_mb
    except InvalidValueError:
        return {name: 0 for name in names}
    left: dict[str, int] = {}
    for name in names:
        if state.ledger.knows(name):
            left[name] = state.ledger.allocatable_ram(name) - ram  # node_summary's figure
    if not left:
        return {name: 0 for name in names}
    low, high = min(left.values()), max(left.values())
    scores = {}
    for name in names:
        if name not in left or high == low:
            scores[name] = 0 if name not in left else MAX_SCORE
            continue
        share = (left[name] - low) * MAX_SCORE // (high - low)
        scores[name] = MAX_SCORE - share if binpack else share
    return scores
