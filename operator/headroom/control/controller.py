"""The controller: rebuild the ledger from the API, then keep every object level with it.

Start-up order is the safety argument. :meth:`Controller.rebuild` lists every feed
(``headroom.control.feeds``) in the order :attr:`Controller.feeds` declares: Nodes,
ResourceSlices (the GPU inventory), ResourceClaims, Namespaces and HeadroomQuotas,
every pod's requests, labelled owner Pods, Reservations (paged) and claim Pods. The
GPU inventory, quotas and requests are taken as they are listed; then, with no API
call in between, the Nodes, the owner Pods, the Reservations (their trusted
admissions restored together) and the claim Pods. All of it is in the ledger
*before* the decider starts, so no decision is ever taken against a ledger that
lacks an admitted reservation, no reservation is restored or decided before its
node's GPU devices are known, and restored admissions are not aged by a list that
comes after them. Then it follows every feed with its own WATCH from its list's
resourceVersion (no gap, no replay; ``headroom.kube.watch`` says why not kopf).

Level-triggered: every path that brings a Reservation ends in the same reconcile
(``headroom.control.reconcile``). This module builds the parts, each after what it
calls, connects the named signals they emit (``headroom.control.signals``) in one
block, runs the periodic resync over the feeds, and starts and stops everything.
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
from typing import Any

from headroom.api.config import OperatorConfig
from headroom.control.admission import Admission
from headroom.control.extender import filter_nodes
from headroom.control.feeds import Feed
from headroom.control.gates import Gates
from headroom.control.keys import Adoption, load_key
from headroom.control.lookups import Lookups
from headroom.control.nodes import Nodes
from headroom.control.outlook import ReservationOutlook
from headroom.control.owners import Owners
from headroom.control.podrequests import PodRequestsFeed
from headroom.control.provisional import ProvisionalHolds
from headroom.control.quotafeed import QuotaFeed
from headroom.control.quotastatus import QuotaStatuses
from headroom.control.reclaim import Reclaimer
from headroom.control.reconcile import Reconciler
from headroom.control.reservations import ReservationFeed
from headroom.control.resourceclaims import ResourceClaims
from headroom.control.roomwaiters import RoomWaiters
from headroom.control.signals import Signals
from headroom.control.slices import Slices
from headroom.control.state import State, pod_key
from headroom.control.summaries import Summaries
from headroom.control.supervisor import Supervisor
from headroom.control.telemetry import NoTelemetry, Telemetry
from headroom.control.writer import StatusWriter
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock, SystemClock
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport
from headroom.objects.stamp import Stamper

log = logging.getLogger(__name__)


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
        self.state = State(config.limits.to_limits())
        self.state.ledger.set_deny_unselected(config.quotas.unselected_namespaces == "Deny")
        self.events = events or EventRecorder(transport, clock=self.clock)
        self.ready = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        self.signals = Signals()
        self._build_parts(may_act, time_left, run_id or uuid.uuid4().hex[:8])
        self.feeds = self._declare_feeds()
        self._connect_signals()

    def _build_parts(
        self, may_act: Callable[[], bool], time_left: Callable[[], float], run_id: str
    ) -> None:
        """Each part built after what it calls; what flows back is one of :attr:`signals`.
        One part a statement, packed, so the wiring reads as one map (hence fmt: off)."""
        config, transport, clock, rng = self.config, self.transport, self.clock, self.rng
        state, events, signals = self.state, self.events, self.signals
        drivers = config.gpus.dra_drivers
        # fmt: off
        self.writer = StatusWriter(
            state, transport, clock, self.telemetry, may_act=may_act, time_left=time_left,
            on_gone=signals.reservation_gone, on_confirmed=signals.decision_confirmed, rng=rng,
        )
        self.summaries = Summaries(
            state, transport, events, clock, config, may_act=may_act, time_left=time_left
        )
        self.nodes = Nodes(
            state, transport, events, clock, config,
            delete_summary=self.summaries.delete, changed=signals.capacity_changed,
        )
        self.slices = Slices(
            state, transport, clock, drivers=drivers, refresh=signals.slices_changed, rng=rng
        )
        self.resource_claims = ResourceClaims(
            state, transport, clock, drivers=drivers, changed=signals.wake_admission, rng=rng
        )
        self.quotas = QuotaFeed(
            state, transport, events, clock,
            wake=signals.wake_admission, changed=signals.rules_changed, rng=rng,
        )
        self.quota_statuses = QuotaStatuses(
            state, self.quotas, transport, clock, config.summary_interval,
            may_act=may_act, time_left=time_left,
        )
        self.reclaimer = Reclaimer(
            state, transport, self.writer, clock, self.telemetry, config, may_act=may_act,
            observe=signals.heartbeat_seen, on_gone=signals.reservation_gone, rng=rng,
            wake_admission=signals.wake_admission,
        )
        self.owners = Owners(
            state, transport, events, clock, observe=signals.heartbeat_seen,
            reclaim=self.reclaimer.reclaim, rng=rng, scheduler=config.binding_for,
        )
        self.lookups = Lookups(
            state, transport, clock, on_node=self.nodes.on_event, on_pod=self.owners.on_event,
            wake=signals.wake_admission, rng=rng,
        )
        self.gates = Gates(
            state, transport, events, clock, reclaim=self.reclaimer.reclaim, may_act=may_act,
            rng=rng, telemetry=self.telemetry,
            bind_grace=config.placement.bind_grace.total_seconds(),
            wake=signals.wake_admission,
        )
        self.room_waiters = RoomWaiters(transport, clock, fits=self._filtered, may_act=may_act)
        self.holds = ProvisionalHolds(
            state, lifetime=config.webhook.provisional_hold.total_seconds(),
            room_freed=signals.wake_admission, seen=lambda uid: uid in self.admission,
        )
        self.admission = Admission(
            state, self.writer, self.lookups, clock, run_id=run_id,
            may_act=may_act, strict=config.queueing.strict, telemetry=self.telemetry,
            namespace_ready=self.quotas.namespace_ready, room_on=self.room_waiters.room_on,
            provisional=self.holds,
        )
        self.adoption = (
            Adoption(
                state, self.writer, transport, clock, run_id=self.admission.run_id,
                namespace=self._key_namespace(), secret=config.decision_key.secret_name, rng=rng,
            )
            if config.decision_key.enabled
            else None
        )
        self.reconciler = Reconciler(
            state, clock, config, self.admission, self.writer, self.reclaimer, events,
            self.telemetry, check_owner=self.owners.check_gone,
            on_reservation=signals.reservation_seen, on_forgotten=signals.reservation_forgotten,
            on_decided=signals.decision_seen,
            adopt=self.adoption.adopt if self.adoption is not None else None,
        )
        self.reservations = ReservationFeed(state, transport, clock, self.reconciler)
        gpu_resources = config.gpus.device_plugin_resources
        self.pod_requests = (
            PodRequestsFeed(
                state, transport, clock, changed=signals.wake_admission,
                memory=config.pod_requests == "subtract", gpu_resources=gpu_resources,
            )
            if config.pod_requests == "subtract" or gpu_resources
            else None
        )
        self.outlook = ReservationOutlook(
            state, self.admission, clock, strict=config.queueing.strict, holds=self.holds,
            deciding=lambda: self.ready.is_set() and may_act(), planned=self.gates.planned,
            scheduler=config.placement.scheduler,
        )
        # fmt: on

    def _declare_feeds(self) -> tuple[Feed, ...]:
        """Every watched kind, in the rebuild's order (module docstring). Listed in this
        order; each node's GPU inventory (ResourceSlices), the GPUs DRA claims hold, every
        namespace and quota and every pod's requests are taken as they are listed, the
        rest in this order once all are listed: the Nodes (their slices already there),
        the owner pods (before the reservations they keep alive), the Reservations, and
        last the claim pods (their reservations known)."""
        return (
            self.nodes,
            self.slices,
            self.resource_claims,
            *self.quotas.feeds,
            *((self.pod_requests,) if self.pod_requests is not None else ()),
            self.owners,
            self.reservations,
            self.gates,
        )

    def _resync_order(self) -> tuple[Feed, ...]:
        """The periodic resync's order: the Reservations first (what a missed DELETED left
        held is released before anything else is listed), every pod's requests last (the
        longest list)."""
        rest = (self.slices, self.resource_claims, *self.quotas.feeds, self.nodes, self.owners)
        last = (self.pod_requests,) if self.pod_requests is not None else ()
        return (self.reservations, *rest, self.gates, *last)

    def _connect_signals(self) -> None:
        """Who hears what: the whole map of signals between the parts."""
        signals = self.signals
        signals.wake_admission.connect(self.admission.wake)
        signals.capacity_changed.connect(self.admission.wake)
        signals.capacity_changed.connect(self.gates.nodes_changed)
        signals.capacity_changed.connect(self.reclaimer.nearer_deadline)  # a shorter window
        signals.rules_changed.connect(self.gates.nodes_changed)
        signals.rules_changed.connect(self.reclaimer.nearer_deadline)  # a shorter lifetime
        signals.slices_changed.connect(self.nodes.refresh)
        signals.reservation_gone.connect(self.reconciler.forget)
        signals.decision_confirmed.connect(self.reconciler.confirmed)
        signals.heartbeat_seen.connect(self.reconciler.observe)
        signals.reservation_seen.connect(self.gates.reservation_seen)
        signals.reservation_forgotten.connect(self.gates.reservation_gone)
        signals.decision_seen.connect(self.gates.decided)

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
        if key_config.enabled:
            key = await load_key(
                self.transport,
                self._key_namespace(),
                key_config.secret_name,
                create=key_config.create,
                labels=key_config.labels,
            )
            self.state.use_stamper(Stamper(key.key, adopting=key.adopting))
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
            for feed in self.feeds:
                restarted = self._restarted(feed.name)
                watch = feed.follow(versions[feed.name], restarted=restarted, rng=self.rng)
                spawn(f"watch-{feed.name}", watch)
        self._in_background(self.summaries.delete_orphans())
        if self.adoption is not None and self.state.stamper.adopting:
            self._in_background(self.adoption.finish())  # one-off: it retries until done
        self.ready.set()

    def _restarted(self, watch: str) -> Callable[[str], None]:
        """What a watch calls when it starts again (``headroom_watch_restarts_total``)."""
        return lambda reason: self.telemetry.watch_restarted(watch, reason)

    async def stop(self) -> None:
        """Bounded: a write not confirmed now is written again after the next start."""
        await self.supervisor.stop()
        await self.writer.stop()
        await self.reclaimer.stop()
        await self.lookups.stop()
        await self.room_waiters.stop()
        for feed in self.feeds:
            await feed.stop()
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

    # -- rebuild and resync ------------------------------------------------------------------

    async def rebuild(self) -> dict[str, str | None]:
        """Rebuild the ledger from every feed's list, in their order; where each watch starts
        (None: the kind is not served yet, its watch waits for a resync's list)."""
        started = self.clock.monotonic()
        listed = [await feed.list_at_start() for feed in self.feeds]  # every API call first
        for taking in listed:  # then into the ledger, with no API call till the decider starts
            taking.take()
        names = [feed.name for feed in self.feeds]
        versions = {name: taking.version for name, taking in zip(names, listed, strict=True)}
        self.state.mark_dirty(*self.state.node_uids)
        log.info(
            "ledger rebuilt in %.2fs: %d nodes, %d owner pods, %d reservations held, %d undecided",
            self.clock.monotonic() - started,
            len(self.state.node_uids),
            len(self.state.owner_pods),
            len(self.state.holders),
            len(self.admission),
        )
        return versions

    async def _resync_forever(self) -> None:
        period = self.config.resync_period.total_seconds()
        # A resync that failed is the safety net missing: tried again soon, not a period later.
        backoff = Backoff(base=1.0, cap=period, rng=self.rng)
        delay = period
        while True:
            await asyncio.sleep(delay)
            failed = False
            steps = [(feed.name, feed.resync) for feed in self._resync_order()]
            for name, step in (*steps, ("summaries", self.summaries.delete_orphans)):
                try:
                    await step()
                except (ApiError, ApiUnavailableError) as error:
                    failed = True
                    log.warning("resync of %s failed: %s", name, error)
                except Exception:
                    failed = True
                    log.exception("resync of %s failed", name)
            if failed:
                delay = backoff.next()
            else:
                backoff.reset()
                delay = period
