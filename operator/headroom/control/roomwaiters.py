"""Pods kube-scheduler could not place for want of ledger room, nudged when room comes back.

A pod whose every feasible node the extender's filter refused waits in kube-scheduler's
unschedulable pool. The scheduler tries it again on cluster events (a Pod, Node, PVC...
changed), or after five minutes. The ledger's room comes back without such an event (a
reservation released, a quota raised, a node's limit loosened), so the scheduler would
not know. The leader does: whenever the decider is told room may have come back on some
nodes (``State.mark_room``), each waiter that would pass the filter on one of them now
gets an annotation written (``headroom.dev/room``); that update requeues it in the
scheduler within milliseconds (design, M8).

Waiters are pods, oldest first, remembered with the nodes the scheduler found feasible
for them at their last filter; forgotten when a filter finds them room, when they are
bound, gone, or not filtered for ``_FORGET_AFTER``. A nudge only asks the scheduler to
try: filter and bind decide, so two pods nudged for the same room cannot both take it.

The leader alone filters, so only it knows the waiters. A new leader takes over those
the scheduler left unschedulable (:meth:`RoomWaiters.inherit`), without the nodes they
waited for: each is nudged once room comes back on a node where the ledger would let it
go, and remembered afresh by its next filter.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from headroom.api.constants import ROOM_ANNOTATION
from headroom.api.paths import pod_path
from headroom.control.state import PodKey
from headroom.control.tasks import BackgroundTasks
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport
from headroom.objects.podreservations import annotation_patch

log = logging.getLogger(__name__)
_FORGET_AFTER = 600.0  # seconds without a filter call: the scheduler gave up, or the pod went


@dataclass(slots=True)
class Waiter:
    pod: JSON  # as the scheduler last sent it
    nodes: frozenset[str]  # feasible for the scheduler, refused by the ledger
    seen_at: float  # monotonic
    created: str  # creationTimestamp: the order waiters are looked at in
    anywhere: bool = False  # refused by a quota too: room anywhere may be its quota's
    inherited: bool = False  # from an earlier leader: where it waited is not known


class RoomWaiters:
    def __init__(
        self,
        transport: Transport,
        clock: Clock,
        *,
        fits: Callable[[JSON, list[str], datetime], list[str]],
        may_act: Callable[[], bool],
    ) -> None:
        """``fits``: the nodes among those given where the filter would let the pod go now."""
        self._transport, self._clock, self._fits, self._may_act = transport, clock, fits, may_act
        self._waiters: dict[PodKey, Waiter] = {}
        self._tasks = BackgroundTasks()
        self._nudges = 0

    def __len__(self) -> int:
        return len(self._waiters)

    def waits(
        self, key: PodKey, pod: JSON, nodes: Iterable[str], *, anywhere: bool = False
    ) -> None:
        """The filter found the pod no room on any of ``nodes``; ``anywhere``: a quota
        refused it on some, so room that comes back on any node may be its quota's."""
        created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
        now = self._clock.monotonic()
        self._waiters[key] = Waiter(pod, frozenset(nodes), now, created, anywhere)

    def inherit(self, pods: Iterable[tuple[PodKey, JSON]]) -> None:
        """Pods the scheduler left unschedulable before this replica led (an earlier
        leader filtered them): they wait for room on any node, until a filter says where."""
        now = self._clock.monotonic()
        for key, pod in pods:
            if key not in self._waiters:
                created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
                self._waiters[key] = Waiter(pod, frozenset(), now, created, inherited=True)

    def forget(self, key: PodKey) -> None:
        """It found room (a filter passed a node), or it was bound."""
        self._waiters.pop(key, None)

    def room_on(self, nodes: set[str]) -> None:
        """Room may have come back on ``nodes``: nudge every waiter that fits on one now."""
        if not nodes or not self._waiters or not self._may_act():
            return
        now, mono = self._clock.now(), self._clock.monotonic()
        for key in sorted(self._waiters, key=lambda k: (self._waiters[k].created, k)):
            waiter = self._waiters[key]
            if mono - waiter.seen_at > _FORGET_AFTER:
                del self._waiters[key]
                continue
            if waiter.inherited:
                candidates = sorted(nodes)  # where it may go is not known: where room is back
            else:
                candidates = sorted(waiter.nodes if waiter.anywhere else waiter.nodes & nodes)
            if candidates and self._fits(waiter.pod, candidates, now):
                del self._waiters[key]  # the scheduler's next filter says again if not
                self._nudges += 1
                self._tasks.spawn(self._nudge(key, waiter.pod, self._nudges))

    async def _nudge(self, key: PodKey, pod: JSON, count: int) -> None:
        value = f"{self._clock.now().isoformat()}#{count}"
        operations = annotation_patch(pod, ROOM_ANNOTATION, value)
        try:
            await self._transport.json_patch(pod_path(*key), operations)
        except (ApiError, ApiUnavailableError) as error:
            # Gone or replaced; or the API is away: the scheduler's own retry (at worst
            # its five-minute flush) still comes.
            log.debug("pod %s/%s not nudged: %s", *key, error)

    async def stop(self) -> None:
        await self._tasks.stop()
