"""Ask the API before refusing: a Node or an owner Pod the watches have not shown yet.

Nodes, Pods and Reservations arrive on separate watch streams with no order
between them, so a Reservation for a Node created a moment earlier can arrive
first. Refusing it ``NodeUnknown`` would be wrong for good (a decision is never
taken again). So before a reservation is refused for an unknown Node, or for an
owner pod that is not there, the decider asks the API server for that object —
once per name, for every reservation seen before the answer came — and decides
when the answer is in. While a Node is being looked up, every reservation on it
waits, so decisions on one node stay in creation order. (Waiting a fixed time
instead would slow every decision about a node that truly does not exist and
still be wrong when the watch is slower than the wait.)
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine
from enum import Enum
from typing import Any, TypeVar

from headroom.api.paths import node_path, pod_path
from headroom.control.feeds import OnEvent
from headroom.control.state import State
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.retry import api_failure, retry_call
from headroom.kube.transport import JSON, ApiError, Transport
from headroom.objects.reservations import is_owner_pod

log = logging.getLogger(__name__)
_REMEMBERED = 10_000  # answers kept per kind; the oldest go first
K = TypeVar("K")
V = TypeVar("V")


class PodAnswer(Enum):
    LABELLED = "labelled"
    UNLABELLED = "unlabelled"
    MISSING = "missing"


class Lookups:
    def __init__(
        self,
        state: State,
        transport: Transport,
        clock: Clock,
        *,
        on_node: OnEvent,
        on_pod: OnEvent,
        wake: Callable[[], None],
        rng: random.Random,
    ) -> None:
        """``on_node``/``on_pod``: the Node and owner-pod feeds, handed what a lookup found."""
        self._state, self._transport, self._clock, self._rng = state, transport, clock, rng
        self._on_node, self._on_pod, self._wake = on_node, on_pod, wake
        self._nodes_checked: dict[str, float] = {}  # node -> when the API said "not usable"
        self._pods_checked: dict[tuple[str, str], tuple[PodAnswer, float]] = {}
        self._pods_read: dict[tuple[str, str], float] = {}  # -> when the last read was asked
        self._tasks: dict[object, asyncio.Task[None]] = {}

    def node_ready(self, node: str, seen: float) -> bool:
        """May a reservation on ``node``, first seen at ``seen``, be decided now?"""
        if node in self._tasks:
            return False  # being looked up: everything on it waits, in order
        if self._state.ledger.knows(node):
            return True
        checked = self._nodes_checked.get(node)
        if checked is not None and checked >= seen:
            return True  # the API said so after this reservation was seen: decide NodeUnknown
        self._start(node, self._look_up_node(node))
        return False

    def owner_pod(self, namespace: str, pod: str, seen: float) -> PodAnswer | None:
        """What the owner pod is, or None while it is being looked up."""
        key = (namespace, pod)
        if key in self._state.owner_pods:
            return PodAnswer.LABELLED
        if key in self._tasks:
            return None
        checked = self._pods_checked.get(key)
        if checked is not None and checked[1] >= seen:
            return checked[0]
        self._start(key, self._look_up_pod(namespace, pod))
        return None

    def pod_read_since(self, namespace: str, pod: str, seen: float) -> bool:
        """Whether the pod was read from the API by a request sent after ``seen``, so that
        the owner pods' view of it is as new as what anyone saw before then; if not, a
        read starts (its answer wakes the decider)."""
        key = (namespace, pod)
        asked = self._pods_read.get(key)
        if asked is not None and asked >= seen:
            return True
        if key not in self._tasks:
            self._start(key, self._look_up_pod(namespace, pod))
        return False

    def _start(self, key: object, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._finished(key))

    def _finished(self, key: object) -> None:
        self._tasks.pop(key, None)
        self._wake()

    async def _look_up_node(self, node: str) -> None:
        asked = self._clock.monotonic()
        found = await self._get(node_path(node))
        if found is not None:
            self._on_node(None, found, listed_at=asked)  # unless a watch event since is newer
        if not self._state.ledger.knows(node):
            _remember(self._nodes_checked, node, self._clock.monotonic())

    async def _look_up_pod(self, namespace: str, pod: str) -> None:
        asked = self._clock.monotonic()
        found = await self._get(pod_path(namespace, pod))
        if found is None:
            answer = PodAnswer.MISSING
        elif is_owner_pod(found):
            self._on_pod(None, found, listed_at=asked)
            answer = PodAnswer.LABELLED
        else:
            answer = PodAnswer.UNLABELLED
        _remember(self._pods_checked, (namespace, pod), (answer, self._clock.monotonic()))
        _remember(self._pods_read, (namespace, pod), asked)

    async def _get(self, path: str) -> JSON | None:
        """The object, or None if the API says it does not exist; retried until it answers."""

        async def get() -> JSON | None:
            try:
                return await self._transport.get(path)
            except ApiError as error:
                if error.not_found:
                    return None
                raise

        def failed(error: Exception, delay: float) -> None:
            log.warning("looking up %s failed (%s); again in %.1fs", path, error, delay)

        return await retry_call(
            get,
            backoff=Backoff(base=0.2, cap=10.0, rng=self._rng),
            retry_on=api_failure,  # a refusal too: the decider waits for this answer
            on_retry=failed,
        )

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)


def _remember(answers: dict[K, V], key: K, value: V) -> None:
    answers.pop(key, None)
    answers[key] = value
    while len(answers) > _REMEMBERED:
        del answers[next(iter(answers))]
