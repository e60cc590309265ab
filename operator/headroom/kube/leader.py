"""Leader election on a ``coordination.k8s.io/v1`` Lease, for hot standby.

kopf's peering only pauses operators that see each other; it does not give
exclusivity, so exactly-one-decider comes from a Lease, the way client-go's
leaderelection does it:

- a candidate takes the Lease when it is free, or when its record has not
  changed for ``lease_duration`` as measured on *our* clock since we last saw it
  change (no trust in other machines' clocks);
- every write is an update with the last seen ``resourceVersion``, so two
  candidates can never both win the same round (one gets 409 Conflict);
- the leader renews every ``retry_period``; if it cannot renew for
  ``renew_deadline`` (< lease_duration) it gives up *before* anyone else can
  take over, and the process exits so that no decision is taken without the
  Lease. The standby then rebuilds its ledger from the API before deciding.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import aiohttp

from headroom.kube.client import JSON, ApiError, KubeClient, resource_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str
    identity: str
    lease_duration: timedelta
    renew_deadline: timedelta
    retry_period: timedelta


def _micro_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, client: KubeClient, settings: LeaseSettings) -> None:
        self._client, self._settings = client, settings
        self._path = resource_path("coordination.k8s.io", "v1", "leases", settings.namespace)
        self._observed: JSON | None = None
        self._observed_at = 0.0
        self.is_leader = False

    async def acquire(self) -> None:
        """Return once this process holds the Lease."""
        period = self._settings.retry_period.total_seconds()
        while not await self._try():  # noqa: ASYNC110 - polling the API is the protocol
            await asyncio.sleep(period)
        log.info("became leader: lease %s/%s", self._settings.namespace, self._settings.name)

    async def hold(self, on_lost: Callable[[], None]) -> None:
        """Renew forever; call ``on_lost`` if renewing fails for ``renew_deadline``."""
        period = self._settings.retry_period.total_seconds()
        deadline = self._settings.renew_deadline.total_seconds()
        last_renewed = time.monotonic()
        while True:
            await asyncio.sleep(period)
            if await self._try():
                last_renewed = time.monotonic()
            elif not self.is_leader or time.monotonic() - last_renewed > deadline:
                self.is_leader = False
                log.error("lost lease %s/%s", self._settings.namespace, self._settings.name)
                on_lost()
                return

    async def _try(self) -> bool:
        """One round: take or renew the Lease if we may. True if we hold it after."""
        s, now = self._settings, datetime.now(UTC)
        name_path = f"{self._path}/{s.name}"
        try:
            current = await self._client.get(name_path)
        except ApiError as error:
            if not error.not_found:
                return False
            return await self._write("POST", self._path, self._record(None, now))
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False
        if current != self._observed:
            self._observed, self._observed_at = current, time.monotonic()
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity")
        expired = (time.monotonic() - self._observed_at) > float(
            spec.get("leaseDurationSeconds") or s.lease_duration.total_seconds()
        )
        if holder and holder != s.identity and not expired:
            self.is_leader = False
            return False
        return await self._write("PUT", name_path, self._record(current, now))

    def _record(self, current: JSON | None, now: datetime) -> JSON:
        s = self._settings
        spec = dict((current or {}).get("spec") or {})
        taking_over = spec.get("holderIdentity") != s.identity
        if taking_over:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if current else 0
            )
        spec.update(
            {
                "holderIdentity": s.identity,
                "leaseDurationSeconds": int(s.lease_duration.total_seconds()),
                "renewTime": _micro_time(now),
            }
        )
        metadata: JSON = {"name": s.name, "namespace": s.namespace}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    async def _write(self, method: str, path: str, body: JSON) -> bool:
        try:
            written = await self._client.request(method, path, body=body)
        except (ApiError, aiohttp.ClientError, TimeoutError, OSError) as error:
            log.debug("lease write lost: %s", error)  # 409: someone else won this round
            return False
        self._observed, self._observed_at = written, time.monotonic()
        self.is_leader = True
        return True
