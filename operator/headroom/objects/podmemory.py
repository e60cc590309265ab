"""A pod's memory as Kubernetes sees it: what kube-scheduler books, and the most it can use.

Pure. Both figures follow the kubelet's and the scheduler's sum: the larger of the
containers' sum (restartable init containers, i.e. sidecars, included) and the
largest init container, plus the pod's overhead; in MiB rounded up.

The limit is what makes a running pod's claim believable. A claim recorded past a
node's limit (the pod runs there already, ``headroom.ledger.Ledger.record``) must
never say more than the pod can use, or a tenant could label a small running pod
with a huge claim and fill the node for everyone else: so a running pod's claim is
capped at its memory limit where every container sets one, and otherwise at the
node's total RAM; its VRAM at the node's VRAM where that is known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from headroom.api.claims import PodClaim
from headroom.api.parse import InvalidValueError, memory_mib

JSON = dict[str, Any]


def memory_request_mb(pod: JSON) -> int:
    """The pod's effective memory request, as kube-scheduler books it, in MiB rounded up
    (a container without a request asks 0)."""
    total = _effective(pod, lambda container: _memory(container, "requests") or 0)
    assert total is not None, "every container's request is a number"
    return total


def memory_limit_mb(pod: JSON) -> int | None:
    """The most memory the pod's containers can use together, in MiB rounded up; None
    when a container sets no memory limit (then nothing bounds it)."""
    return _effective(pod, lambda container: _memory(container, "limits"))


def capped_claim(
    claim: PodClaim, memory_limit: int | None, node_ram_mb: int | None, node_vram_mb: int | None
) -> PodClaim:
    """A running pod's claim, no more than it can use: RAM at its memory limit where set,
    else at the node's total RAM; VRAM at the node's VRAM where known."""
    ram_cap = memory_limit if memory_limit is not None else node_ram_mb
    ram = claim.ram_mb if ram_cap is None else min(claim.ram_mb, ram_cap)
    vram = claim.vram_mb if node_vram_mb is None else min(claim.vram_mb, node_vram_mb)
    if (ram, vram) == (claim.ram_mb, claim.vram_mb):
        return claim
    return replace(claim, ram_mb=ram, vram_mb=vram)


def _effective(pod: JSON, of: Callable[[Any], int | None]) -> int | None:
    spec = pod.get("spec") or {}
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    inits = [c for c in spec.get("initContainers") or [] if isinstance(c, dict)]
    sidecars = [c for c in inits if c.get("restartPolicy") == "Always"]
    others = [c for c in inits if c.get("restartPolicy") != "Always"]
    values = [of(c) for c in containers + sidecars]
    init_values = [of(c) for c in others]
    if any(v is None for v in values + init_values):
        return None
    overhead = (spec.get("overhead") or {}).get("memory")
    try:
        extra = memory_mib(overhead, round_up=True) if overhead is not None else 0
    except InvalidValueError:
        extra = 0
    summed = sum(v for v in values if v is not None)
    largest_init = max((v for v in init_values if v is not None), default=0)
    return max(summed, largest_init) + extra


def _memory(container: JSON, kind: str) -> int | None:
    value = ((container.get("resources") or {}).get(kind) or {}).get("memory")
    if value is None:
        return None
    try:
        return memory_mib(value, round_up=True)
    except InvalidValueError:  # the API server validated it; nothing better to do
        return None
