"""Owner pods: their heartbeats, and their going away — whether or not a watch said so.

Pods that carry ``headroom.dev/owner=true`` are followed by a label-selected
watch. Two things that watch reports are not what they seem, so neither acts
alone; the API server is asked (the pod is read) before a reservation is released:

- DELETED also means "no longer matches the selector": a pod that merely lost
  its label is still running, and its reservations stay.
- Silence is not deletion: a pod deleted while the operator was down never
  produces an event. So at start-up and at every resync, every owner pod of a
  held reservation that the list does not show is read, and one that is gone
  releases its reservations (reason ``OwnerPodDeleted``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from headroom.api.constants import OWNER_LABEL
from headroom.api.paths import PODS, pod_path
from headroom.api.reasons import Reason
from headroom.api.refs import ObjectRef
from headroom.control.state import POD, Record, State
from headroom.kube.backoff import Backoff
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport, list_all
from headroom.objects.reservations import heartbeat_value, is_owner_pod

log = logging.getLogger(__name__)
OWNER_SELECTOR = f"{OWNER_LABEL}=true"
Key = tuple[str, str]  # (namespace, pod name)


class Owners:
    def __init__(
        self,
        state: State,
        transport: Transport,
        events: EventRecorder,
        *,
        observe: Callable[[Record, str, str | None], None],
        reclaim: Callable[[Record, Reason, str], None],
        rng: random.Random,
    ) -> None:
        self._state, self._transport, self._events, self._rng = state, transport, events, rng
        self._observe, self._reclaim = observe, reclaim
        self._bad: dict[Key, str] = {}  # one BadHeartbeat Event per pod and bad value
        self._checks: dict[Key, asyncio.Task[None]] = {}

    def on_pod(self, event_type: str | None, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if event_type == "DELETED" or not is_owner_pod(obj):
            self._state.pods.pop(key, None)
            self._bad.pop(key, None)
            if key in self._state.owned:
                self.check_gone(key)  # deleted, or only unlabelled? ask
            return
        try:
            value = heartbeat_value(obj)
        except ValueError as error:
            # Said once per pod and value, and only about a pod that owns a reservation.
            if key in self._state.owned and self._bad.get(key) != str(error):
                self._bad[key] = str(error)
                self._events.record(
                    ObjectRef("v1", "Pod", key[1], str(meta.get("uid", "")), key[0]),
                    "BadHeartbeat",
                    f"{error}; ignored",
                    "Warning",
                )
            value = self._state.pods.get(key)  # the last good value stands
        else:
            self._bad.pop(key, None)
        self._state.pods[key] = value
        for record in self._held_by(key):
            self._observe(record, POD, value)

    def _held_by(self, key: Key) -> list[Record]:
        records = (self._state.records.get(uid) for uid in self._state.owned.get(key, ()))
        return [r for r in records if r is not None]

    def check_gone(self, key: Key) -> None:
        """Read the pod; if it is gone, its reservations are released."""
        if key not in self._checks:
            task = asyncio.create_task(self._check(key), name=f"owner-{key[1]}")
            self._checks[key] = task
            task.add_done_callback(lambda _: self._checks.pop(key, None))

    async def _check(self, key: Key) -> None:
        backoff = Backoff(base=0.2, cap=10.0, rng=self._rng)
        while True:
            try:
                pod = await self._transport.get(pod_path(*key))
            except ApiError as error:
                if error.not_found:
                    for record in self._held_by(key):
                        self._reclaim(
                            record, Reason.OWNER_POD_DELETED, f"owner pod {key[1]} is gone"
                        )
                    return
                failure: Exception = error
            except ApiUnavailableError as error:
                failure = error
            else:
                if is_owner_pod(pod):
                    self.on_pod(None, pod)
                else:
                    log.info(
                        "owner pod %s/%s lost its label; its reservations stay, and its "
                        "heartbeat is read when one would go stale",
                        *key,
                    )
                return
            delay = backoff.next()
            log.warning("owner pod %s/%s not read (%s); again in %.1fs", *key, failure, delay)
            await asyncio.sleep(delay)

    async def relist(self) -> str:
        """All labelled pods again: the pod watch's relist, and part of every resync."""
        pods, version = await list_all(self._transport, PODS, label_selector=OWNER_SELECTOR)
        self.take(pods)
        return version

    def take(self, pods: list[JSON]) -> None:
        """Start from this list of labelled pods; read every missing owner from the API."""
        listed = set()
        for pod in pods:
            meta = pod.get("metadata") or {}
            listed.add((str(meta.get("namespace", "")), str(meta.get("name", ""))))
            self.on_pod(None, pod)
        for key in [k for k in self._state.pods if k not in listed]:
            del self._state.pods[key]
        for key in list(self._state.owned):
            if key not in listed:
                self.check_gone(key)

    async def stop(self) -> None:
        tasks = list(self._checks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
