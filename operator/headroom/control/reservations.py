"""Reservations, as the controller's feed: every path that brings one ends in the reconcile.

The rebuild takes every Reservation in creation order and restores the trusted
admissions in one go (``Reconciler.restoring``), so that no decision is taken
against a ledger that lacks one; the watch and the resync's list then hand each
object to the same :meth:`headroom.control.reconcile.Reconciler.reconcile`, and a
deletion to :meth:`~headroom.control.reconcile.Reconciler.forget`.
"""

from __future__ import annotations

import logging

from headroom.api.paths import RESERVATIONS
from headroom.control.feeds import Listed, WatchedFeed
from headroom.control.reconcile import Reconciler
from headroom.control.state import State
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, Transport, list_all

log = logging.getLogger(__name__)
DELETED = "DELETED"
_TOMBSTONES_KEPT = 600.0  # seconds; no list takes that long


class ReservationFeed(WatchedFeed):
    name, path = "reservations", RESERVATIONS

    def __init__(
        self,
        state: State,
        transport: Transport,
        clock: Clock,
        reconciler: Reconciler,
    ) -> None:
        self._state, self._transport, self._clock = state, transport, clock
        self._reconciler = reconciler

    def on_event(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        if event_type == DELETED:
            uid = (obj.get("metadata") or {}).get("uid")
            if uid:
                self._reconciler.forget(uid)
            return
        self._reconciler.reconcile(obj, listed_at=listed_at)

    async def list_at_start(self) -> Listed:
        """The rebuild: every Reservation, taken oldest first, its trusted admissions
        restored together before any is decided."""
        reservations, version = await list_all(self._transport, RESERVATIONS)
        reservations.sort(key=lambda o: (o.get("metadata") or {}).get("creationTimestamp", ""))
        return Listed(version, lambda: self._restore(reservations))

    def _restore(self, objects: list[JSON]) -> None:
        """The rebuild's list, oldest first: nothing is remembered before it."""
        reconciler = self._reconciler
        reconciler.restoring()
        try:
            for obj in objects:
                reconciler.reconcile(obj)
        finally:
            reconciler.restore_collected()

    async def relist(self) -> str:
        """Reconcile every Reservation from a full list: the safety net for a missed watch
        event, and the relist when the watch's version expired. Returns the list's version.

        A record whose object is not in the list is forgotten (released); records made
        after the list was asked for, and objects known gone since, are left alone: the
        list cannot know them yet.
        """
        started = self._clock.monotonic()
        reservations, version = await list_all(self._transport, RESERVATIONS)
        present = {(o.get("metadata") or {}).get("uid") for o in reservations}
        for uid, record in list(self._state.records.items()):
            if uid not in present and record.seen_at < started:
                log.warning(
                    "resync: %s is gone but was still remembered",
                    record.entry_id,
                    extra=record.about,
                )
                self._reconciler.forget(uid)
        for obj in reservations:
            self._reconciler.reconcile(obj, listed_at=started)
        self._state.prune_tombstones(self._clock.monotonic() - _TOMBSTONES_KEPT)
        return version
