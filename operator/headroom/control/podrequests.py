"""Pods bound to nodes, into the ledger: the memory the scheduler gave away.

Every pod is followed (no selector: a pod need not know Headroom to book memory),
and of each only its node and effective memory request are kept, so 50,000 pods
cost a few MB. A pod counts while it is bound and neither Succeeded nor Failed; the
ledger subtracts from its node's limit what it requested beyond its claims
(``headroom.ledger.podrequests``). Lists are read page by page and never held whole.

The same feed counts device-plugin GPUs (``gpus.devicePluginResources``,
``nvidia.com/gpu`` by default): a bound pod that has not ended holds that many whole
devices of its node (``headroom.ledger.external``). Either half can be off
(``podRequests: ignore``, or no resources); the pods are followed while one is on.

A change is followed as fast as the watch delivers it; a node whose figure fell
may have room for a waiting reservation, so the decider is woken.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from headroom.api.paths import PODS
from headroom.control.feeds import Listed, WatchedFeed
from headroom.control.state import PodKey, State, pod_key
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, Transport
from headroom.objects.external import device_plugin_gpus
from headroom.objects.podmemory import memory_request_mb
from headroom.objects.pods import bound_node, is_finished

log = logging.getLogger(__name__)
_PAGE = 500


class PodRequestsFeed(WatchedFeed):
    """Every pod's memory requests and device-plugin GPUs, counted on its node."""

    name, path = "all-pods", PODS

    def __init__(
        self,
        state: State,
        transport: Transport,
        clock: Clock,
        *,
        changed: Callable[[], None],
        memory: bool = True,
        gpu_resources: Collection[str] = (),
    ) -> None:
        """``memory``: count pods' memory requests; ``gpu_resources``: the extended
        resources whose count is device-plugin GPUs (none: not counted)."""
        self._state, self._transport, self._clock, self._changed = state, transport, clock, changed
        self._memory, self._gpu_resources = memory, tuple(gpu_resources)
        self._seen: dict[PodKey, float] = {}  # monotonic: when a watch or a list last said

    def on_event(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        key = pod_key(obj)
        if listed_at is not None and self._seen.get(key, float("-inf")) >= listed_at:
            return  # a watch event since the list was asked for is newer
        # Kept after a DELETED too, so that a list asked for before it cannot bring the
        # pod back; the next list that does not name it forgets it.
        self._seen[key] = self._clock.monotonic() if listed_at is None else listed_at
        try:
            moved = self._apply(event_type, key, obj)
        except Exception:  # one pod must never stop the watch, a list or the others
            log.exception("pod %s/%s not handled", *key)
            return
        if moved:
            self._state.mark_changed(*moved)
            self._changed()

    def _apply(self, event_type: str | None, key: PodKey, obj: JSON) -> set[str]:
        """Count (or stop counting) one pod; the nodes whose figures moved."""
        ledger = self._state.ledger
        node = bound_node(obj)
        moved: set[str] = set()
        if event_type == "DELETED" or node is None or is_finished(obj):
            if self._memory:
                moved = ledger.remove_pod_request(key)
            return moved | ledger.set_device_plugin_pod(key, None, 0)
        if self._memory:
            moved = ledger.set_pod_request(key, node, memory_request_mb(obj))
        gpus = device_plugin_gpus(obj, self._gpu_resources)
        return moved | ledger.set_device_plugin_pod(key, node, gpus)

    async def list_at_start(self) -> Listed:
        """Taken while listed, a page at a time (no other feed's list changes what it counts)."""
        return Listed(await self.relist())

    async def relist(self) -> str:
        """Every pod again, a page at a time: the watch's relist, the rebuild, the resync."""
        asked = self._clock.monotonic()
        listed: set[PodKey] = set()
        token: str | None = None
        version = ""
        while True:
            page = await self._transport.list_page(PODS, limit=_PAGE, continue_token=token)
            for pod in page.get("items") or []:
                listed.add(pod_key(pod))
                self.on_event(None, pod, listed_at=asked)
            metadata = page.get("metadata") or {}
            version = metadata.get("resourceVersion", version)
            token = metadata.get("continue")
            if not token:
                break
        for key in [k for k, at in self._seen.items() if k not in listed and at < asked]:
            del self._seen[key]
            moved = self._state.ledger.remove_pod_request(key)
            moved |= self._state.ledger.set_device_plugin_pod(key, None, 0)
            self._state.mark_changed(*moved)
        self._changed()
        ledger = self._state.ledger
        log.info(
            "pods' memory requests: %d bound pods; %d holding device-plugin GPUs",
            ledger.bound_pods(),
            ledger.pods_with_gpus(),
        )
        return str(version)
