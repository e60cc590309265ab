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

A cluster without DRA answers 404: no slices (``headroom.control.drafeed``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection

from headroom.api.paths import RESOURCE_SLICES
from headroom.control.drafeed import DELETED, SEEN_KEPT, DraFeed
from headroom.control.state import State
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, Transport

log = logging.getLogger(__name__)


class Slices(DraFeed):
    name = "resourceslices"

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
        super().__init__(
            transport,
            clock,
            RESOURCE_SLICES,
            drivers=drivers,
            missing="no GPU inventory from DRA",
            rng=rng,
        )
        self._state, self._refresh = state, refresh

    # -- events ----------------------------------------------------------------------------

    def on_event(self, event_type: str, obj: JSON) -> None:
        self.on_slice(event_type, obj)

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
            state.saw_slice(name, self._clock.monotonic())
        elif state.slice_seen_since(name, listed_at):
            return set()  # a watch event since the snapshot was asked for may be newer
        node = self._node_of(obj)
        if event_type == DELETED or node is None:
            return self._remove(name)
        old = state.slices.get(name)
        if old == obj:
            return set()
        changed = self._remove(name)
        state.keep_slice(name, node, obj)
        return changed | {node}

    def _node_of(self, obj: JSON) -> str | None:
        """The node a slice of a configured driver is local to; None for any other slice."""
        spec = obj.get("spec")
        if not isinstance(spec, dict) or spec.get("driver") not in self._drivers:
            return None
        node = spec.get("nodeName")
        return node if isinstance(node, str) and node else None

    def _remove(self, name: str) -> set[str]:
        old = self._state.pop_slice(name)
        if old is None:
            return set()
        node = self._node_of(old)
        if node is None:
            return set()
        self._state.unindex_slice(name, node)
        return {node}

    # -- lists -----------------------------------------------------------------------------

    def _take(self, objs: list[JSON], listed_at: float, *, rebuilding: bool) -> None:
        """At the rebuild Nodes are applied after the slices, so nothing is refreshed."""
        state = self._state
        changed: set[str] = set()
        listed = set()
        for obj in objs:
            listed.add((obj.get("metadata") or {}).get("name"))
            try:
                changed |= self._apply(None, obj, listed_at)
            except Exception:
                log.exception(
                    "ResourceSlice %s not handled", (obj.get("metadata") or {}).get("name")
                )
        for name in [n for n in state.slices if n not in listed]:
            if not state.slice_seen_since(name, listed_at):
                changed |= self._remove(name)
        state.prune_slice_times(listed_at - SEEN_KEPT)
        if changed and not rebuilding:
            self._refresh(changed)
