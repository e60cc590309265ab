"""Named signals between the controller's parts, wired in one place.

A part that learns something others must act on (a Node's capacity changed, a
Reservation is gone, a written decision is confirmed) says so by emitting a named
signal; it does not know who listens. :class:`headroom.control.controller.Controller`
creates the signals first, hands each part the ones it emits, builds the parts in
dependency order, and then connects every listener in one block that reads as the
map of who tells whom. So no part holds a lambda into another, no part is patched
after construction, and the circles the parts used to call each other in
(writer → reconciler → writer, reclaimer → reconciler → reclaimer) are gone from
the construction: each is a signal one way and a plain reference the other.

Emission is synchronous and in connection order, on the event loop, exactly as the
direct calls it replaces were: a listener's exception reaches the emitter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, ParamSpec

from headroom.control.state import Record
from headroom.kube.transport import JSON

P = ParamSpec("P")


class Signal(Generic[P]):
    """One named event; calling it calls every connected listener in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._listeners: list[Callable[P, None]] = []

    def connect(self, listener: Callable[P, None]) -> None:
        self._listeners.append(listener)

    @property
    def listener_count(self) -> int:
        return len(self._listeners)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for listener in self._listeners:
            listener(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Signal({self.name!r}, {self.listener_count} listeners)"


def _signal(name: str) -> Callable[[], Signal[...]]:
    return lambda: Signal(name)


@dataclass(frozen=True)
class Signals:
    """Every signal between the controller's parts (what each means, not who hears it)."""

    #: Something changed that may let a waiting reservation go, or be refused, now.
    wake_admission: Signal[[]] = field(default_factory=_signal("wake admission"))
    #: A node came, went, or its capacity, limits or GPU inventory changed.
    capacity_changed: Signal[[]] = field(default_factory=_signal("capacity changed"))
    #: What governs some namespace (its quotas, its labels) changed.
    rules_changed: Signal[[]] = field(default_factory=_signal("rules changed"))
    #: The ResourceSlices of these nodes changed: their GPU inventory must be read again.
    slices_changed: Signal[[set[str]]] = field(default_factory=_signal("slices changed"))
    #: A Reservation (by uid) is gone from the API: what it held is released.
    reservation_gone: Signal[[str]] = field(default_factory=_signal("reservation gone"))
    #: A decision's status was written and confirmed by the API's answer.
    decision_confirmed: Signal[[Record]] = field(default_factory=_signal("decision confirmed"))
    #: A held reservation's heartbeat, from one source (its object or its owner pod).
    heartbeat_seen: Signal[[Record, str, str | None]] = field(
        default_factory=_signal("heartbeat seen")
    )
    #: A Reservation object was reconciled (its newest body).
    reservation_seen: Signal[[JSON]] = field(default_factory=_signal("reservation seen"))
    #: A Reservation's record was forgotten (its uid).
    reservation_forgotten: Signal[[str]] = field(default_factory=_signal("reservation forgotten"))
    #: A decision is seen carried by its object.
    decision_seen: Signal[[Record]] = field(default_factory=_signal("decision seen"))
