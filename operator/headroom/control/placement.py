"""Where a gated pod's reservation goes: a node the pod may run on, best first.

Best first is ``kubectl headroom fit``'s order — most allocatable RAM, then most free
VRAM (unknown VRAM after known), then name — so claims spread over the nodes and the
next claim is the likeliest to fit too. The first node that fits now wins; when none
does, the best one the pod may run on is where it waits, in that node's queue.

The figures are the ledger's, less what was created for other pods and is not
decided yet (``planned``): reservations are created one at a time, but decided a
moment later, and two pods placed in that moment must not both count on the same
room.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from headroom.api.claims import PodClaim
from headroom.api.constants import MAX_NODE_SUM_MB
from headroom.control.state import State
from headroom.kube.transport import JSON
from headroom.objects.pods import may_run_on

#: What was created for a pod and is not decided yet: (node, RAM MiB, VRAM MiB).
Planned = tuple[str, int, int]


def choose_node(
    state: State, planned: Iterable[Planned], pod: JSON, claim: PodClaim, now: datetime
) -> str | None:
    """The node for ``pod``'s reservation; None when it may run on no node we know."""
    if claim.node is not None:  # the pod names its node: that one, if it may run there
        facts = state.node_facts.get(claim.node)
        return claim.node if facts is None or may_run_on(pod, facts) else None
    pending: dict[str, tuple[int, int, int]] = {}
    for node, ram, vram in planned:
        had = pending.get(node, (0, 0, 0))
        pending[node] = (had[0] + ram, had[1] + vram, had[2] + 1)
    ranked: list[tuple[tuple[int, bool, int, str], bool]] = []
    for name, facts in state.node_facts.items():
        if not state.ledger.knows(name) or not may_run_on(pod, facts):
            continue
        summary = state.ledger.node_summary(name, now)
        ram, vram, entries = pending.get(name, (0, 0, 0))
        free_ram = summary.allocatable_ram_mb - ram
        if summary.limit_ram_mb is None:  # RAM not limited on this node
            free_ram = MAX_NODE_SUM_MB
        capacity = summary.vram_capacity_mb
        free_vram = capacity - summary.reserved_vram_mb - vram if capacity is not None else 0
        fits = (
            claim.ram_mb <= free_ram
            and (capacity is None or claim.vram_mb <= free_vram)
            and summary.active_entries + entries < summary.max_entries
        )
        ranked.append(((-free_ram, capacity is None, -free_vram, name), fits))
    ranked.sort()
    for order, fits in ranked:
        if fits:
            return order[3]
    return ranked[0][0][3] if ranked else None
