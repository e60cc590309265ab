"""The controller: rebuild the ledger from the API, then keep every object level with it.

Start-up order is the safety argument. :meth:`Controller.start` lists every
Node, every node-local ResourceSlice (the GPU inventory), every labelled owner
Pod and every Reservation (paged) and rebuilds the ledger from the admitted ones
*before* the decider starts, so no decision is ever taken against a ledger that
lacks an admitted reservation, and no reservation is restored or decided before
its node's GPU devices are known. Then it follows them with its own WATCHes from
those lists' resourceVersions (no gap, no replay; ``headroom.kube.watch`` says
why not kopf).

Level-triggered: every path that brings a Reservation ends in the same
reconcile (``headroom.control.reconcile``); this module wires the parts
together, runs the periodic resync, and starts and stops everything.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import uuid
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, NamedTuple

from headroom.api.config import OperatorConfig
from headroom.api.paths import HEADROOM_QUOTAS, NAMESPACES, NODES, PODS, RESERVATIONS
from headroom.control.admission import Admission
from headroom.control.extender import filter_nodes
from headroom.control.gates import CLAIM_SELECTOR, Gates
from headroom.control.keys import Adoption, load_key
from headroom.control.lookups import Lookups
from headroom.control.nodes import Nodes
from headroom.control.owners import OWNER_SELECTOR, Owners
from headroom.control.podrequests import PodRequestsFeed
from headroom.control.quotas import QuotaFeed
from headroom.control.quotastatus import QuotaStatuses
from headroom.control.reclaim import Reclaimer
from headroom.control.reconcile import Reconciler
from headroom.control.resourceclaims import ResourceClaims
from headroom.control.roomwaiters import RoomWaiters
from headroom.control.slices import Slices
from headroom.control.state import State, pod_key
from headroom.control.summaries import Summaries
from headroom.control.supervisor import Supervisor
from headroom.control.telemetry import NoTelemetry, Telemetry
from headroom.control.writer import StatusWriter
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock, SystemClock
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport, list_all
from headroom.kube.watch import follow
from headroom.objects.stamp import Stamper

log = logging.getLogger(__name__)
DELETED = "DELETED"
_TOMBSTONES_KEPT = 600.0  # seconds; no list takes that long


class ListVersions(NamedTuple):
    """The resourceVersions of the rebuild's lists: where each watch starts."""

    nodes: str
    owner_pods: str
    reservations: str
    claims: str
    all_pods: str
    slices: str | None  # None: ResourceSlices not served (the watch waits for a resync)
    resource_claims: str | None  # None: likewise for ResourceClaims
    quotas: str
    namespaces: str


