"""kube-scheduler's three extender calls as the leader answers them, whatever carries them.

:mod:`headroom.serving.extender` carries them over HTTPS from kube-scheduler; the
deterministic simulation (:mod:`headroom_dev.sim.scheduled`) makes them directly,
between crashes, pauses and leader changes. Both go through this one object, so what
the simulation explores is what is served.

- filter reads the ledger and holds nothing; a pod it finds no node for is queued,
  after the answer, as a reservation that waits on the best node refused for want of
  room (:meth:`headroom.control.gates.Gates.queue`), so that pods wait in the ledger's
  queues;
- prioritize ranks the nodes by the node policy;
- bind admits the claim on the chosen node and binds the pod there in one step
  (:class:`headroom.control.binder.Binder`).
"""

from __future__ import annotations

import logging

from headroom.control.binder import BindCall, Binder
from headroom.control.controller import Controller
from headroom.control.extender import Filtered, filter_nodes, prioritize, queue_node
from headroom.control.state import pod_key
from headroom.control.tasks import BackgroundTasks
from headroom.kube.transport import JSON

log = logging.getLogger(__name__)


class SchedulerExtender:
    """The leader's answers to filter, prioritize and bind; ``stop`` ends its queueing."""

    def __init__(self, controller: Controller, *, binpack: bool = False) -> None:
        self._controller, self._binpack = controller, binpack
        self._binder = Binder(controller.gates, controller.clock)
        self._queueing = BackgroundTasks()

    def filter(self, pod: JSON, names: list[str]) -> Filtered:
        controller = self._controller
        key = pod_key(pod)
        own = controller.gates.record_for_claim(key, pod)
        now = controller.clock.now()
        strict = controller.config.queueing.strict
        found = filter_nodes(controller.state, pod, names, now, own=own, strict=strict)
        if found.nodes or found.gave_up:
            controller.room_waiters.forget(key)
        elif names:  # the ledger refused every node the scheduler could use: it waits
            controller.room_waiters.waits(key, pod, names, anywhere=found.for_quota)
            node = queue_node(controller.state, pod, found, now)
            if node is not None:
                self._queueing.spawn(controller.gates.queue(key, pod, node))
        return found

    def prioritize(self, pod: JSON, names: list[str]) -> dict[str, int]:
        now = self._controller.clock.now()
        return prioritize(self._controller.state, pod, names, now, binpack=self._binpack)

    async def bind(self, call: BindCall) -> str:
        """The error kube-scheduler is told ("" once bound)."""
        error = await self._binder.bind(call)
        if error:
            log.info("pod %s/%s not bound to %s: %s", call.namespace, call.name, call.node, error)
        else:
            self._controller.room_waiters.forget((call.namespace, call.name))
        return error

    async def stop(self) -> None:
        await self._queueing.stop()
