"""HeadroomQuotas and Namespaces into the ledger's quota arithmetic.

Both are listed at the rebuild, after Nodes and before any admission is restored
or decided, so the first decision already sees every quota and every namespace's
labels; then both are watched, and listed again at every resync.

Lists race with watches as Nodes do (``headroom.control.nodes``): each object
remembers when a watch last spoke of it, its deletion included, and a list asked
for before that is ignored for it.

A namespace's labels decide its quotas, and the Namespace watch can lag the
Reservation watch: a reservation in a namespace created (labelled) a moment ago
could be decided as if no quota selected it. So, while any quota exists (or
unselected namespaces are denied), a reservation in a namespace not seen yet
waits until the Namespace is read (:meth:`QuotaFeed.namespace_ready`), as one on
a Node not seen yet does.

A quota that cannot be read is never a reason to stop: it is isolated
(``headroom.objects.quotas``), named in a Warning Event once per distinct problem,
and the other quotas and namespaces go on.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from headroom.api.constants import API_VERSION
from headroom.api.paths import HEADROOM_QUOTAS, NAMESPACES, namespace_path
from headroom.api.reasons import EventReason
from headroom.api.refs import ObjectRef
from headroom.control.feeds import Listed, WatchedFeed
from headroom.control.state import State
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.events import EventRecorder
from headroom.kube.retry import api_failure, retry_call
from headroom.kube.transport import JSON, ApiError, Transport, list_all
from headroom.objects.quotas import quota_rules

log = logging.getLogger(__name__)
DELETED = "DELETED"
QUOTA, NAMESPACE = "quota", "namespace"
_SEEN_KEPT = 600.0  # seconds a deleted object's watch time is kept; no list takes that long


class QuotaFeed:
    def __init__(
        self,
        state: State,
        transport: Transport,
        events: EventRecorder,
        clock: Clock,
        *,
        wake: Callable[[], None],
        changed: Callable[[], None] = lambda: None,
        rng: random.Random | None = None,
    ) -> None:
        """``wake()``: quotas or namespaces changed; waiters may go now. ``changed()``: what
        governs some namespace changed; gated pods that no node was allowed for may find
        one now."""
        self._state, self._transport, self._events, self._clock = state, transport, events, clock
        self._wake, self._rules_changed, self._rng = wake, changed, rng or random.Random()
        self._seen: dict[tuple[str, str], float] = {}  # (kind, name) -> last watch event
        self.unusable: dict[str, str] = {}  # quota governing nothing -> why
        self._warned: dict[str, str] = {}  # quota -> the problem last named in an Event
        self.quota_objects: dict[str, JSON] = {}  # name -> metadata (uid, generation)
        self._lookups: dict[str, asyncio.Task[None]] = {}
        #: The two kinds it follows, namespaces first (their labels select the quotas).
        self.feeds = (
            NamespaceWatch(self, transport, clock),
            QuotaWatch(self, transport, clock),
        )

    # -- events ----------------------------------------------------------------------------

    def on_quota(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name or not self._fresh(QUOTA, name, listed_at):
            return
        try:
            self._apply_quota(name, None if event_type == DELETED else obj)
        except Exception:  # one quota must never stop the watch or the others
            log.exception("HeadroomQuota %s not handled", name)

    def _apply_quota(self, name: str, obj: JSON | None) -> None:
        ledger = self._state.ledger
        if obj is None:
            self.quota_objects.pop(name, None)
            self.unusable.pop(name, None)
            self._warned.pop(name, None)
            if ledger.remove_quota(name):
                self._changed()
            return
        metadata = obj.get("metadata") or {}
        self.quota_objects[name] = {
            "uid": str(metadata.get("uid") or ""),
            "generation": metadata.get("generation"),
        }
        rules, problem = quota_rules(obj)
        if problem is not None and self._warned.get(name) != problem:
            self._warned[name] = problem
            what = "governs nothing" if rules is None else "its namespaces admit nothing new"
            self._events.record(
                ObjectRef(API_VERSION, "HeadroomQuota", name, self.quota_objects[name]["uid"]),
                EventReason.INVALID_QUOTA,
                f"HeadroomQuota {name} cannot be used, {what} until it is fixed: {problem}",
                "Warning",
            )
        elif problem is None:
            self._warned.pop(name, None)
        if rules is None:
            self.unusable[name] = problem or ""
            ledger.remove_quota(name)
        else:
            self.unusable.pop(name, None)
            if ledger.quotas.rules(name) == rules:
                return
            ledger.set_quota(rules)
        self._changed()

    def on_namespace(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        metadata = obj.get("metadata") or {}
        name = metadata.get("name")
        if not isinstance(name, str) or not name or not self._fresh(NAMESPACE, name, listed_at):
            return
        ledger = self._state.ledger
        if event_type == DELETED:
            ledger.remove_namespace(name)
            return  # what it held goes with its reservations' deletions
        labels = metadata.get("labels")
        labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
        if ledger.set_namespace(name, labels):
            self._changed()
        elif name in self._lookups:
            self._wake()  # a reservation waiting for this namespace may be decided now

    def _fresh(self, kind: str, name: str, listed_at: float | None) -> bool:
        """Whether this event may be applied: any watch event; a list asked for after the
        last watch event about the object."""
        key = (kind, name)
        if listed_at is None:
            self._seen[key] = self._clock.monotonic()
            return True
        return self._seen.get(key, float("-inf")) < listed_at

    def _changed(self) -> None:
        """What governs some namespace changed: waiters for a quota may go (or be denied)."""
        state = self._state
        state.mark_room(*state.ledger.quota_waiters())
        self._wake()
        self._rules_changed()

    # -- namespaces not seen yet -------------------------------------------------------------

    def namespace_ready(self, namespace: str) -> bool:
        """May a reservation in ``namespace`` be decided now (its labels are known, or no
        quota could care)?"""
        quotas = self._state.ledger.quotas
        if quotas.knows_namespace(namespace) or not (len(quotas) or quotas.deny_unselected):
            return True
        if namespace not in self._lookups:
            task = asyncio.get_running_loop().create_task(self._look_up(namespace))
            self._lookups[namespace] = task
        return False

    async def _look_up(self, namespace: str) -> None:
        async def read() -> tuple[JSON, float]:
            """The namespace, and when it was asked for (each attempt asks anew)."""
            asked = self._clock.monotonic()
            try:
                return await self._transport.get(namespace_path(namespace)), asked
            except ApiError as error:
                if not error.not_found:
                    raise
                # Gone (or never there): it has no labels but its name.
                return {"metadata": {"name": namespace, "labels": {}}}, asked

        def failed(error: Exception, _: float) -> None:
            log.warning("namespace %s not read (%s); retrying", namespace, error)

        try:
            obj, asked = await retry_call(
                read,
                backoff=Backoff(base=0.2, cap=5.0, rng=self._rng),
                retry_on=api_failure,
                on_retry=failed,
            )
            self.on_namespace(None, obj, listed_at=asked)
            if not self._state.ledger.quotas.knows_namespace(namespace):
                # A watch event came in between and was newer: it has spoken already.
                self._state.ledger.set_namespace(
                    namespace, {"kubernetes.io/metadata.name": namespace}
                )
        finally:
            self._lookups.pop(namespace, None)
            self._wake()

    # -- lists -----------------------------------------------------------------------------

    def _take(self, kind: str, objects: list[JSON], listed_at: float) -> None:
        on = self.on_quota if kind == QUOTA else self.on_namespace
        listed = set()
        for obj in objects:
            listed.add((obj.get("metadata") or {}).get("name"))
            on(None, obj, listed_at=listed_at)
        known = (
            set(self.quota_objects)
            if kind == QUOTA
            else set(self._state.ledger.quotas.seen_namespaces())
        )
        for name in known - listed:
            if self._seen.get((kind, name), float("-inf")) < listed_at:
                on(DELETED, {"metadata": {"name": name}}, listed_at=listed_at)
        old = listed_at - _SEEN_KEPT
        for key in [k for k, at in self._seen.items() if at < old]:
            del self._seen[key]

    async def relist_quotas(self) -> str:
        started = self._clock.monotonic()
        quotas, version = await list_all(self._transport, HEADROOM_QUOTAS)
        self._take(QUOTA, quotas, started)
        return version

    async def relist_namespaces(self) -> str:
        started = self._clock.monotonic()
        namespaces, version = await list_all(self._transport, NAMESPACES)
        self._take(NAMESPACE, namespaces, started)
        return version

    async def stop(self) -> None:
        tasks = list(self._lookups.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)


class NamespaceWatch(WatchedFeed):
    """Namespaces (their labels select quotas), as a :class:`Feed` of a :class:`QuotaFeed`."""

    name, path = "namespaces", NAMESPACES

    def __init__(self, quotas: QuotaFeed, transport: Transport, clock: Clock) -> None:
        self._quotas, self._transport, self._clock = quotas, transport, clock

    def on_event(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        self._quotas.on_namespace(event_type, obj, listed_at=listed_at)

    async def relist(self) -> str:
        return await self._quotas.relist_namespaces()

    async def list_at_start(self) -> Listed:
        return Listed(await self.relist())  # taken while listed: the quotas come next


class QuotaWatch(WatchedFeed):
    """HeadroomQuotas, as a :class:`Feed` of a :class:`QuotaFeed` (which it stops)."""

    name, path = "headroomquotas", HEADROOM_QUOTAS

    def __init__(self, quotas: QuotaFeed, transport: Transport, clock: Clock) -> None:
        self._quotas, self._transport, self._clock = quotas, transport, clock

    def on_event(
        self, event_type: str | None, obj: JSON, *, listed_at: float | None = None
    ) -> None:
        self._quotas.on_quota(event_type, obj, listed_at=listed_at)

    async def relist(self) -> str:
        return await self._quotas.relist_quotas()

    async def list_at_start(self) -> Listed:
        return Listed(await self.relist())  # taken while listed: usage rebuilt with the ledger

    async def stop(self) -> None:
        await self._quotas.stop()