class Controller:
    def __init__(
        self,
        config: OperatorConfig,
        transport: Transport,
        *,
        clock: Clock | None = None,
        telemetry: Telemetry | None = None,
        supervisor: Supervisor | None = None,
        may_act: Callable[[], bool] = lambda: True,
        time_left: Callable[[], float] = lambda: math.inf,
        rng: random.Random | None = None,
        run_id: str | None = None,
        events: EventRecorder | None = None,
        follow_watches: bool = True,
    ) -> None:
        """``follow_watches=False``: the caller delivers events itself (a test that
        withholds one, as a broken watch would)."""
        self.config, self.transport = config, transport
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.telemetry = telemetry or NoTelemetry()
        self.supervisor = supervisor or Supervisor()
        self._follow_watches = follow_watches
        self.state = state = State(config.limits.to_limits())
        state.ledger.set_deny_unselected(config.quotas.unselected_namespaces == "Deny")
        self.events = events or EventRecorder(transport, clock=self.clock)
        self.ready = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        run_id = run_id or uuid.uuid4().hex[:8]
        self.writer = StatusWriter(
            state,
            transport,
            self.clock,
            self.telemetry,
            may_act=may_act,
            time_left=time_left,
            on_gone=lambda uid: self.reconciler.forget(uid),
            on_confirmed=lambda record: self.reconciler.confirmed(record),
            rng=self.rng,
        )
        self.summaries = Summaries(
            state, transport, self.events, self.clock, config, may_act=may_act, time_left=time_left
        )
        self.nodes = Nodes(
            state,
            transport,
            self.events,
            self.clock,
            config,
            delete_summary=self.summaries.delete,
            changed=lambda: self._changed_capacity(),
        )
        self.slices = Slices(
            state,
            transport,
            self.clock,
            drivers=config.gpus.dra_drivers,
            refresh=self.nodes.refresh,
            rng=self.rng,
        )
        self.quotas = QuotaFeed(
            state,
            transport,
            self.events,
            self.clock,
            wake=lambda: self.admission.wake(),
            changed=lambda: self.gates.nodes_changed(),
            rng=self.rng,
        )
        self.quota_statuses = QuotaStatuses(
            state,
            self.quotas,
            transport,
            self.clock,
            config.summary_interval,
            may_act=may_act,
            time_left=time_left,
        )
        self.lookups = Lookups(
            state,
            transport,
            self.clock,
            on_node=lambda node, asked: self.nodes.on_node(None, node, listed_at=asked),
            on_pod=lambda pod, asked: self.owners.on_pod(None, pod, listed_at=asked),
            wake=lambda: self.admission.wake(),
            rng=self.rng,
        )
        self.room_waiters = RoomWaiters(
            transport,
            self.clock,
            fits=self._filtered,
            may_act=may_act,
        )
        self.admission = Admission(
            state,
            self.writer,
            self.lookups,
            self.clock,
            run_id=run_id,
            may_act=may_act,
            strict=config.queueing.strict,
            telemetry=self.telemetry,
            namespace_ready=lambda namespace: self.quotas.namespace_ready(namespace),
            room_on=self.room_waiters.room_on,
        )
        self.reclaimer = Reclaimer(
            state,
            transport,
            self.writer,
            self.clock,
            self.telemetry,
            config,
            may_act=may_act,
            observe=lambda record, source, value: self.reconciler.observe(record, source, value),
            on_gone=lambda uid: self.reconciler.forget(uid),
            rng=self.rng,
            wake_admission=lambda: self.admission.wake(),
        )
        self.owners = Owners(
            state,
            transport,
            self.events,
            self.clock,
            observe=lambda record, source, value: self.reconciler.observe(record, source, value),
            reclaim=self.reclaimer.reclaim,
            rng=self.rng,
            scheduler=config.binding_for,
        )
        self.resource_claims = ResourceClaims(
            state,
            transport,
            self.clock,
            drivers=config.gpus.dra_drivers,
            changed=lambda: self.admission.wake(),
            rng=self.rng,
        )
        gpu_resources = config.gpus.device_plugin_resources
        self.pod_requests = (
            PodRequestsFeed(
                state,
                transport,
                self.clock,
                changed=lambda: self.admission.wake(),
                memory=config.pod_requests == "subtract",
                gpu_resources=gpu_resources,
            )
            if config.pod_requests == "subtract" or gpu_resources
            else None
        )
        self.gates = Gates(
            state,
            transport,
            self.events,
            self.clock,
            reclaim=self.reclaimer.reclaim,
            may_act=may_act,
            rng=self.rng,
            telemetry=self.telemetry,
            bind_grace=config.placement.bind_grace.total_seconds(),
        )
        self.reconciler = Reconciler(
            state,
            self.clock,
            config,
            self.admission,
            self.writer,
            self.reclaimer,
            self.events,
            self.telemetry,
            check_owner=self.owners.check_gone,
            on_reservation=self.gates.reservation_seen,
            on_forgotten=self.gates.reservation_gone,
            on_decided=self.gates.decided,
        )

    # -- life cycle ------------------------------------------------------------------------

    def _filtered(self, pod: JSON, names: list[str], now: datetime) -> list[str]:
        """The nodes among ``names`` the extender's filter would pass for ``pod`` now."""
        own = self.gates.record_for_claim(pod_key(pod), pod)
        strict = self.config.queueing.strict
        return filter_nodes(self.state, pod, names, now, own=own, strict=strict).nodes

    async def start(self) -> None:
        """Rebuild from the API, then start deciding. Ready only after both."""
        self.events.start()
        key_config = self.config.decision_key
        adoption = None
        if key_config.enabled:
            namespace = self._key_namespace()
            key = await load_key(
                self.transport,
                namespace,
                key_config.secret_name,
                create=key_config.create,
                labels=key_config.labels,
            )
            self.state.use_stamper(Stamper(key.key, adopting=key.adopting))
            if key.adopting:
                adoption = Adoption(
                    self.state,
                    self.writer,
                    self.transport,
                    self.clock,
                    run_id=self.admission.run_id,
                    namespace=namespace,
                    secret=key_config.secret_name,
                    rng=self.rng,
                )
                self.reconciler.adopt = adoption.adopt
        versions = await self.rebuild()
        scheduler = self.config.binding_for
        if scheduler is not None:  # the waiters an earlier leader knew; room may be back
            self.room_waiters.inherit(self.gates.unschedulable_for(scheduler))
            self.room_waiters.room_on(set(self.state.ledger.nodes()))
        spawn = self.supervisor.spawn
        spawn("admission", self.admission.run())
        spawn("sweeper", self.reclaimer.run())
        spawn("summaries", self.summaries.run())
        spawn("quota-statuses", self.quota_statuses.run())
        spawn("resync", self._resync_forever())
        self.gates.start()
        if self._follow_watches:
            self._follow(versions)
        self._in_background(self.summaries.delete_orphans())
        if adoption is not None:  # one-off (it retries until done), not a long-lived task
            self._in_background(adoption.finish())
        self.ready.set()

    def _follow(self, versions: ListVersions) -> None:
        spawn = self.supervisor.spawn
        spawn(
            "watch-resourceslices",
            self.slices.follow(versions.slices, restarted=self._restarted("resourceslices")),
        )
        spawn(
            "watch-resourceclaims",
            self.resource_claims.follow(
                versions.resource_claims, restarted=self._restarted("resourceclaims")
            ),
        )
        watches: list[tuple[str, str, str, Any, Any, str | None]] = [
            # (name, path, from version, on event, relist, label selector)
            ("reservations", RESERVATIONS, versions.reservations, self.on_reservation,
             self.resync, None),
            ("nodes", NODES, versions.nodes, self.nodes.on_node, self.nodes.relist, None),
            ("headroomquotas", HEADROOM_QUOTAS, versions.quotas, self.quotas.on_quota,
             self.quotas.relist_quotas, None),
            ("namespaces", NAMESPACES, versions.namespaces, self.quotas.on_namespace,
             self.quotas.relist_namespaces, None),
            ("pods", PODS, versions.owner_pods, self.owners.on_pod, self.owners.relist,
             OWNER_SELECTOR),
            ("claims", PODS, versions.claims, self.gates.on_pod, self.gates.relist,
             CLAIM_SELECTOR),
        ]  # fmt: skip
        if self.pod_requests is not None:
            watches.append(
                ("all-pods", PODS, versions.all_pods, self.pod_requests.on_pod,
                 self.pod_requests.relist, None)
            )  # fmt: skip
        for name, path, version, on_event, relist, selector in watches:
            spawn(
                f"watch-{name}",
                follow(
                    self.transport,
                    path,
                    version,
                    on_event,
                    relist,
                    label_selector=selector,
                    rng=self.rng,
                    restarted=self._restarted(name),
                ),
            )

    def _restarted(self, watch: str) -> Callable[[str], None]:
        """What a watch calls when it starts again (``headroom_watch_restarts_total``)."""
        return lambda reason: self.telemetry.watch_restarted(watch, reason)

    async def stop(self) -> None:
        """Bounded: a write not confirmed now is written again after the next start."""
        await self.supervisor.stop()
        for part in (
            self.writer,
            self.reclaimer,
            self.lookups,
            self.owners,
            self.nodes,
            self.gates,
            self.room_waiters,
            self.quotas,
        ):
            await part.stop()
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.wait(list(self._background), timeout=2.0)
        await self.events.stop()

    def _key_namespace(self) -> str:
        return self.config.decision_key.namespace or os.environ.get("POD_NAMESPACE", "default")

    def _in_background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        async def logged() -> None:
            try:
                await coroutine
            except (ApiError, ApiUnavailableError) as error:
                log.warning("background work failed (%s); the resync does it again", error)
            except Exception:
                log.exception("background work failed")

        task = asyncio.create_task(logged())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _changed_capacity(self) -> None:
        self.admission.wake()
        self.gates.nodes_changed()
        self.reclaimer.nearer_deadline()  # a shorter window brings deadlines nearer

    # -- rebuild and resync ------------------------------------------------------------------

    async def rebuild(self) -> ListVersions:
        """Rebuild the ledger; return where each watch starts (:class:`ListVersions`)."""
        started = self.clock.monotonic()
        nodes, node_version = await list_all(self.transport, NODES)
        # Each node's GPU inventory, before any admission is restored or decided against it.
        slice_version = await self.slices.take_listed()
        # GPUs that DRA claims hold, likewise (tied to devices by their DRA names).
        claims_version = await self.resource_claims.take_listed()
        # Every quota and namespace: usage is rebuilt with the ledger, before any decision.
        quota_version, namespace_version = await self.quotas.take_listed()
        # What pods requested, before any admission is restored or decided against it.
        all_pods = await self.pod_requests.relist() if self.pod_requests is not None else ""
        pods, pod_version = await list_all(self.transport, PODS, label_selector=OWNER_SELECTOR)
        reservations, version = await list_all(self.transport, RESERVATIONS)
        claims, claim_version = await list_all(self.transport, PODS, label_selector=CLAIM_SELECTOR)
        for node in nodes:
            self.nodes.on_node(None, node, listed_at=started)
        self.owners.take(pods, listed_at=started)  # nothing held yet: nothing to read back
        self.reconciler.restoring()
        try:
            reservations.sort(key=lambda o: (o.get("metadata") or {}).get("creationTimestamp", ""))
            for obj in reservations:
                self.reconciler.reconcile(obj)
        finally:
            self.reconciler.restore_collected()
        self.gates.take(claims, listed_at=started)  # acted on once the decider runs
        self.state.mark_dirty(*self.state.node_uids)
        log.info(
            "ledger rebuilt in %.2fs: %d nodes, %d owner pods, %d reservations held, %d undecided",
            self.clock.monotonic() - started,
            len(nodes),
            len(pods),
            len(self.state.holders),
            len(self.admission),
        )
        return ListVersions(
            node_version,
            pod_version,
            version,
            claim_version,
            all_pods,
            slice_version,
            claims_version,
            quota_version,
            namespace_version,
        )

    async def _resync_forever(self) -> None:
        period = self.config.resync_period.total_seconds()
        # A resync that failed is the safety net missing: tried again soon, not a period later.
        backoff = Backoff(base=1.0, cap=period, rng=self.rng)
        delay = period
        while True:
            await asyncio.sleep(delay)
            failed = False
            steps = [
                self.resync,
                self.slices.resync,
                self.resource_claims.resync,
                self.quotas.resync,
                self.nodes.relist,
                self.owners.relist,
                self.gates.relist,
            ]
            if self.pod_requests is not None:
                steps.append(self.pod_requests.relist)
            for step in (*steps, self._orphans):
                try:
                    await step()
                except (ApiError, ApiUnavailableError) as error:
                    failed = True
                    log.warning("resync step %s failed: %s", step.__name__, error)
                except Exception:
                    failed = True
                    log.exception("resync step %s failed", step.__name__)
            if failed:
                delay = backoff.next()
            else:
                backoff.reset()
                delay = period

    async def _orphans(self) -> None:
        await self.summaries.delete_orphans()

    async def resync(self) -> str:
        """Reconcile every Reservation from a full list: the safety net for a missed watch
        event, and the relist when the watch's version expired. Returns the list's version.

        A record whose object is not in the list is forgotten (released); records made
        after the list was asked for, and objects known gone since, are left alone: the
        list cannot know them yet.
        """
        started = self.clock.monotonic()
        reservations, version = await list_all(self.transport, RESERVATIONS)
        present = {(o.get("metadata") or {}).get("uid") for o in reservations}
        for uid, record in list(self.state.records.items()):
            if uid not in present and record.seen_at < started:
                log.warning(
                    "resync: %s is gone but was still remembered",
                    record.entry_id,
                    extra=record.about,
                )
                self.reconciler.forget(uid)
        for obj in reservations:
            self.reconciler.reconcile(obj, listed_at=started)
        self.state.prune_tombstones(self.clock.monotonic() - _TOMBSTONES_KEPT)
        return version

    # -- reservations ------------------------------------------------------------------------

    def on_reservation(self, event_type: str | None, obj: JSON) -> None:
        if event_type == DELETED:
            uid = (obj.get("metadata") or {}).get("uid")
            if uid:
                self.reconciler.forget(uid)
            return
        self.reconciler.reconcile(obj)
