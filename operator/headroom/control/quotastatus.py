"""HeadroomQuota status: what each quota's namespaces hold, wait for and have left.

Written like NodeHeadrooms (``headroom.control.summaries``): at most once per
``summaryInterval``, only when the figures changed, only by the decider, and
each quota on its own, so that one that cannot be written never holds back the
others. The figures come from the ledger at flush time, so they never disagree
with the decisions; ``updatedAt`` says how fresh they are.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta

from headroom.api.paths import headroom_quota_path
from headroom.control.quotafeed import QuotaFeed
from headroom.control.state import State
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport
from headroom.objects.quotas import quota_status, unusable_status

log = logging.getLogger(__name__)


class QuotaStatuses:
    def __init__(
        self,
        state: State,
        feed: QuotaFeed,
        transport: Transport,
        clock: Clock,
        interval: timedelta,
        *,
        may_act: Callable[[], bool] = lambda: True,
        time_left: Callable[[], float] = lambda: 30.0,
    ) -> None:
        self._state, self._feed, self._transport, self._clock = state, feed, transport, clock
        self._interval = interval.total_seconds()
        self._may_act, self._time_left = may_act, time_left
        #: quota -> (its uid, the status last written to it, without updatedAt): a quota
        #: deleted and created again under its name is another object, written afresh.
        self._written: dict[str, tuple[str, JSON]] = {}

    async def run(self) -> None:
        """Flush forever (a supervised task)."""
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.flush()
            except Exception:
                log.exception("quota status flush failed; retrying next interval")

    def statuses(self) -> dict[str, JSON]:
        """Every quota's status as the ledger has it now."""
        state, now = self._state, self._clock.now()
        waiting = state.ledger.waiting.by_namespace()
        statuses: dict[str, JSON] = {}
        for name, meta in sorted(self._feed.quota_objects.items()):
            generation = meta.get("generation")
            generation = generation if isinstance(generation, int) else None
            try:
                if name in self._feed.unusable:
                    status = unusable_status(self._feed.unusable[name], generation, now)
                else:
                    status = quota_status(
                        state.ledger, name, waiting, generation=generation, now=now
                    )
            except Exception:  # one quota's figures must not stop the others'
                log.exception("HeadroomQuota %s: status not built", name)
                continue
            statuses[name] = status
        return statuses

    async def flush(self) -> None:
        if not self._may_act():
            return
        for name in [n for n in self._written if n not in self._feed.quota_objects]:
            del self._written[name]
        writes = []
        for name, status in self.statuses().items():
            uid = str(self._feed.quota_objects.get(name, {}).get("uid") or "")
            figures = {k: v for k, v in status.items() if k != "updatedAt"}
            if self._written.get(name) != (uid, figures):
                writes.append(self._write(name, uid, status, figures))
        await asyncio.gather(*writes)

    async def _write(self, name: str, uid: str, status: JSON, figures: JSON) -> None:
        patch: list[JSON] = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/status", "value": status},
        ]
        try:
            async with asyncio.timeout(min(self._time_left(), 30.0)):
                await self._transport.json_patch(headroom_quota_path(name, "status"), patch)
        except (ApiError, ApiUnavailableError, TimeoutError) as error:
            log.warning("HeadroomQuota %s status not written (%s); next interval", name, error)
            return
        self._written[name] = (uid, figures)
