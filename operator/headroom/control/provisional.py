"""Room held for a strict create the webhook told "would be admitted", until it is decided.

Under strict mode (``headroom.dev/outlook: strict``) the answer at create is a
promise, so it must not be given twice for the same last room: the review that is
told "admitted" takes the room in the ledger at once, keyed by the create's uid
(final in a create's review), before any other review or decision runs. The hold
is an ordinary ledger entry under a name no Reservation can have
(``<namespace>/~<uid>``): it counts against the node and the namespace's quotas like
the reservation it stands for, never goes stale, and is not a record, so nothing
reclaims or publishes it as a reservation.

It ends in one of two ways:

- the Reservation with that uid comes to be decided: the decider gives the room
  back and decides it at once, in the same synchronous step, so it finds its room
  (under strict FIFO, not behind those that began waiting since: its room was taken
  first, and some wait because of it). While it waits to be decided (a backlog, a
  lookup) the hold stays;
- ``lifetime`` passes and no Reservation with that uid was seen: the create failed
  after the webhook allowed it (AlreadyExists, with a uid never stored), or the review
  never came from the API server at all. The room is given back and waiters may take
  it. The API server stores an allowed create at once, so the lifetime is short
  (seconds): a review forged by a caller that can reach the webhook's port holds room
  no longer than that. Only namespaces an administrator labelled strict hold at all.

Holds live in the leader's memory only: a new leader has none, and decides the
creates it sees as usual (the promise is kept unless the room went meanwhile).
A dry run never holds. The same create reviewed again (an API server retrying the
webhook call: the same uid) is answered as the first time, and held again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from headroom.control.state import State
from headroom.ledger import Entry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, eq=False)
class Hold:
    entry_id: str
    node: str


class ProvisionalHolds:
    """The leader's provisional holds, by the uid of the create that took each."""

    def __init__(
        self,
        state: State,
        *,
        lifetime: float,
        room_freed: Callable[[], None],
        seen: Callable[[str], bool] = lambda uid: False,
    ) -> None:
        """``room_freed()``: told when a hold is given back (the node is marked: what
        waits there is tried again). ``seen(uid)``: whether the Reservation of that uid
        waits to be decided (its hold then outlives ``lifetime``)."""
        self._state, self._lifetime = state, lifetime
        self._room_freed, self._seen = room_freed, seen
        self._holds: dict[str, Hold] = {}

    def __len__(self) -> int:
        return len(self._holds)

    def __contains__(self, uid: str) -> bool:
        return uid in self._holds

    def take(self, uid: str, entry: Entry, now: datetime) -> bool:
        """Hold ``entry``'s room for the create ``uid``; False if it does not fit now (or
        this uid already holds). Call only on the main loop: it arms the expiry timer."""
        if uid in self._holds:
            return False
        namespace = entry.id.split("/", 1)[0]
        stand_in = replace(
            entry,
            id=f"{namespace}/~{uid}",
            devices={},
            pod_lifetime=True,  # never stale: it ends by decision or by lifetime
            expires_at=None,
            wait_until=None,
            provisional=True,  # the reservation's own decision is what the counters count
        )
        if not self._state.ledger.reserve(stand_in, now).admitted:
            return False
        # Its quota's default lifetime is the reservation's, from its own decision: the
        # hold takes none (the sweep would release it as an entry without a record).
        stand_in.expires_at = stand_in.given_expiry = None
        hold = self._holds[uid] = Hold(stand_in.id, entry.node)
        asyncio.get_running_loop().call_later(self._lifetime, self._expire, uid, hold)
        return True

    def give_back(self, uid: str) -> bool:
        """Release ``uid``'s hold, if any (its reservation is being decided, or is gone)."""
        hold = self._holds.pop(uid, None)
        if hold is None:
            return False
        if self._state.ledger.get(hold.entry_id) is not None:  # the sweep may have gone first
            self._state.ledger.release(hold.entry_id)
        self._state.mark_room(hold.node)
        self._room_freed()
        return True

    def _expire(self, uid: str, hold: Hold) -> None:
        if self._holds.get(uid) is not hold:  # given back (or taken again) since
            return
        if self._seen(uid):  # stored and waiting for its decision: it keeps its room
            asyncio.get_running_loop().call_later(self._lifetime, self._expire, uid, hold)
            return
        log.info("provisional hold of create %s ran out: no reservation seen", uid)
        self.give_back(uid)
