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

An owner is one pod *incarnation*: a pod deleted and created again under the same
name (a StatefulSet's) is a new owner, and the old one's reservations are released.
A uid other than the owner's is the third thing that is not what it seems: a new
incarnation, or a late event of an earlier one (a watch lagging a list); the pod
is read before anything is released.

Each pod's read runs on a keyed work queue (:mod:`headroom.kube.workqueue`): one read
per pod at a time; a reason to read it again that comes while a read is in flight
(a DELETED after the read was sent, say) reads it once more after, rather than being
dropped; a read that got no answer is tried again after the pod's own backoff
(0.2 s doubling to 10 s, jittered).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from headroom.api.constants import OWNER_LABEL
from headroom.api.paths import PODS, pod_path
from headroom.api.reasons import EventReason, Reason
from headroom.api.refs import ObjectRef
from headroom.control.feeds import WatchedFeed
from headroom.control.state import POD, PodKey, Record, SeenPod, State, deliver_listed, pod_key
from headroom.kube.clock import Clock
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport, list_all
from headroom.kube.workqueue import WorkQueue
from headroom.objects.pods import placed_by_operator, running_claim
from headroom.objects.reservations import heartbeat_value, is_owner_pod

log = logging.getLogger(__name__)
OWNER_SELECTOR = f"{OWNER_LABEL}=true"
Key = PodKey


class Owners(WatchedFeed):
    """Labelled owner pods: whose heartbeats keep reservations alive."""

    name, path, selector = "pods", PODS, OWNER_SELECTOR

    def __init__(
        self,
        state: State,
        transport: Transport,
        events: EventRecorder,
        clock: Clock,
        *,
        observe: Callable[[Record, str, str | None], None],
        reclaim: Callable[[Record, Reason, str], None],
        rng: random.Random,
        scheduler: str | None = None,
    ) -> None:
        """``scheduler``: the one whose binds are the operator's (placement mode scheduler)."""
        self._state, self._transport, self._events = state, transport, events
        self._scheduler = scheduler
        self._clock = clock
        self._observe, self._reclaim = observe, reclaim
        self._bad: dict[Key, str] = {}  # one BadHeartbeat Event per pod and bad value
        self._checks: WorkQueue[Key] = WorkQueue(
            self._check, clock=clock, rng=rng, base=0.2, cap=10.0, name="owner pod"
        )

    def on_event(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        """A labelled Pod from the watch (``listed_at`` None) or a snapshot from ``listed_at``."""
        self._take(event_type, obj, listed_at=listed_at, read=False)

    def _take(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None, read: bool
    ) -> None:
        """``read``: the pod as this module's own read of it showed it, which has just
        released what another incarnation owned; it is not read again for that."""
        meta = obj.get("metadata") or {}
        key = pod_key(obj)
        uid, state = str(meta.get("uid", "")), self._state
        seen = state.owner_pods.get(key)
        if listed_at is not None and seen is not None and seen.seen_at >= listed_at:
            return  # a watch event since the snapshot was asked for may be newer
        if event_type == "DELETED" or not is_owner_pod(obj):
            state.forget_pod(key)
            self._bad.pop(key, None)
            if key in state.owned:
                self.check_gone(key)  # deleted, or only unlabelled? ask
            return
        other = False
        for record in state.owners_of(key):
            if record.pod_uid is None:
                record.pod_uid = uid  # first seen after a start
            elif record.pod_uid != uid:
                other = True
        if other and not read:
            # Deleted and created again under the same name, or only a late event of an
            # earlier pod of that name: the pod is read, and only that one's owners go.
            self.check_gone(key)
        try:
            value = heartbeat_value(obj)
        except ValueError as error:
            # Said once per pod and value, and only about a pod that owns a reservation.
            if key in state.owned and self._bad.get(key) != str(error):
                self._bad[key] = str(error)
                self._events.record(
                    ObjectRef("v1", "Pod", key[1], uid, key[0]),
                    EventReason.BAD_HEARTBEAT,
                    f"{error}; ignored",
                    "Warning",
                )
            value = seen.beat if seen is not None and seen.uid == uid else None
        else:
            self._bad.pop(key, None)
        when = self._clock.monotonic() if listed_at is None else listed_at
        placed = placed_by_operator(obj, self._scheduler)
        state.saw_pod(key, SeenPod(uid, value, when, running_claim(obj), placed))
        for record in state.owners_of(key):
            self._observe(record, POD, value)

    def check_gone(self, key: Key) -> None:
        """Read the pod; if it is gone, its reservations are released."""
        self._checks.add(key)

    async def _check(self, key: Key) -> None:
        asked = self._clock.monotonic()
        try:
            pod = await self._transport.get(pod_path(*key))
        except ApiError as error:
            if error.not_found:
                self._checks.forget(key)
                for record in self._state.owners_of(key):
                    gone = f"owner pod {key[1]} is gone"
                    self._reclaim(record, Reason.OWNER_POD_DELETED, gone)
                return
            failure: Exception = error
        except ApiUnavailableError as error:
            failure = error
        else:
            self._checks.forget(key)
            uid = (pod.get("metadata") or {}).get("uid")
            for record in self._state.owners_of(key):
                if record.pod_uid is not None and record.pod_uid != uid:
                    replaced = f"owner pod {key[1]} was replaced"
                    self._reclaim(record, Reason.OWNER_POD_DELETED, replaced)
            if is_owner_pod(pod):
                self._take(None, pod, listed_at=asked, read=True)
            else:
                log.info(
                    "owner pod %s/%s lost its label; its reservations stay, and its "
                    "heartbeat is read when one would go stale",
                    *key,
                )
            return
        delay = self._checks.add_rate_limited(key)
        log.warning("owner pod %s/%s not read (%s); again in %.1fs", *key, failure, delay)

    async def relist(self) -> str:
        """All labelled pods again: the pod watch's relist, and part of every resync."""
        asked = self._clock.monotonic()
        pods, version = await list_all(self._transport, PODS, label_selector=OWNER_SELECTOR)
        self.take(pods, listed_at=asked)
        return version

    def take(self, pods: list[JSON], *, listed_at: float) -> None:
        """A list of labelled pods asked for at ``listed_at``; every owner it lacks is read."""
        listed = deliver_listed(pods, self.on_event, listed_at=listed_at)
        state = self._state
        state.prune_pods(listed, listed_at)
        for key in list(state.owned):
            if key not in listed:
                self.check_gone(key)

    async def stop(self) -> None:
        await self._checks.shut_down()
