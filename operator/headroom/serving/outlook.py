"""The outlook asked from the webhook's thread of the ledger on the main loop, in time.

The webhook serves on a thread of its own (:mod:`headroom.serving.webhookthread`) so
that a busy main loop never makes the API server's reviews time out; the ledger may
only be read on the main loop. So each review hands one synchronous call to the main
loop (``call_soon_threadsafe``: no coroutine, no await inside) and waits for it at
most ``timeout``. A main loop busier than that (a rebuild under load, a replica
SIGSTOPped between two lines) gets no outlook: the review is answered at once
without one, and the create goes on; the decision is asynchronous anyway.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any

from headroom.api.outlook import Outlook, Verdict

log = logging.getLogger(__name__)


class LedgerOutlook:
    """``await outlook(reservation)`` on any loop: the warnings ``warnings`` gives on
    ``loop`` (the main loop), or a "no outlook" warning after ``timeout`` seconds."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        warnings: Callable[[dict[str, Any]], list[str]],
        *,
        timeout: float,
    ) -> None:
        self._loop, self._warnings, self._timeout = loop, warnings, timeout

    async def __call__(self, reservation: dict[str, Any]) -> list[str]:
        answer: concurrent.futures.Future[list[str]] = concurrent.futures.Future()

        def work_out() -> None:
            if not answer.set_running_or_notify_cancel():
                return  # the review gave up waiting: nothing to work out
            try:
                answer.set_result(self._warnings(reservation))
            except Exception as error:  # an outlook must never fail a create
                log.exception("the outlook of a Reservation could not be worked out")
                answer.set_result([Outlook(Verdict.UNKNOWN, f"not worked out: {error}").warning()])

        try:
            self._loop.call_soon_threadsafe(work_out)
        except RuntimeError:  # the main loop is closed: the process is stopping
            return [Outlook(Verdict.UNKNOWN, "this replica is stopping").warning()]
        try:
            return await asyncio.wait_for(asyncio.wrap_future(answer), self._timeout)
        except TimeoutError:
            detail = (
                f"the operator's ledger did not answer within {self._timeout:g}s; the "
                "decision is left to the operator: see the reservation's status"
            )
            return [Outlook(Verdict.UNKNOWN, detail).warning()]
