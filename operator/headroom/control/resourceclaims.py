"""Allocated DRA ResourceClaims into the ledger: GPUs that kube-scheduler gave to pods.

Every ResourceClaim of every namespace is followed (``resource.k8s.io/v1``), and of
each only what its allocation holds on devices of the configured DRA drivers is
kept (``headroom.objects.external``); the ledger ties each result to a device of a
node's ResourceSlice inventory by its DRA name (``headroom.ledger.external``).

Lists race with the watch as for slices (``headroom.control.slices``): each claim
remembers when a watch last spoke of it, and a list asked for before that is
ignored for it. A cluster without DRA answers 404: no claims
(``headroom.control.drafeed``).

A node whose figures moved is marked for its NodeHeadroom, and, when a holder went
away, for the waiting reservations that may fit now; the decider is woken.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection

from headroom.api.paths import RESOURCE_CLAIMS
from headroom.control.drafeed import DELETED, SEEN_KEPT, DraFeed
from headroom.control.state import State
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, Transport
from headroom.ledger.external import DraClaim
from headroom.objects.external import claim_holdings, claim_key

log = logging.getLogger(__name__)


class ResourceClaims(DraFeed):
    name = "resourceclaims"

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
        super().__init__(
            transport,
            clock,
            RESOURCE_CLAIMS,
            drivers=drivers,
            missing="no GPUs held through DRA claims",
            rng=rng,
        )
        self._state, self._changed = state, changed
        self._seen: dict[tuple[str, str], float] = {}  # claim -> when a watch or list said
        self._held: set[tuple[str, str]] = set()  # claims holding something in the ledger

    def on_event(self, event_type: str, obj: JSON) -> None:
        self.on_claim(event_type, obj)

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
            self._state.mark_changed(*moved)
            self._changed()

    def _take(self, objs: list[JSON], listed_at: float, *, rebuilding: bool) -> None:
        listed = set()
        for obj in objs:
            listed.add(claim_key(obj))
            self.on_claim(None, obj, listed_at=listed_at)
        for key in [k for k, at in self._seen.items() if k not in listed and at < listed_at]:
            del self._seen[key]
            self._set(key, None)
        old = listed_at - SEEN_KEPT
        for key in [k for k, at in self._seen.items() if at < old and k not in self._held]:
            del self._seen[key]

    async def take_listed(self) -> str | None:
        version = await super().take_listed()
        if version is not None:
            log.info(
                "ResourceClaims: %d allocated on devices of %s",
                self._state.ledger.claims_allocated(),
                ", ".join(sorted(self._drivers)),
            )
        return version
