"""Leader election on a ``coordination.k8s.io/v1`` Lease, for hot standby.

kopf's peering only pauses operators that see each other; it does not give
exclusivity, so exactly-one-decider comes from a Lease, the way client-go's
leaderelection does it:

- a candidate takes the Lease when it is free, or when its record has not
  changed for ``lease_duration`` as measured on *our* clock since we last saw it
  change (no trust in other machines' clocks);
- every write is a PUT with the last seen ``resourceVersion``, so two candidates
  can never both win the same round (one gets 409 Conflict);
- the leader renews every ``retry_period``; each attempt is bounded by what is
  left of ``renew_deadline`` (< lease_duration) since the last renewal began.

Why leadership cannot overlap: a renewal that *began* at monotonic time t makes
this process the leader until t + renew_deadline, by its own clock
(:meth:`LeaderElector.may_act`). A standby can take over no earlier than
lease_duration after it saw that renewal, which is after t + lease_duration. The
decider asks ``may_act()`` before every decision and the status writer before
every attempt, so a leader that stalls (SIGSTOP, a full event loop, a slow API
server) writes nothing once its time is up — and the difference lease_duration −
renew_deadline is the margin for a request already on the wire. When it cannot
renew in time it calls ``on_lost`` and the process exits; the Deployment
restarts it as a standby. A clean shutdown releases the Lease: it clears the
holder and says the lease lasts only lease_duration − renew_deadline more, the
margin a write already on the wire needs, so the standby takes over after that
instead of after the whole lease_duration.

Durations are written rounded *up* to whole seconds (the Lease field is an
integer), and a standby waits at least its own lease_duration on a held Lease,
whatever the record says. A Lease that disappears (deleted by someone) is taken
only after it has been absent for lease_duration, as a held one would expire.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from headroom.kube.clock import Clock, SystemClock
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport, resource_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str
    identity: str
    lease_duration: timedelta
    renew_deadline: timedelta
    retry_period: timedelta
    #: Written on the Lease with every renewal: what the other replicas may read of the
    #: leader (where its webhook answers, for reviews they forward).
    annotations: Mapping[str, str] = field(default_factory=dict)


def _micro_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self, transport: Transport, settings: LeaseSettings, clock: Clock | None = None
    ) -> None:
        self._client, self._settings = transport, settings
        self._clock = clock or SystemClock()
        self._path = resource_path("coordination.k8s.io", "v1", "leases", settings.namespace)
        self._observed: JSON | None = None
        self._observed_at = 0.0
        self._absent_since: float | None = None  # a Lease we saw, gone: since when
        self._valid_until = float("-inf")  # monotonic; leader until then
        self.is_leader = False

    def may_act(self) -> bool:
        """True while this process holds the Lease by its own monotonic clock."""
        return self.is_leader and self._clock.monotonic() < self._valid_until

    def time_left(self) -> float:
        """Seconds this process may still act (0 when it may not): the bound of a write."""
        return max(self._valid_until - self._clock.monotonic(), 0.0) if self.is_leader else 0.0

    def leader_annotation(self, key: str) -> str | None:
        """An annotation another holder wrote on the Lease, as last read (every retry
        period); None while this process leads, or when no one holds it."""
        observed = self._observed
        if observed is None or self.is_leader:
            return None
        spec = observed.get("spec") or {}
        holder = spec.get("holderIdentity")
        if not holder or holder == self._settings.identity:
            return None
        held_for = float(spec.get("leaseDurationSeconds") or 0)
        if self._clock.monotonic() - self._observed_at > held_for:
            return None  # not renewed for a whole lease: its holder is gone or stuck
        value = ((observed.get("metadata") or {}).get("annotations") or {}).get(key)
        return value if isinstance(value, str) else None

    async def acquire(self) -> None:
        """Return once this process holds the Lease."""
        period = self._settings.retry_period.total_seconds()
        while not await self._attempt(bounded_by=period):  # noqa: ASYNC110 - polling is the protocol
            await asyncio.sleep(period)
        log.info("became leader: lease %s/%s", self._settings.namespace, self._settings.name)

    async def hold(self, on_lost: Callable[[], None]) -> None:
        """Renew forever; call ``on_lost`` once a renewal cannot be done in time."""
        period = self._settings.retry_period.total_seconds()
        while True:
            await asyncio.sleep(period)
            remaining = self._valid_until - self._clock.monotonic()
            if remaining <= 0 or not await self._attempt(bounded_by=remaining):
                if self.may_act():
                    continue  # this round failed, but the last renewal still holds
                self.is_leader = False
                log.error("lost lease %s/%s", self._settings.namespace, self._settings.name)
                on_lost()
                return

    async def release(self) -> None:
        """On a clean shutdown: let a standby take over after only the safety margin."""
        if not self.may_act() or self._observed is None:
            return
        self.is_leader = False
        s = self._settings
        margin = math.ceil((s.lease_duration - s.renew_deadline).total_seconds())
        try:
            released = await asyncio.wait_for(self._hand_over(self._observed, margin), 2.0)
        except (ApiError, ApiUnavailableError, TimeoutError) as error:
            log.warning("lease not released (%s); the standby waits it out", error)
            return
        if released:
            log.info("released lease %s/%s (free in %ds)", s.namespace, s.name, margin)

    async def _hand_over(self, observed: JSON, margin: int) -> bool:
        """Clear the holder. A renewal cut off by the stop may have landed after we last
        saw the Lease (seen on a rolling update: the release then failed 409 and the standby
        waited out the whole lease): on a conflict, read it again and release that, if it
        is still ours."""
        path = f"{self._path}/{self._settings.name}"
        for _ in range(2):
            spec = dict(observed.get("spec") or {})
            if spec.get("holderIdentity") != self._settings.identity:
                return False  # no longer ours: nothing to hand over
            spec.update(
                holderIdentity="",
                leaseDurationSeconds=max(margin, 1),
                renewTime=_micro_time(self._clock.now()),
            )
            try:
                await self._client.replace(path, {**observed, "spec": spec})
                return True
            except ApiError as error:
                if not error.conflict:
                    raise
            observed = await self._client.get(path)
        return False

    async def _attempt(self, bounded_by: float) -> bool:
        """One round, given at most ``bounded_by`` seconds; True if we hold the Lease after."""
        started = self._clock.monotonic()
        try:
            won = await asyncio.wait_for(self._try(), timeout=max(bounded_by, 0.001))
        except TimeoutError:
            log.warning("lease round took longer than %.2fs", bounded_by)
            return False
        if won:
            self._valid_until = started + self._settings.renew_deadline.total_seconds()
        return won

    async def _try(self) -> bool:
        s, now = self._settings, self._clock.now()
        name_path = f"{self._path}/{s.name}"
        try:
            current = await self._client.get(name_path)
        except ApiError as error:
            if not error.not_found:
                return False
            if not self._absent_long_enough():
                return False
            return await self._write(self._path, self._record(None, now), create=True)
        except ApiUnavailableError:
            return False
        self._absent_since = None
        if current != self._observed:
            self._observed, self._observed_at = current, self._clock.monotonic()
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity")
        recorded = float(spec.get("leaseDurationSeconds") or 0)
        # A released Lease (no holder) says how long the margin is; a held one lasts at
        # least our own lease_duration, whatever a rounded record says.
        duration = recorded if not holder else max(recorded, s.lease_duration.total_seconds())
        expired = (self._clock.monotonic() - self._observed_at) > duration
        if holder != s.identity and not expired:
            self.is_leader = False
            return False
        return await self._write(name_path, self._record(current, now), create=False)

    def _absent_long_enough(self) -> bool:
        """A Lease never seen may be created at once; one that vanished, after a lease."""
        if self._observed is None:
            return True
        now = self._clock.monotonic()
        if self._absent_since is None:
            self._absent_since = now
        return now - self._absent_since > self._settings.lease_duration.total_seconds()

    def _record(self, current: JSON | None, now: datetime) -> JSON:
        s = self._settings
        spec = dict((current or {}).get("spec") or {})
        if spec.get("holderIdentity") != s.identity:  # taking over
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if current else 0
            )
        spec.update(
            {
                "holderIdentity": s.identity,
                "leaseDurationSeconds": math.ceil(s.lease_duration.total_seconds()),
                "renewTime": _micro_time(now),
            }
        )
        metadata: JSON = {"name": s.name, "namespace": s.namespace}
        if s.annotations:
            metadata["annotations"] = dict(s.annotations)
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    async def _write(self, path: str, body: JSON, *, create: bool) -> bool:
        try:
            if create:
                written = await self._client.create(path, body)
            else:
                written = await self._client.replace(path, body)
        except (ApiError, ApiUnavailableError) as error:
            log.debug("lease write lost: %s", error)  # 409: someone else won this round
            return False
        self._observed, self._observed_at = written, self._clock.monotonic()
        self.is_leader = True
        return True
