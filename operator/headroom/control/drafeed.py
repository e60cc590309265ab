"""One DRA kind (``resource.k8s.io/v1``) followed into the State, if the cluster serves it.

ResourceSlices (the GPUs a node has) and ResourceClaims (the GPUs pods hold) are
followed the same way, and both may be missing: an API server before 1.34, or
``resource.k8s.io/v1`` turned off, answers 404. That is not an error: nothing is
read, one warning is logged, every resync lists again, and the watch starts from
the first list that succeeds. Nothing waits for it: the rebuild goes on without.

What differs between the kinds, what one object means and what a full list
replaces, is each subclass's ``_take``; this class owns the listing, the 404,
and when the watch may start.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import random
from collections.abc import Callable, Collection
from typing import ClassVar

from headroom.control.feeds import Listed
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, ApiError, Transport, list_all
from headroom.kube.watch import follow

log = logging.getLogger(__name__)
DELETED = "DELETED"
#: Seconds a deleted object's watch time is kept; no list takes that long.
SEEN_KEPT = 600.0


class DraFeed(abc.ABC):
    """Lists and watches ``path``; read only when DRA ``drivers`` are configured. A
    :class:`headroom.control.feeds.Feed`."""

    name: ClassVar[str]

    def __init__(
        self,
        transport: Transport,
        clock: Clock,
        path: str,
        *,
        drivers: Collection[str],
        missing: str,
        rng: random.Random | None = None,
    ) -> None:
        """``missing``: what the cluster lacks when ``path`` is not served, for the warning."""
        self._transport, self._clock, self._path = transport, clock, path
        self._drivers = frozenset(drivers)
        self._missing, self._rng = missing, rng
        self._served = asyncio.Event()  # a list succeeded: the watch may start
        self._version = ""
        self._warned = False

    @abc.abstractmethod
    def on_event(self, event_type: str, obj: JSON) -> None:
        """One object from the watch."""

    @abc.abstractmethod
    def _take(self, objs: list[JSON], listed_at: float, *, rebuilding: bool) -> None:
        """A full list asked for at ``listed_at`` (empty when not served); ``rebuilding``:
        at the start, before the Nodes are applied."""

    async def _list(self) -> tuple[list[JSON], str] | None:
        """Every object and the list's version; None when none are read (no DRA)."""
        if not self._drivers:
            return None
        try:
            listed = await list_all(self._transport, self._path)
        except ApiError as error:
            if not error.not_found:
                raise
            if not self._warned:
                log.warning(
                    "the API server does not serve %s (%s): %s; listed again at every resync",
                    self._path,
                    error,
                    self._missing,
                )
                self._warned = True
            return None
        if self._warned:
            log.info("the API server serves %s now", self._path)
            self._warned = False
        return listed

    async def _list_and_take(self, *, rebuilding: bool = False) -> str | None:
        started = self._clock.monotonic()
        listed = await self._list()
        self._take(listed[0] if listed is not None else [], started, rebuilding=rebuilding)
        if listed is None:
            return None
        if not self._served.is_set():
            self._version = listed[1]
            self._served.set()
        return listed[1]

    async def take_listed(self) -> str | None:
        """At the rebuild: list into the State. Returns the list's version, or None when
        nothing is read (the watch then waits for a resync whose list succeeds)."""
        return await self._list_and_take(rebuilding=True)

    async def list_at_start(self) -> Listed:
        """Taken while listed: a Node applied later reads its inventory then."""
        return Listed(await self.take_listed())

    async def resync(self) -> None:
        """List again (part of every resync): objects missed, and DRA turned on since."""
        await self._list_and_take()

    async def relist(self) -> str:
        """The watch's relist (its version expired)."""
        version = await self._list_and_take()
        if version is None:  # no longer served: the watch retries (with backoff)
            raise ApiError(404, "NotFound", f"{self._path} is not served")
        return version

    async def follow(
        self,
        version: str | None,
        *,
        restarted: Callable[[str], None] = lambda reason: None,
        rng: random.Random | None = None,
    ) -> None:
        """Follow from ``version``; None: from the first resync whose list succeeds.
        ``restarted``: told why each time the watch starts again (``kube.watch.follow``);
        ``rng`` jitters its backoff (default: the feed's own)."""
        if version is None:
            await self._served.wait()
            version = self._version
        await follow(
            self._transport,
            self._path,
            version,
            self.on_event,
            self.relist,
            rng=rng or self._rng,
            restarted=restarted,
        )

    async def stop(self) -> None:
        return None
