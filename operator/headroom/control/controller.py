"""The controller: rebuild the ledger from the API, then keep every object level with it.

Start-up order is the safety argument. :meth:`Controller.start` lists every
Node, every labelled owner Pod and every Reservation (paged) and rebuilds the
ledger from the admitted ones *before* the decider starts, so no decision is
ever taken against a ledger that lacks an admitted reservation. Then it follows
all three with its own WATCHes from those lists' resourceVersions (no gap, no
replay; ``headroom.kube.watch`` says why not kopf).

Level-triggered: every path that brings an object — a watch event, the rebuild,
the periodic resync, a relist after ``410 Gone`` — ends in :meth:`reconcile`,
which compares the object with the operator's record of it and does what
brings them into agreement: decide an undecided one, write again a decision the
object does not carry, restore a trusted admission after a restart, forget what
is gone. Retries go through the same record (``headroom.control.writer``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import uuid
from collections.abc import Callable
from datetime import datetime

from headroom.api.config import OperatorConfig
from headroom.api.paths import NODES, PODS, RESERVATIONS
from headroom.api.reasons import Phase, Reason
from headroom.api.refs import ObjectRef
from headroom.control.admission import Admission
from headroom.control.keys import load_key, mark_adopted
from headroom.control.lookups import Lookups
from headroom.control.owners import OWNER_SELECTOR, Owners
from headroom.control.reclaim import Reclaimer
from headroom.control.state import POD, RESERVATION, Record, State
from headroom.control.summaries import Summaries
from headroom.control.supervisor import Supervisor
from headroom.control.telemetry import NoTelemetry, Telemetry
from headroom.control.writer import StatusWriter
from headroom.kube.clock import Clock, SystemClock
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport, list_all
from headroom.kube.watch import follow
from headroom.ledger import Entry
from headroom.objects.nodes import node_capacity
from headroom.objects.reservations import heartbeat_value, optional_time, reservation_entry
from headroom.objects.stamp import Stamper, Verdict
from headroom.objects.status import decision_of, reservation_ref

log = logging.getLogger(__name__)
DELETED = "DELETED"


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
        self.may_act = may_act
        self._follow_watches = follow_watches
        self.state = State(config.limits.to_limits())
        self.events = events or EventRecorder(transport, clock=self.clock)
        self.ready = asyncio.Event()
        self.writer = StatusWriter(
            self.state,
            transport,
            self.clock,
            self.telemetry,
            may_act=may_act,
            time_left=time_left,
            on_gone=self.forget,
            on_confirmed=self._confirmed,
            rng=self.rng,
        )
        self.lookups = Lookups(
            self.state,
            transport,
            self.clock,
            on_node=lambda node: self.on_node(None, node),
            on_pod=lambda pod: self.owners.on_pod(None, pod),
            wake=lambda: self.admission.wake(),
            rng=self.rng,
        )
        self.admission = Admission(
            self.state,
            self.writer,
            self.lookups,
            self.clock,
            run_id=run_id or uuid.uuid4().hex[:8],
            may_act=may_act,
        )
        self.reclaimer = Reclaimer(
            self.state,
            transport,
            self.writer,
            self.clock,
            self.telemetry,
            config,
            may_act=may_act,
            observe=self.observe,
            on_gone=self.forget,
            rng=self.rng,
        )
        self.owners = Owners(
            self.state,
            transport,
            self.events,
            observe=self.observe,
            reclaim=self.reclaimer.reclaim,
            rng=self.rng,
        )
        self.summaries = Summaries(self.state, transport, self.events, self.clock, config)
        self._bad_node_values: dict[str, list[str]] = {}
        self._distrusted: set[str] = set()
        self._restoring: list[tuple[Entry, Record]] | None = None
        self._adopted: list[Record] = []
        self._background: set[asyncio.Task[None]] = set()

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Rebuild from the API, then start deciding. Ready only after both."""
        self.events.start()
        key_config = self.config.decision_key
        if key_config.enabled:
            key = await load_key(self.transport, self._key_namespace(), key_config.secret_name)
            self.state.stamper = Stamper(key.key, adopting=key.adopting)
        versions = await self.rebuild()
        spawn = self.supervisor.spawn
        spawn("admission", self.admission.run())
        spawn("sweeper", self.reclaimer.run())
        spawn("summaries", self.summaries.run())
        spawn("resync", self._resync_forever())
        if self._follow_watches:
            rng = self.rng
            spawn(
                "watch-reservations",
                follow(
                    self.transport,
                    RESERVATIONS,
                    versions[2],
                    self.on_reservation,
                    self.resync,
                    rng=rng,
                ),
            )
            spawn(
                "watch-nodes",
                follow(
                    self.transport, NODES, versions[0], self.on_node, self.relist_nodes, rng=rng
                ),
            )
            spawn(
                "watch-pods",
                follow(
                    self.transport,
                    PODS,
                    versions[1],
                    self.owners.on_pod,
                    self.owners.relist,
                    label_selector=OWNER_SELECTOR,
                    rng=rng,
                ),
            )
        self._in_background(self.summaries.delete_orphans())
        if self.state.stamper.adopting:
            self._in_background(self._adopt(self._adopted))
        self.ready.set()

    async def stop(self) -> None:
        """Bounded: a write not confirmed now is written again after the next start."""
        await self.supervisor.stop()
        for part in (self.writer, self.reclaimer, self.lookups, self.owners):
            await part.stop()
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.wait(list(self._background), timeout=2.0)
        await self.events.stop()

    async def _adopt(self, records: list[Record]) -> None:
        """Stamp again, with the new key, the statuses kept at rebuild; then close adoption.

        The stamp is part of the record's truth, so the new one is set on the record
        first and written by the status writer like any other decision (a watch event
        in between can then only ask for the new one to be written).
        """
        stamper = self.state.stamper
        for number, record in enumerate(records):
            decision = record.decision
            decision.decision_id = f"{self.admission.run_id}-adopted-{number}"
            decision.stamp = stamper.sign(record.uid, decision.decision_id, str(decision.phase))
            record.changed_at = self.clock.monotonic()
            record.confirmed = False
            self.writer.ensure(record.uid)
        while any(self.state.records.get(r.uid) is r and not r.confirmed for r in records):  # noqa: ASYNC110 - one look at all of them every half second
            await asyncio.sleep(0.5)
        secret = self.config.decision_key.secret_name
        await mark_adopted(self.transport, self._key_namespace(), secret)
        stamper.adopting = False
        log.info("decision key adopted: %d statuses stamped again", len(records))

    def _key_namespace(self) -> str:
        return self.config.decision_key.namespace or os.environ.get("POD_NAMESPACE", "default")

    def _in_background(self, coroutine: object) -> None:
        async def logged() -> None:
            try:
                await coroutine  # type: ignore[misc]
            except Exception:
                log.exception("background work failed; the next resync does it again")

        task = asyncio.create_task(logged())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- rebuild and resync ------------------------------------------------------------------

    async def rebuild(self) -> tuple[str, str, str]:
        """Rebuild the ledger; return the Node, Pod and Reservation lists' resourceVersions."""
        started = self.clock.monotonic()
        nodes, node_version = await list_all(self.transport, NODES)
        pods, pod_version = await list_all(self.transport, PODS, label_selector=OWNER_SELECTOR)
        reservations, version = await list_all(self.transport, RESERVATIONS)
        for node in nodes:
            self.on_node(None, node)
        self.owners.take(pods)  # no held reservation yet: nothing to read back
        self._restoring = []
        try:
            reservations.sort(key=lambda o: (o.get("metadata") or {}).get("creationTimestamp", ""))
            for obj in reservations:
                self.reconcile(obj)
            self._restore(self._restoring)
        finally:
            self._restoring = None
        for record in self.state.held_records():
            if record.pod and (record.namespace, record.pod) not in self.state.pods:
                self.owners.check_gone((record.namespace, record.pod))
        self.state.dirty_nodes.update(self.state.node_uids)
        log.info(
            "ledger rebuilt in %.2fs: %d nodes, %d owner pods, %d reservations held, %d undecided",
            self.clock.monotonic() - started,
            len(nodes),
            len(pods),
            len(self.state.holders),
            len(self.admission),
        )
        return node_version, pod_version, version

    def _restore(self, restoring: list[tuple[Entry, Record]]) -> None:
        result = self.state.ledger.restore([entry for entry, _ in restoring])
        for _, record in restoring:
            self.state.remember(record)
        for entry in result.over_committed:
            over = self.state.held_record(entry.id)
            if over is not None:
                self.events.record(
                    reservation_ref(over.namespace, over.name, over.uid),
                    str(Reason.OVER_COMMITTED),
                    f"admitted earlier, but node {entry.node} is now over its limit; "
                    "kept, not evicted",
                    "Warning",
                )

    async def _resync_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_period.total_seconds())
            for step in (self.resync, self.relist_nodes, self.owners.relist):
                try:
                    await step()
                except (ApiError, ApiUnavailableError) as error:  # done again next period
                    log.warning("resync step %s failed: %s", step.__name__, error)
                except Exception:
                    log.exception("resync step %s failed", step.__name__)

    async def resync(self) -> str:
        """Reconcile every Reservation from a full list: the safety net for a missed watch
        event, and the relist when the watch's version expired. Returns the list's version.

        A record whose object is not in the list is forgotten (released); records made
        after the list was requested are left alone: the list cannot know them yet.
        """
        started = self.clock.monotonic()
        reservations, version = await list_all(self.transport, RESERVATIONS)
        present = {(o.get("metadata") or {}).get("uid") for o in reservations}
        for uid, record in list(self.state.records.items()):
            if uid not in present and record.seen_at < started:
                log.warning("resync: %s is gone but was still remembered", record.entry_id)
                self.forget(uid)
        for obj in reservations:
            self.reconcile(obj, listed_at=started)
        await self.summaries.delete_orphans()
        return version

    async def relist_nodes(self) -> str:
        nodes, version = await list_all(self.transport, NODES)
        listed = set()
        for node in nodes:
            listed.add((node.get("metadata") or {}).get("name"))
            self.on_node(None, node)
        for name in [n for n in self.state.node_uids if n not in listed]:
            self.on_node(DELETED, {"metadata": {"name": name}})
        return version

    # -- reservations ------------------------------------------------------------------------

    def on_reservation(self, event_type: str | None, obj: JSON) -> None:
        if event_type == DELETED:
            uid = (obj.get("metadata") or {}).get("uid")
            if uid:
                self.forget(uid)
            return
        self.reconcile(obj)

    def forget(self, uid: str) -> None:
        """The object is gone: withdraw it, release what it held, drop its record."""
        self.admission.withdraw(uid)
        self._distrusted.discard(uid)
        if self.state.forget(uid) is not None:
            self.admission.wake()  # capacity came back

    def reconcile(self, obj: JSON, *, listed_at: float | None = None) -> None:
        """Bring one Reservation and the ledger into agreement (every path ends here)."""
        meta = obj.get("metadata") or {}
        uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if not (uid and namespace and name):
            return
        record = self.state.records.get(uid)
        if record is not None:
            self._reconcile_decided(record, obj, listed_at)
        elif uid in self.admission:
            self.admission.submit(obj)  # keep its newest body
        else:
            self._reconcile_undecided(obj, uid)

    def _reconcile_decided(self, record: Record, obj: JSON, listed_at: float | None) -> None:
        status = obj.get("status") or {}
        if record.decision.matches(status):
            if not record.confirmed:
                record.confirmed = True
                self._confirmed(record)
        elif listed_at is None or record.confirmed_at < listed_at:
            record.confirmed = False  # the object does not carry the truth: write it
            self.writer.ensure(record.uid)
        if record.held:
            self._observe_reservation(record, obj)

    def _reconcile_undecided(self, obj: JSON, uid: str) -> None:
        status = obj.get("status") or {}
        phase = status.get("phase")
        if phase in (Phase.ADMITTED, Phase.REJECTED):
            verdict = self.state.stamper.verdict(obj)
            decision = decision_of(status, self._decided_at(status))
            if verdict is Verdict.UNTRUSTED or decision is None:
                self._distrust(obj, uid)
                self.admission.submit(obj)
                return
            record = self._record_of(obj, decision)
            if verdict is Verdict.ADOPT:
                self._adopted.append(record)
            if phase == Phase.ADMITTED:
                self._restore_admitted(obj, record)
            else:
                self.state.remember(record)
        elif phase == Phase.RECLAIMED:
            decision = decision_of(status, self._decided_at(status))
            if decision is None:
                self.admission.submit(obj)
                return
            record = self._record_of(obj, decision)
            self.state.remember(record)
            self.reclaimer.schedule_deletion(record.namespace, record.name, uid, decision.at)
        else:
            self.admission.submit(obj)

    def _restore_admitted(self, obj: JSON, record: Record) -> None:
        """A trusted admission this process does not hold (after a start): hold it again,
        alive as of now — the grace of one full window since the operator began watching."""
        try:
            entry = reservation_entry(obj, self.clock.now())
        except ValueError as error:  # cannot happen for a spec we admitted
            log.error("%s admitted but unreadable (%s); decided again", record.entry_id, error)
            self.admission.submit(obj)
            return
        record.node, record.pod = entry.node, entry.owner.pod
        if record.pod:
            record.beats[POD] = self.state.pods.get((record.namespace, record.pod))
        if self._restoring is not None:
            self._restoring.append((entry, record))
        else:
            log.warning("%s: a trusted admission not held here; held again", record.entry_id)
            self._restore([(entry, record)])
            self.reclaimer.nearer_deadline()

    def _record_of(self, obj: JSON, decision: object) -> Record:
        meta = obj["metadata"]
        try:
            beat = heartbeat_value(obj)
        except ValueError:
            beat = None
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        return Record(
            uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
            node=str((spec or {}).get("node", "")),
            decision=decision,  # type: ignore[arg-type]
            confirmed=True,
            announced=True,
            beats={RESERVATION: beat},
            seen_at=self.clock.monotonic(),
            seen_monotonic=self.clock.monotonic(),
        )

    def _decided_at(self, status: JSON) -> datetime:
        for key in ("reclaimedAt", "admittedAt"):
            if (at := optional_time(status.get(key))) is not None:
                return at
        conditions = status.get("conditions") or []
        for condition in conditions if isinstance(conditions, list) else []:
            if not (isinstance(condition, dict) and condition.get("type") == "Admitted"):
                continue
            if (at := optional_time(condition.get("lastTransitionTime"))) is not None:
                return at
        return self.clock.now()

    def _distrust(self, obj: JSON, uid: str) -> None:
        if uid in self._distrusted:
            return
        self._distrusted.add(uid)
        meta, status = obj["metadata"], obj.get("status") or {}
        log.warning(
            "%s/%s: status %s not written by this operator; deciding it again",
            meta["namespace"],
            meta["name"],
            status.get("phase"),
        )
        self.events.record(
            reservation_ref(meta["namespace"], meta["name"], uid),
            "UntrustedStatus",
            f"status.phase {status.get('phase')} carries no valid decision stamp; "
            "ignored and decided again",
            "Warning",
        )

    def _confirmed(self, record: Record) -> None:
        """The object carries its decision: announce it once (Event, metrics)."""
        record.confirmed_at = self.clock.monotonic()
        if record.announced:
            return
        record.announced = True
        decision = record.decision
        if record.held:  # its owner learns of it only now: its stale clock starts now
            self.state.ledger.heartbeat(record.entry_id, self.clock.now())
        if decision.phase != Phase.RECLAIMED:
            latency = self.clock.monotonic() - record.seen_monotonic
            self.telemetry.decision_written(str(decision.phase), latency)
        self.events.record(
            reservation_ref(record.namespace, record.name, record.uid),
            str(decision.reason),
            decision.message,
            "Normal" if decision.phase == Phase.ADMITTED else "Warning",
        )
        if decision.phase == Phase.RECLAIMED:
            self.reclaimer.release_reclaimed(record)
            self.admission.wake()  # capacity came back
            self.reclaimer.schedule_deletion(record.namespace, record.name, record.uid, decision.at)

    # -- heartbeats --------------------------------------------------------------------------

    def _observe_reservation(self, record: Record, obj: JSON) -> None:
        try:
            value = heartbeat_value(obj)
        except ValueError as error:
            if record.bad_beat != str(error):
                record.bad_beat = str(error)
                self.events.record(
                    reservation_ref(record.namespace, record.name, record.uid),
                    "BadHeartbeat",
                    f"{error}; ignored",
                    "Warning",
                )
            return
        record.bad_beat = None
        self.observe(record, RESERVATION, value)

    def observe(self, record: Record, source: str, value: str | None) -> None:
        """A heartbeat source shows ``value``: a new one counts as a heartbeat, now."""
        if record.beats.get(source) == value:
            return
        record.beats[source] = value
        if value is None or not record.held:
            return
        now = self.clock.now()
        entry = self.state.ledger.heartbeat(record.entry_id, now)
        window = self.state.ledger.limits_for(entry.node).heartbeat_stale_window
        step = window * float(self.config.heartbeat_write_fraction)
        if record.written_beat is None or now - record.written_beat >= step:
            self.writer.write_heartbeat(record, now)

    # -- nodes -------------------------------------------------------------------------------

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
            self._in_background(self.summaries.delete(name))
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
        self.reclaimer.nearer_deadline()  # a shorter window brings deadlines nearer
