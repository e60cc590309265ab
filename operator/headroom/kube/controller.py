"""The controller: rebuild the ledger from the API, then follow watch events.

Start-up order is the safety argument. :meth:`Controller.rebuild` lists every
Node and every Reservation (paged) and rebuilds the ledger from the admitted
ones *before* the admission task starts, so no decision is ever taken against a
ledger that lacks an admitted reservation. Reservations still undecided at that
point are queued in creation order. A reservation whose status already carries
a decision is never decided again; one that is Reclaimed is only scheduled for
deletion.

Reservations are then followed by our own WATCH from the rebuild's
resourceVersion (:mod:`headroom.kube.watch` says why not kopf); Nodes and owner
pods through kopf. The ``on_*`` methods take one watch event each; they are
synchronous and cheap, so a burst of events never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

import aiohttp

from headroom.api.config import OperatorConfig
from headroom.api.constants import API_VERSION
from headroom.api.reasons import Phase, Reason
from headroom.kube.admission import Admission
from headroom.kube.client import JSON, ApiError, KubeClient, resource_path, retrying
from headroom.kube.events import EventRecorder, ObjectRef
from headroom.kube.metrics import EventsCollector, OperatorMetrics
from headroom.kube.objects import (
    heartbeat_of,
    node_capacity,
    optional_time,
    reservation_entry,
    reservation_id,
)
from headroom.kube.stamp import Stamper, Verdict, load_key, mark_adopted
from headroom.kube.state import State, Tracked
from headroom.kube.status import precise, reservation_ref, write_stamp, write_status_fields
from headroom.kube.upkeep import Upkeep
from headroom.kube.watch import follow
from headroom.ledger import Entry

log = logging.getLogger(__name__)
GROUP, VERSION = API_VERSION.split("/")
RESERVATIONS = resource_path(GROUP, VERSION, "reservations")
NODES = resource_path("", "v1", "nodes")
DELETED = "DELETED"


class Controller:
    def __init__(
        self, config: OperatorConfig, client: KubeClient, *, follow_reservations: bool = True
    ) -> None:
        """``follow_reservations=False``: the caller delivers Reservation events itself
        (a test that withholds one, as a broken watch would)."""
        self.config = config
        self._follow_reservations = follow_reservations
        self.client = client
        self.state = State(config.limits.to_limits())
        self.metrics = OperatorMetrics(lambda: self.state.ledger if self.ready.is_set() else None)
        self.events = EventRecorder(client)
        self.metrics.registry.register(EventsCollector(self.events))
        self.admission = Admission(self.state, client, self.events, self.metrics)
        self.upkeep = Upkeep(self.state, client, self.events, self.metrics, config)
        self.ready = asyncio.Event()
        self._bad_node_values: dict[str, list[str]] = {}
        self._bad_pod_heartbeats: dict[tuple[str, str], str] = {}  # one Event per bad value
        self._background_tasks: set[asyncio.Future[Any]] = set()
        self._resync_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Rebuild from the API, then start deciding. Ready only after both."""
        self.events.start()
        key_config = self.config.decision_key
        if key_config.enabled:
            namespace = key_config.namespace or os.environ.get("POD_NAMESPACE", "default")
            key = await load_key(self.client, namespace, key_config.secret_name)
            self.state.stamper = Stamper(key.key, adopting=key.adopting)
        version = await self.rebuild()
        self.upkeep.start()
        self.admission.start()
        if self._follow_reservations:
            self._watch_task = asyncio.create_task(
                follow(self.client, RESERVATIONS, version, self.on_reservation, self.resync),
                name="watch-reservations",
            )
        self._resync_task = asyncio.create_task(self._resync_forever(), name="resync")
        self.ready.set()

    async def stop(self) -> None:
        for task in (self._watch_task, self._resync_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.admission.stop()
        await self.upkeep.stop()
        if self._background_tasks:
            await asyncio.gather(*self._background_tasks, return_exceptions=True)
        await self.events.stop()

    async def rebuild(self) -> str:
        """Rebuild the ledger; return the Reservation list's resourceVersion to watch from."""
        started = datetime.now(UTC)
        nodes, _ = await self.client.list_all(NODES)
        reservations, version = await self.client.list_all(RESERVATIONS)
        for node in nodes:
            self.on_node(None, node)  # total: a bad Node value is an Event, never a raise
        now = datetime.now(UTC)
        admitted: list[tuple[Entry, JSON]] = []
        undecided: list[JSON] = []
        adopted: list[JSON] = []
        for obj in reservations:
            try:
                self._sort_listed(obj, now, admitted, undecided, adopted)
            except Exception:  # one object must not stop the rebuild for all the others
                log.exception("reservation %s unreadable at rebuild", _name_of(obj))
        if adopted:
            log.warning(
                "decision key is new: %d statuses it cannot verify are kept and stamped again",
                len(adopted),
            )
        if self.state.stamper.adopting:
            self._background(self._adopt(adopted))
        result = self.state.ledger.restore([entry for entry, _ in admitted])
        for entry, obj in admitted:
            meta = obj["metadata"]
            self.state.track(
                entry,
                Tracked(
                    meta["uid"],
                    meta["namespace"],
                    meta["name"],
                    entry.node,
                    entry.owner.pod if entry.owner else None,
                    entry.last_heartbeat,
                ),
            )
        for entry in result.over_committed:
            tracked = self.state.tracked[entry.id]
            self.events.record(
                reservation_ref(tracked.namespace, tracked.name, tracked.uid),
                str(Reason.OVER_COMMITTED),
                f"admitted earlier, but node {entry.node} is now over its limit; kept, not evicted",
                "Warning",
            )
        undecided.sort(key=lambda o: o["metadata"].get("creationTimestamp", ""))
        for obj in undecided:
            self.admission.submit(obj)
        self.state.dirty_nodes.update(self.state.node_uids)
        self._background(self.upkeep.delete_orphan_summaries())
        log.info(
            "ledger rebuilt in %.2fs: %d nodes, %d admitted, %d undecided, %d over-committed",
            (datetime.now(UTC) - started).total_seconds(),
            len(nodes),
            len(admitted),
            len(undecided),
            len(result.over_committed),
        )
        return version

    def _sort_listed(
        self,
        obj: JSON,
        now: datetime,
        admitted: list[tuple[Entry, JSON]],
        undecided: list[JSON],
        adopted: list[JSON],
    ) -> None:
        """Put one listed Reservation where the rebuild needs it."""
        status = obj.get("status") or {}
        phase = status.get("phase")
        uid = obj["metadata"]["uid"]
        if phase in (Phase.ADMITTED, Phase.REJECTED):
            verdict = self.state.stamper.verdict(obj)
            if verdict is Verdict.UNTRUSTED:
                self._distrust(obj)
                undecided.append(obj)
                return
            if verdict is Verdict.ADOPT:
                adopted.append(obj)
        if phase == Phase.ADMITTED:
            try:
                admitted.append((reservation_entry(obj, now), obj))
            except ValueError as error:  # cannot happen for objects we admitted
                log.error("admitted reservation %s unreadable: %s", uid, error)
        elif phase == Phase.REJECTED:
            self.state.rejected.add(uid)
        elif phase == Phase.RECLAIMED:
            meta = obj["metadata"]
            reclaimed_at = optional_time(status.get("reclaimedAt")) or now
            self.upkeep.schedule_deletion(meta["namespace"], meta["name"], uid, reclaimed_at)
        else:
            undecided.append(obj)

    async def _adopt(self, adopted: list[JSON]) -> None:
        """Stamp again, with the new key, the statuses kept at rebuild; then close adoption."""
        stamper, failures = self.state.stamper, 0
        for obj in adopted:
            meta, phase = obj["metadata"], str(obj["status"]["phase"])
            decision_id = f"{self.admission.run_id}-adopted-{meta['uid'][:8]}"
            stamp = stamper.sign(meta["uid"], decision_id, phase) or ""
            try:
                await retrying(
                    lambda m=meta, p=phase, d=decision_id, s=stamp: write_stamp(
                        self.client, m["namespace"], m["name"], m["uid"], p, d, s
                    )
                )
            except ApiError as error:
                if not (error.not_found or error.status == 422):  # gone, or decided since
                    failures += 1
                    log.warning("%s not stamped again: %s", _name_of(obj), error)
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                failures += 1
                log.warning("%s not stamped again: %s", _name_of(obj), error)
        key_config = self.config.decision_key
        if failures:
            log.warning(
                "%d statuses not stamped again; adoption continues at the next start", failures
            )
            return
        namespace = key_config.namespace or os.environ.get("POD_NAMESPACE", "default")
        await mark_adopted(self.client, namespace, key_config.secret_name)
        stamper.adopting = False
        log.info("decision key adopted: %d statuses stamped again", len(adopted))

    async def _resync_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_period.total_seconds())
            try:
                await self.resync()
            except Exception:  # a failed resync is retried next period
                log.exception("resync failed")

    async def resync(self) -> str:
        """Check the ledger against a full list: the safety net for a missed watch event,
        and the relist when the watch's version expired. Returns the list's version.

        An entry whose object is gone (or is a namesake) is released; an undecided
        object is queued. Entries tracked after the list was requested are left
        alone: the list cannot know them yet.
        """
        started = time.monotonic()
        reservations, version = await self.client.list_all(RESERVATIONS)
        present = {
            reservation_id(o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["uid"]
            for o in reservations
        }
        for entry_id, tracked in list(self.state.tracked.items()):
            if tracked.tracked_at < started and present.get(entry_id) != tracked.uid:
                log.warning("resync: %s is gone but was still held; released", entry_id)
                self.state.release(entry_id, tracked.uid)
        for obj in reservations:
            self.on_reservation(None, obj)
        await self.upkeep.delete_orphan_summaries()
        return version

    # -- watch events ----------------------------------------------------------------------

    def on_reservation(self, event_type: str | None, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if not (uid and namespace and name):
            return
        entry_id = reservation_id(namespace, name)
        if event_type == DELETED:
            self.admission.withdraw(uid)
            self.state.rejected.discard(uid)
            self.state.release(entry_id, uid)
            return
        if self.state.holds(entry_id, uid):
            self._heartbeat_reservation(entry_id, obj)
            return
        phase = (obj.get("status") or {}).get("phase")
        if uid in self.state.rejected or phase == Phase.RECLAIMED:
            return
        if phase in (Phase.ADMITTED, Phase.REJECTED):
            if self.state.stamper.trusted(obj):
                # Decided by us, yet neither held nor rejected here: an older body of one
                # we already released (pod deleted, reclaimed), or decided before a restart.
                return
            self._distrust(obj)
        self.admission.submit(obj)

    def _distrust(self, obj: JSON) -> None:
        meta, status = obj["metadata"], obj.get("status") or {}
        log.warning(
            "%s/%s: status %s not written by this operator; deciding it again",
            meta["namespace"],
            meta["name"],
            status.get("phase"),
        )
        self.events.record(
            reservation_ref(meta["namespace"], meta["name"], meta["uid"]),
            "UntrustedStatus",
            f"status.phase {status.get('phase')} carries no valid decision stamp; "
            "ignored and decided again",
            "Warning",
        )

    def _heartbeat_reservation(self, entry_id: str, obj: JSON) -> None:
        tracked = self.state.tracked[entry_id]
        try:
            at = heartbeat_of(obj)
        except ValueError as error:
            raw = str(error)
            if tracked.bad_heartbeat != raw:
                tracked.bad_heartbeat = raw
                self.events.record(
                    reservation_ref(tracked.namespace, tracked.name, tracked.uid),
                    "BadHeartbeat",
                    f"{error}; ignored",
                    "Warning",
                )
            return
        if at is not None:
            self.heartbeat(entry_id, at)

    def heartbeat(self, entry_id: str, at: datetime) -> None:
        """Refresh an entry; write status.lastHeartbeat only when it moved far enough."""
        now = datetime.now(UTC)
        entry = self.state.ledger.heartbeat(entry_id, min(at, now))
        tracked = self.state.tracked[entry_id]
        window = self.state.ledger.limits_for(entry.node).heartbeat_stale_window
        step = window * float(self.config.heartbeat_write_fraction)
        written = tracked.written_heartbeat
        if written is not None and entry.last_heartbeat - written < step:
            return
        tracked.written_heartbeat = entry.last_heartbeat
        self._background(
            write_status_fields(
                self.client,
                tracked.namespace,
                tracked.name,
                tracked.uid,
                {"lastHeartbeat": precise(entry.last_heartbeat)},
            )
        )

    def _background(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run a write without waiting for it; failures are logged, never raised."""
        task = asyncio.ensure_future(coroutine)
        self._background_tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Future[Any]) -> None:
        self._background_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background write failed: %s", task.exception())

    def on_node(self, event_type: str | None, obj: JSON) -> None:
        try:
            self._on_node(event_type, obj)
        except Exception:  # one Node must never stop the rebuild or the others
            log.exception("node %s not handled", (obj.get("metadata") or {}).get("name"))

    def _on_node(self, event_type: str | None, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return
        state = self.state
        if event_type == DELETED:
            state.node_uids.pop(name, None)
            state.ledger.remove_node(name)
            self._bad_node_values.pop(name, None)
            self._background(self.upkeep.delete_summary(name))
            return
        state.node_uids[name] = meta.get("uid", "")
        capacity = node_capacity(obj, state.limits, self.config.ram_source)
        if capacity.problems and capacity.problems != self._bad_node_values.get(name):
            self.events.record(
                ObjectRef("v1", "Node", name, meta.get("uid", "")),
                "BadHeadroomSettings",
                "; ".join(capacity.problems),
                "Warning",
            )
        self._bad_node_values[name] = capacity.problems
        if capacity.total_ram_mb is None:
            state.ledger.remove_node(name)
        else:
            state.ledger.set_node_capacity(
                name, capacity.total_ram_mb, capacity.vram_mb, capacity.limits
            )
        state.dirty_nodes.add(name)

    def on_pod(self, event_type: str | None, obj: JSON) -> None:
        try:
            self._on_pod(event_type, obj)
        except Exception:  # one Pod must never stop the others
            log.exception("pod %s not handled", _name_of(obj))

    def _on_pod(self, event_type: str | None, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        owned = self.state.pod_owned.get(key)
        if not owned:
            return
        if event_type == DELETED:
            self._bad_pod_heartbeats.pop(key, None)
            now = datetime.now(UTC)
            for entry_id in list(owned):
                tracked = self.state.release(entry_id)
                if tracked is not None:
                    self.upkeep.reclaim(
                        tracked, Reason.OWNER_POD_DELETED, f"owner pod {key[1]} was deleted", now
                    )
            return
        try:
            at = heartbeat_of(obj)
        except ValueError as error:
            if self._bad_pod_heartbeats.get(key) != str(error):
                self._bad_pod_heartbeats[key] = str(error)
                self.events.record(
                    ObjectRef("v1", "Pod", key[1], meta.get("uid", ""), key[0]),
                    "BadHeartbeat",
                    f"{error}; ignored",
                    "Warning",
                )
            return
        self._bad_pod_heartbeats.pop(key, None)
        if at is not None:
            for entry_id in list(owned):
                self.heartbeat(entry_id, at)


def _name_of(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
