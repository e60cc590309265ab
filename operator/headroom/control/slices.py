"""ResourceSlices into the State, where a node's GPU inventory reads them.

A DRA driver publishes each node's devices as ResourceSlices (``resource.k8s.io/v1``,
cluster-scoped); ``headroom.objects.slices`` reads them. Only *node-local* slices
of the configured drivers are kept: a slice with ``spec.allNodes`` or a
``spec.nodeSelector`` instead of ``spec.nodeName`` describes devices no single
node owns (network-attached), so it is no node's VRAM and is ignored.

Lists race with the watch as Nodes do (``headroom.control.nodes``): a list is a
snapshot from when it was asked for, a watch event handled since is newer. So
each slice remembers when a watch last spoke of it, its deletion included, and
a snapshot older than that is ignored. A slice missing from a list that no watch
has spoken of since is gone: nothing but a list or the watch adds slices, so
unlike a Node it need not be read back.

A cluster without DRA (an API server before 1.34, or ``resource.k8s.io/v1``
turned off) answers 404. That is not an error: there are no slices, one warning
is logged, every resync lists again, and the watch starts from the first list
that succeeds. Nothing waits for it: the rebuild goes on without slices.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Collection

from headroom.api.paths import RESOURCE_SLICES
from headroom.control.state import State
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, ApiError, Transport, list_all
from headroom.kube.watch import follow

log = logging.getLogger(__name__)
DELETED = "DELETED"
_SEEN_KEPT = 600.0  # seconds a deleted slice's watch time is kept; no list takes that long


class Slices:
    def __init__(
        self,
        state: State,
        transport: Transport,
        clock: Clock,
        *,
        drivers: Collection[str],
        refresh: Callable[[set[str]], None],
        rng: random.Random | None = None,
    ) -> None:
        """``refresh(nodes)``: the slices of these nodes changed; read their inventory again."""
        self._state, self._transport, self._clock = state, transport, clock
        self._drivers = frozenset(drivers)
        self._refresh, self._rng = refresh, rng
        self._served = asyncio.Event()  # a list succeeded: the watch may start
        self._version = ""
        self._warned = False

    # -- events ----------------------------------------------------------------------------

    def on_slice(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        """A slice from the watch (``listed_at`` None) or from a snapshot taken at ``listed_at``."""
        try:
            nodes = self._apply(event_type, obj, listed_at)
        except Exception:  # one slice must never stop the watch or the others
            log.exception("ResourceSlice %s not handled", (obj.get("metadata") or {}).get("name"))
            return
        if nodes:
            self._refresh(nodes)

    def _apply(self, event_type: str | None, obj: JSON, listed_at: float | None) -> set[str]:
        """Keep (or drop) one slice; the nodes whose slices changed."""
        name = (obj.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            return set()
        state = self._state
        if listed_at is None:
            state.slice_seen[name] = self._clock.monotonic()
        elif state.slice_seen.get(name, float("-inf")) >= listed_at:
            return set()  # a watch event since the snapshot was asked for may be newer
        node = self._node_of(obj)
        if event_type == DELETED or node is None:
            return self._remove(name)
        old = state.slices.get(name)
        if old == obj:
            return set()
        changed = self._remove(name)
        state.slices[name] = obj
        state.slices_by_node.setdefault(node, set()).add(name)
        return changed | {node}

    def _node_of(self, obj: JSON) -> str | None:
        """The node a slice of a configured driver is local to; None for any other slice."""
        spec = obj.get("spec")
        if not isinstance(spec, dict) or spec.get("driver") not in self._drivers:
            return None
        node = spec.get("nodeName")
        return node if isinstance(node, str) and node else None

    def _remove(self, name: str) -> set[str]:
        old = self._state.slices.pop(name, None)
        if old is None:
            return set()
        node = self._node_of(old)
        if node is None:
            return set()
        names = self._state.slices_by_node.get(node)
        if names is not None:
            names.discard(name)
            if not names:
                del self._state.slices_by_node[node]
        return {node}

    # -- lists -----------------------------------------------------------------------------

    async def _list(self) -> tuple[list[JSON], str] | None:
        """Every ResourceSlice and the list's version; None when none are read (no DRA)."""
        if not self._drivers:
            return None
        try:
            listed = await list_all(self._transport, RESOURCE_SLICES)
        except ApiError as error:
            if not error.not_found:
                raise
            if not self._warned:
                log.warning(
                    "the API server does not serve %s (%s): no GPU inventory from DRA; "
                    "listed again at every resync",
                    RESOURCE_SLICES,
                    error,
                )
                self._warned = True
            return None
        if self._warned:
            log.info("the API server serves %s now", RESOURCE_SLICES)
            self._warned = False
        return listed

    def _take(self, slices: list[JSON], listed_at: float) -> set[str]:
        """A full list asked for at ``listed_at``: the nodes whose slices changed."""
        state = self._state
        changed: set[str] = set()
        listed = set()
        for obj in slices:
            listed.add((obj.get("metadata") or {}).get("name"))
            try:
                changed |= self._apply(None, obj, listed_at)
            except Exception:
                log.exception(
                    "ResourceSlice %s not handled", (obj.get("metadata") or {}).get("name")
                )
        for name in [n for n in state.slices if n not in listed]:
            if state.slice_seen.get(name, float("-inf")) < listed_at:
                changed |= self._remove(name)
        old = listed_at - _SEEN_KEPT
        for name in [n for n, at in state.slice_seen.items() if at < old and n not in state.slices]:
            del state.slice_seen[name]
        return changed

    async def take_listed(self) -> str | None:
        """At the rebuild: list into the State, before any Node's inventory is read.

        Nodes are applied after this, so nothing is refreshed here. Returns the
        list's version, or None when slices are not read (the watch then waits for
        a resync whose list succeeds)."""
        started = self._clock.monotonic()
        listed = await self._list()
        self._take(listed[0] if listed is not None else [], started)
        if listed is None:
            return None
        self._version = listed[1]
        self._served.set()
        return listed[1]

    async def resync(self) -> None:
        """List again (part of every resync): slices missed, and DRA turned on since."""
        started = self._clock.monotonic()
        listed = await self._list()
        changed = self._take(listed[0] if listed is not None else [], started)
        if listed is not None and not self._served.is_set():
            self._version = listed[1]
            self._served.set()
        if changed:
            self._refresh(changed)

    async def relist(self) -> str:
        """The watch's relist (its version expired)."""
        started = self._clock.monotonic()
        listed = await self._list()
        changed = self._take(listed[0] if listed is not None else [], started)
        if changed:
            self._refresh(changed)
        if listed is None:  # no longer served: the watch retries (with backoff)
            raise ApiError(404, "NotFound", f"{RESOURCE_SLICES} is not served")
        return listed[1]

    async def follow(
        self, version: str | None, restarted: Callable[[str], None] = lambda reason: None
    ) -> None:
        """Follow the slices from ``version``; None: from the first resync whose list succeeds.
        ``restarted``: told why each time the watch starts again (``kube.watch.follow``)."""
        if version is None:
            await self._served.wait()
            version = self._version
        await follow(
            self._transport,
            RESOURCE_SLICES,
            version,
            self.on_slice,
            self.relist,
            rng=self._rng,
            restarted=restarted,
        )
