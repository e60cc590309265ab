"""Nodes into the ledger: total RAM, VRAM and per-node limits, from watch, list or lookup.

A node's VRAM is its GPU inventory's (``headroom.control.inventory``), read from
the Node and its ResourceSlices; a slice that changes reads it again
(:meth:`Nodes.refresh`), with the RAM and limits the Node last gave.

A Node comes from three places: the Node watch, a list (the rebuild, a resync, the
relist after ``410 Gone``) and a lookup (a reservation naming a Node not seen
yet). A list or a lookup is a snapshot from when it was asked for; a watch event
handled since is newer, and the snapshot must not undo it (a node that shrank
must not grow back because an older list said so). So each Node remembers when a
watch last spoke of it, and a snapshot older than that is ignored. A Node missing
from a list is read before it is treated as deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from headroom.api.config import OperatorConfig
from headroom.api.constants import HAMI_REGISTER_ANNOTATION
from headroom.api.paths import NODES, node_path
from headroom.api.reasons import EventReason
from headroom.api.refs import ObjectRef
from headroom.control.feeds import WatchedFeed
from headroom.control.inventory import GpuInventories
from headroom.control.state import State
from headroom.control.tasks import BackgroundTasks
from headroom.kube.clock import Clock
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport, list_all
from headroom.objects.nodeconstraints import node_facts
from headroom.objects.nodes import NodeCapacity, node_capacity

log = logging.getLogger(__name__)
DELETED = "DELETED"


class Nodes(WatchedFeed):
    name, path = "nodes", NODES

    def __init__(
        self,
        state: State,
        transport: Transport,
        events: EventRecorder,
        clock: Clock,
        config: OperatorConfig,
        *,
        delete_summary: Callable[[str], Coroutine[Any, Any, None]],
        changed: Callable[[], None],
    ) -> None:
        self._state, self._transport, self._events = state, transport, events
        self._clock, self._config = clock, config
        self._delete_summary, self._changed = delete_summary, changed
        self._bad_values: dict[str, list[str]] = {}  # one Event per node and set of problems
        self._inventories = GpuInventories(state, events, config.gpus.dra_drivers)
        # What the inventory reads of each Node, and its capacity: for refresh().
        self._last: dict[str, tuple[JSON, NodeCapacity]] = {}
        self._tasks = BackgroundTasks()

    def on_event(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        """A Node from the watch (``listed_at`` None) or from a snapshot taken at ``listed_at``."""
        try:
            self._apply(event_type, obj, listed_at)
        except Exception:  # one Node must never stop the rebuild or the others
            log.exception("node %s not handled", (obj.get("metadata") or {}).get("name"))

    def _apply(self, event_type: str | None, obj: JSON, listed_at: float | None) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return
        state = self._state
        if listed_at is None:
            state.saw_node(name, self._clock.monotonic())
        elif state.node_seen_since(name, listed_at):
            return  # a watch event since the snapshot was asked for may be newer
        if event_type == DELETED:
            state.remove_node(name)
            self._bad_values.pop(name, None)
            self._inventories.forget(name)
            self._last.pop(name, None)
            self._tasks.spawn(self._delete_summary(name))
            self._changed()
            return
        state.set_node_uid(name, meta.get("uid", ""))
        labels = meta.get("labels") or {}
        state.set_node_labels(name, {str(k): str(v) for k, v in labels.items()})
        state.set_node_facts(name, node_facts(obj))
        capacity = node_capacity(obj, state.limits, self._config.ram_source)
        if capacity.problems and capacity.problems != self._bad_values.get(name):
            self._events.record(
                ObjectRef("v1", "Node", name, meta.get("uid", "")),
                EventReason.BAD_HEADROOM_SETTINGS,
                "; ".join(capacity.problems),
                "Warning",
            )
        self._bad_values[name] = capacity.problems
        inventory_part = _inventory_part(meta)
        self._last[name] = (inventory_part, capacity)
        self._inventories.apply(self._ref(name), inventory_part, capacity)
        state.mark_changed(name)  # it may have grown, or its limits loosened
        self._changed()

    def refresh(self, names: set[str]) -> None:
        """The ResourceSlices of these nodes changed: read their inventories again."""
        state = self._state
        refreshed = False
        for name in sorted(names):
            last = self._last.get(name)
            if last is None:
                continue  # no Node (yet): its inventory is read when it comes
            try:
                self._inventories.apply(self._ref(name), *last)
            except Exception:  # one node must never stop the others
                log.exception("GPU inventory of node %s not applied", name)
                continue
            state.mark_changed(name)
            refreshed = True
        if refreshed:
            self._changed()

    def _ref(self, name: str) -> ObjectRef:
        return ObjectRef("v1", "Node", name, self._state.node_uids.get(name, ""))

    async def relist(self) -> str:
        """Every Node again: the Node watch's relist, and part of every resync."""
        started = self._clock.monotonic()
        nodes, version = await list_all(self._transport, NODES)
        self.take(nodes, listed_at=started)
        listed = {(node.get("metadata") or {}).get("name") for node in nodes}
        for name in [n for n in self._state.node_uids if n not in listed]:
            if not self._state.node_seen_since(name, started):
                await self._read_back(name)
        return version

    def take(self, objects: list[JSON], *, listed_at: float) -> None:
        """Nodes a list missed are read back by :meth:`relist` (at the rebuild, none is known)."""
        for node in objects:
            self.on_event(None, node, listed_at=listed_at)

    async def _read_back(self, name: str) -> None:
        """Missing from a list: deleted, or created after it? Ask."""
        asked = self._clock.monotonic()
        try:
            node = await self._transport.get(node_path(name))
        except ApiError as error:
            if error.not_found:
                self.on_event(DELETED, {"metadata": {"name": name}}, listed_at=asked)
            return
        except ApiUnavailableError:
            return  # the next resync asks again
        self.on_event(None, node, listed_at=asked)

    async def stop(self) -> None:
        await self._tasks.stop()


def _inventory_part(meta: JSON) -> JSON:
    """What the GPU inventory reads of a Node, kept for :meth:`Nodes.refresh` (not all of it:
    a Node's status lists its images and can be large)."""
    annotations = meta.get("annotations") or {}
    kept = {k: v for k, v in annotations.items() if k == HAMI_REGISTER_ANNOTATION}
    return {
        "metadata": {
            "name": meta.get("name"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": kept,
        }
    }
