"""The one node order of both placements (``headroom.ledger.nodeorder``), issue 31."""

from __future__ import annotations

from dataclasses import dataclass

from headroom.ledger.nodeorder import best_first, to_try


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """A node's room (``nodeorder.Room``) from plain figures."""

    node: str
    allocatable_ram_mb: int
    free_vram_mb: int | None = None


def names(rooms: list[NodeFigures]) -> list[str]:
    return [room.node for room in rooms]


def test_most_ram_then_known_and_most_vram_then_name() -> None:
    rooms = [
        NodeFigures("d", 100, None),
        NodeFigures("c", 100, 10),
        NodeFigures("b", 100, 20),
        NodeFigures("a", 50, 500),
        NodeFigures("e", 100, 20),
    ]
    assert names(best_first(rooms)) == ["b", "e", "c", "d", "a"]


def test_fits_now_first_else_fits_later_and_each_test_asked_only_as_far_as_read() -> None:
    rooms = [NodeFigures("a", 300), NodeFigures("b", 200), NodeFigures("c", 100)]
    asked: list[str] = []

    def now(room: NodeFigures) -> bool:
        asked.append(room.node)
        return room.node != "a"

    first = next(to_try(rooms, now, lambda room: True))
    assert (first.node, asked) == ("b", ["a", "b"])
    assert names(list(to_try(rooms, now, lambda room: True))) == ["b", "c"]
    later = list(to_try(rooms, lambda room: False, lambda room: room.node != "b"))
    assert names(later) == ["a", "c"]
