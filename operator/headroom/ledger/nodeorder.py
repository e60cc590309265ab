"""The one node order: which node a claim tries first, for both placements.

``kubectl headroom fit`` and the claim library (``headroom.client.placement``, from
the NodeHeadrooms the operator publishes) and the operator's placement of a gated
pod (``headroom.control.placement``, from its own ledger) rank the nodes by this
rule, so that one never says a node is best while the other puts the claim
elsewhere:

**The order**: most allocatable RAM first, then most free VRAM (a node whose VRAM
is unknown comes after every node whose VRAM is known), then the node's name. The
node with the most room keeps the most after this claim, so the next claim is the
likeliest to fit too, and claims spread over the nodes instead of filling one to
the brim. A reservation is not a pod: nothing moves it later to defragment.

**Which nodes**: those where the claim fits now, best first; when none does, those
where it could fit once other claims leave, best first. Both tests are the caller's
(each reads its own figures) and include the per-device test of a claim with VRAM
on a node that lists its GPUs: ``gpus`` devices with the claim's share free
(:func:`headroom.ledger.devices.share_mb`), not merely a node-wide VRAM sum with
room. A node whose VRAM sum has room but none of whose GPUs does is not where the
claim goes. The tests are asked in the order, each only until one says yes: a
device test is not free, and a thousand nodes are ranked per placement.

A tiebreak by the largest free device was weighed and left out: the node-wide free
VRAM already ranks the emptier GPU node first, and one rule for every claim is
easier to predict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

#: The rule, in a few words, for messages.
RULE = "most allocatable RAM first, then most free VRAM, then name"


class Room(Protocol):
    """One node's room for a claim, as the order reads it."""

    @property
    def node(self) -> str: ...

    @property
    def allocatable_ram_mb(self) -> int: ...

    #: VRAM the node may still admit; None where it is unknown (or not limited).
    @property
    def free_vram_mb(self) -> int | None: ...


R = TypeVar("R", bound=Room)


def key(room: Room) -> tuple[int, int, int, str]:
    """The sort key of the order: more RAM, then known and more free VRAM, then name."""
    vram_unknown = 0 if room.free_vram_mb is not None else 1
    return (-room.allocatable_ram_mb, vram_unknown, -(room.free_vram_mb or 0), room.node)


def best_first(rooms: Iterable[R]) -> list[R]:
    """``rooms`` in the order, best first."""
    return sorted(rooms, key=key)


def to_try(
    rooms: Iterable[R], fits_now: Callable[[R], bool], fits_later: Callable[[R], bool]
) -> Iterator[R]:
    """The nodes a claim tries, best first: those where it ``fits_now``; when none does,
    those where it ``fits_later`` (once other claims leave). Lazy: each test is asked in
    the order, only as far as the caller reads."""
    ranked = best_first(rooms)
    found = False
    for room in ranked:
        if fits_now(room):
            found = True
            yield room
    if not found:
        yield from (room for room in ranked if fits_later(room))
