"""Allocated DRA ResourceClaims into the ledger: GPUs that kube-scheduler gave to pods.

Every ResourceClaim of every namespace is followed (``resource.k8s.io/v1``), and of
each only what its allocation holds on devices of the configured DRA drivers is
kept (``headroom.objects.external``); the ledger ties each result to a device of a
node's ResourceSlice inventory by its DRA name (``headroom.ledger.external``).

Lists race with the watch as for slices (``headroom.control.slices``): each claim
remembers when a watch last spoke of it, and a list asked for before that is
ignored for it. A cluster without DRA answers 404: no claims, one warning, every
resync lists again, and the watch starts from the first list that succeeds.

A node whose figures moved is marked for its NodeHeadroom, and, when a holder went
away, for the waiting reservations that may fit now; the decider is woken.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Collection

from headroom.api.paths import RESOURCE_CLAIMS
from headroom.control.state import State
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, ApiError, Transport, list_all
from headroom.kube.watch import follow
from headroom.ledger.external import DraClaim
from headroom.objects.external import claim_holdings, claim_key

log = logging.getLogger(__name__)
DELETED = "DELETED"
_SEEN_KEPT = 600.0  # seconds a deleted claim's watch time is kept; no list takes that long


class ResourceClaims:
    def __init__(
        self,
        state: State,
        transport: Transport,
        clock: Clock,
        *,
        drivers: Collection[str],
        changed: Callable[[], None],
        rng: random.Random | None = None,
    ) -> None:
        self._state, self._transport, self._clock = state, transport, clock
        self._drivers = frozenset(drivers)
        self._changed, self._rng = changed, rng
        self._seen: dict[tuple[str, str], float] = {}  # claim -> when a watch or list said
        self._held: set[tuple[str, str]] = set()  # claims holding something in the ledger
        self._served = asyncio.Event()
        self._version = ""
        self._warned = False

    def on_claim(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        key = claim_key(obj)
        if listed_at is not None and self._seen.get(key, float("-inf")) >= listed_at:
            return  # a watch event since the list was asked for is newer
        self._seen[key] = self._clock.monotonic() if listed_at is None else listed_at
        try:
            holds = None if event_type == DELETED else claim_holdings(obj, self._drivers)
        except Exception:  # one claim must never stop the watch or the others
            log.exception("ResourceClaim %s/%s not handled", *key)
            return
        self._set(key, holds)

    def _set(self, key: tuple[str, str], claim: DraClaim | None) -> None:
        if claim is None and key not in self._held:
            return
        moved = self._state.ledger.set_resource_claim(key, claim)
        if claim is None:
            self._held.discard(key)
        else:
            self._held.add(key)
        if moved:
            self._state.dirty_nodes.update(moved)
            self._state.room_nodes.update(moved)
            self._changed()

    async def _list(self) -> tuple[list[JSON], str] | None:
        if not self._drivers:
            return None
        try:
            listed = await list_all(self._transport, RESOURCE_CLAIMS)
        except ApiError as error:
            if not error.not_found:
                raise
            if not self._warned:
                log.warning(
                    "the API server does not serve %s (%s): no GPUs held through DRA claims; "
                    "listed again at every resync",
                    RESOURCE_CLAIMS,
                    error,
                )
                self._warned = True
            return None
        if self._warned:
            log.info("the API server serves %s now", RESOURCE_CLAIMS)
            self._warned = False
        return listed

    def _take(self, claims: list[JSON], listed_at: float) -> None:
        listed = set()
        for obj in claims:
            listed.add(claim_key(obj))
            self.on_claim(None, obj, listed_at=listed_at)
        for key in [k for k, at in self._seen.items() if k not in listed and at < listed_at]:
            del self._seen[key]
            self._set(key, None)
        old = listed_at - _SEEN_KEPT
        for key in [k for k, at in self._seen.items() if at < old and k not in self._held]:
            del self._seen[key]

    async def take_listed(self) -> str | None:
        """At the rebuild, before any reservation is restored or decided: the claims'
        holdings, and the list's version (None: not served; the watch waits)."""
        started = self._clock.monotonic()
        listed = await self._list()
        self._take(listed[0] if listed is not None else [], started)
        if listed is None:
            return None
        self._version = listed[1]
        self._served.set()
        log.info(
            "ResourceClaims: %d allocated on devices of %s",
            self._state.ledger.external.claims_allocated(),
            ", ".join(sorted(self._drivers)),
        )
        return listed[1]

    async def resync(self) -> None:
        """List again (part of every resync): claims missed, and DRA turned on since."""
        started = self._clock.monotonic()
        listed = await self._list()
        self._take(listed[0] if listed is not None else [], started)
        if listed is not None and not self._served.is_set():
            self._version = listed[1]
            self._served.set()

    async def relist(self) -> str:
        """The watch's relist (its version expired)."""
        started = self._clock.monotonic()
        listed = await self._list()
        self._take(listed[0] if listed is not None else [], started)
        if listed is None:
            raise ApiError(404, "NotFound", f"{RESOURCE_CLAIMS} is not served")
        return listed[1]

    async def follow(
        self, version: str | None, restarted: Callable[[str], None] = lambda reason: None
    ) -> None:
        """Follow the claims from ``version``; None: from the first resync whose list succeeds."""
        if version is None:
            await self._served.wait()
            version = self._version
        await follow(
            self._transport,
            RESOURCE_CLAIMS,
            version,
            self.on_claim,
            self.relist,
            rng=self._rng,
            restarted=restarted,
        )
