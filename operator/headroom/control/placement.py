"""Where a gated pod's reservation goes: a node the pod may run on, best first.

Best first is the one node order of ``headroom.ledger.nodeorder``, which ``kubectl
headroom fit`` ranks by too: most allocatable RAM, then most free VRAM (unknown VRAM
after known), then name, so claims spread over the nodes and the next claim is the
likeliest to fit too. The first node that fits now wins; when none does, the pod
waits in the queue of the best node that could hold its claim once other claims
leave (its RAM and VRAM limits, and its devices after what is held on them outside
Headroom), or of the best node it may run on when none could.

The figures are the ledger's, less what was created for other pods and is not
decided yet (``planned``): reservations are created one at a time, but decided a
moment later, and two pods placed in that moment must not both count on the same
room. A claim with VRAM fits only where the ledger would find it devices now, after
what is held on them outside Headroom, not merely where the node's VRAM sum has room.

Nor is a node chosen that the pod's quotas refuse for good (``NodeNotAllowed``
outside a quota's nodeSelector; ``WaitTooLong`` for a wait over its maxWait): the
ledger says which (:meth:`Quotas.final_refusal`), so the rules live in one place.
A reservation made there would only be refused, deleted and made again; instead
the pod is told why in one sentence, and nothing is created until a node, a quota
or the pod changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from headroom.api.claims import PodClaim
from headroom.api.constants import MAX_NODE_SUM_MB
from headroom.api.reasons import EventReason, Reason
from headroom.control.state import State
from headroom.kube.transport import JSON
from headroom.ledger import nodeorder
from headroom.ledger.entry import Entry, Owner
from headroom.objects.nodeconstraints import may_run_on
from headroom.objects.pods import pod_wait

#: What was created for a pod and is not decided yet: (node, RAM MiB, VRAM MiB).
Planned = tuple[str, int, int]
_NO_MATCH = "no known node matches the pod's node selector, affinity and tolerations"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod's reservation goes, or (``node`` None) why nowhere: ``reason`` and one
    sentence ``why`` for the pod's condition and Event."""

    node: str | None
    reason: Reason | EventReason | None = None
    why: str = ""


def choose_node(
    state: State, planned: Iterable[Planned], pod: JSON, claim: PodClaim, now: datetime
) -> Placement:
    """The node for ``pod``'s reservation; none when it may run on no node we know, or
    its quotas refuse every one it may run on for good."""
    # Final refusal reason -> (node, its words), of the first node by name: the same
    # words on every look while the nodes stay, so the pod is told once.
    refused: dict[Reason, tuple[str, str]] = {}
    tried = 0
    quotas = state.ledger.quotas
    probe = pod_probe(state, pod, claim, now)

    def allowed(node: str) -> bool:
        nonlocal tried
        tried += 1
        probe.node = node
        refusal = quotas.final_refusal(probe)
        if refusal is not None and (refusal[0] not in refused or node < refused[refusal[0]][0]):
            refused[refusal[0]] = (node, refusal[1])
        return refusal is None

    if claim.node is not None:  # the pod names its node: that one, if it may run there
        facts = state.node_facts.get(claim.node)
        if facts is None:  # not seen yet: its reservation waits for it (NodeUnknown)
            return Placement(claim.node)
        if not may_run_on(pod, facts):
            return Placement(
                None, EventReason.NO_NODE, f"{_NO_MATCH} (annotation node {claim.node})"
            )
        if allowed(claim.node):
            return Placement(claim.node)
        return _nowhere(refused, tried)
    pending: dict[str, tuple[int, int, int]] = {}
    for node, ram, vram in planned:
        had = pending.get(node, (0, 0, 0))
        pending[node] = (had[0] + ram, had[1] + vram, had[2] + 1)
    rooms: list[_Room] = []
    for name, facts in state.node_facts.items():
        if not state.ledger.knows(name) or not may_run_on(pod, facts) or not allowed(name):
            continue
        summary = state.ledger.node_summary(name, now)
        ram, vram, entries = pending.get(name, (0, 0, 0))
        free_ram = summary.allocatable_ram_mb - ram
        if summary.limit_ram_mb is None:  # RAM not limited on this node
            free_ram = MAX_NODE_SUM_MB
        capacity = summary.vram_capacity_mb
        free_vram = capacity - summary.reserved_vram_mb - vram if capacity is not None else None
        fits = (
            claim.ram_mb <= free_ram
            and (free_vram is None or claim.vram_mb <= free_vram)
            and summary.active_entries + entries < summary.max_entries
        )
        rooms.append(_Room(name, free_ram, free_vram, fits))

    def fits_now(room: _Room) -> bool:
        return room.fits and (not claim.vram_mb or _fits_devices(state, probe, room.node))

    def fits_later(room: _Room) -> bool:
        probe.node = room.node
        return state.ledger.could_hold(probe)

    best = next(nodeorder.to_try(rooms, fits_now, fits_later), None)
    if best is not None:
        return Placement(best.node)
    if rooms:  # it could be held nowhere: it waits on the best node, which says why
        return Placement(nodeorder.best_first(rooms)[0].node)
    return _nowhere(refused, tried)


@dataclass(frozen=True, slots=True)
class _Room:
    """A node's room in the ledger, less what was created for other pods and is not
    decided yet; ``fits``: the claim fits its entry cap, RAM and VRAM sum (its devices
    are asked only in the order, until one node fits)."""

    node: str
    allocatable_ram_mb: int
    free_vram_mb: int | None
    fits: bool


def pod_probe(state: State, pod: JSON, claim: PodClaim, now: datetime) -> Entry:
    """The pod's reservation as the ledger and its quotas would judge it, created now;
    its ``node`` is set to each node in turn."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    wait = pod_wait(claim, state.ledger.quotas.max_wait(namespace))
    return Entry(
        id=f"{namespace}/{meta.get('name', '')}",
        node="",
        ram_mb=claim.ram_mb,
        vram_mb=claim.vram_mb,
        created_at=now,
        last_heartbeat=now,
        owner=Owner(pod=str(meta.get("name", "")), surface="pod"),
        wait_until=now + wait if wait is not None else None,
        pod_lifetime=True,
        gpus=1 if claim.gpus is None else claim.gpus,
    )


def _fits_devices(state: State, probe: Entry, node: str) -> bool:
    """Whether the claim's VRAM fits on the node's devices now, as the ledger would place
    it: per device, after what is held outside Headroom (what was created for other pods
    and is not decided yet is counted on the node's sum only: its devices are not chosen
    until it is decided)."""
    probe.node = node
    refusal = state.ledger.room_refusal(probe)
    return refusal is None or refusal[0] is not Reason.INSUFFICIENT_VRAM


def _nowhere(refused: dict[Reason, tuple[str, str]], tried: int) -> Placement:
    """Why no node: a wait refused is refused on every node, so it is said first."""
    if Reason.WAIT_TOO_LONG in refused:
        message = refused[Reason.WAIT_TOO_LONG][1]
        return Placement(
            None, Reason.WAIT_TOO_LONG, f"annotation headroom.dev/wait: {message}; it stays gated"
        )
    if refused:
        reason, (_, message) = min(refused.items())
        nodes = (
            "its quota does not allow the node it may run on"
            if tried == 1
            else f"its quota allows none of the {tried} nodes it may run on"
        )
        return Placement(None, reason, f"{nodes}: {message}; it stays gated")
    return Placement(None, EventReason.NO_NODE, f"{_NO_MATCH}; it stays gated")
