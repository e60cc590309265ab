"""What the controller reads from the API, declared once per watched kind.

Every kind the ledger is rebuilt from (ResourceSlices, ResourceClaims, Namespaces,
HeadroomQuotas, every Pod's requests, Nodes, owner Pods, Reservations, claim Pods)
is a :class:`Feed`. The controller does the same four things with each: at start
it takes the feed's list into the State before the first decision (the rebuild),
then follows the kind with a WATCH from that list's version, lists it again at
every resync, and stops it. It iterates one ordered tuple of feeds for all four,
so a new kind is one declaration, and the rebuild order, which is the start-up's
safety argument, reads top to bottom in one place.

The rebuild has two steps: every feed lists (all the API calls), then every list
is taken into the State in the feeds' order, with no API call in between. So the
restored admissions, alive as of their restore, are not aged by a list that comes
after them, and the decider starts right after. A feed whose list depends on no
other's (the DRA kinds, quotas, every pod's requests) takes it while listing.

:class:`WatchedFeed` is the common case: one path and label selector whose full
list replaces what the feed knew. The DRA kinds (``headroom.control.drafeed``) may
not be served at all and say so with a ``None`` version.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, Transport, list_all
from headroom.kube.watch import follow


def _nothing_to_take() -> None:
    return None


@dataclass(frozen=True)
class Listed:
    """A feed's list at the rebuild: the version its watch starts from (None: the kind is
    not served, the watch waits for a list that is), and what takes the list into the
    State, with no API call."""

    version: str | None
    take: Callable[[], None] = _nothing_to_take


class OnEvent(Protocol):
    """One object from a watch (``listed_at`` None) or from a list asked for at ``listed_at``."""

    def __call__(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None: ...


class Feed(Protocol):
    """One watched kind, as the controller rebuilds, follows, resyncs and stops it."""

    @property
    def name(self) -> str:
        """The watch's name (task name, ``headroom_watch_restarts_total{watch}``)."""
        ...

    async def list_at_start(self) -> Listed:
        """The rebuild's list (every API call of it); its ``take`` makes no API call."""
        ...

    async def resync(self) -> None:
        """List again (the safety net for a missed event)."""
        ...

    async def follow(
        self, version: str | None, *, restarted: Callable[[str], None], rng: random.Random
    ) -> None:
        """Watch from ``version``, forever; ``restarted`` is told why a watch starts again,
        ``rng`` jitters its backoff."""
        ...

    async def stop(self) -> None:
        """Bounded: end what the feed started."""
        ...


class WatchedFeed(abc.ABC):
    """A :class:`Feed` of one path and label selector whose full list replaces what it knew."""

    name: ClassVar[str]
    path: ClassVar[str]
    selector: ClassVar[str | None] = None
    _transport: Transport
    _clock: Clock

    @abc.abstractmethod
    def on_event(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        """One object from the watch, or from a list asked for at ``listed_at``."""

    def take(self, objects: list[JSON], *, listed_at: float) -> None:
        """A full list asked for at ``listed_at``; no API call. Needed by the default
        :meth:`list_at_start`; a feed that takes its list while listing has none."""
        raise NotImplementedError(f"the {self.name} feed takes its list while listing")

    @abc.abstractmethod
    async def relist(self) -> str:
        """Every object again, taken into the State; the list's version. The watch's
        relist (its version expired), and every resync."""

    async def list_at_start(self) -> Listed:
        asked = self._clock.monotonic()
        objects, version = await list_all(self._transport, self.path, label_selector=self.selector)
        return Listed(version, lambda: self.take(objects, listed_at=asked))

    async def resync(self) -> None:
        await self.relist()

    async def follow(
        self, version: str | None, *, restarted: Callable[[str], None], rng: random.Random
    ) -> None:
        await follow(
            self._transport,
            self.path,
            version,
            self.on_event,
            self.relist,
            label_selector=self.selector,
            rng=rng,
            restarted=restarted,
        )

    async def stop(self) -> None:
        return None
