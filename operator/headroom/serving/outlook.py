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
from headroom.control.outlook import OutlookAnswer

log = logging.getLogger(__name__)


Answerer = Callable[..., OutlookAnswer]  # (reservation, *, dry_run) -> its answer


def _without(detail: str) -> OutlookAnswer:
    return OutlookAnswer([Outlook(Verdict.UNKNOWN, detail).warning()])


class LedgerOutlook:
    """``await outlook(reservation, dry_run=...)`` on any loop: the answer ``answer``
    gives on ``loop`` (the main loop), or, after ``timeout`` seconds, an allowing one
    with a "no outlook" warning."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, answer: Answerer, *, timeout: float
    ) -> None:
        self._loop, self._answer, self._timeout = loop, answer, timeout

    async def __call__(self, reservation: dict[str, Any], *, dry_run: bool) -> OutlookAnswer:
        answer: concurrent.futures.Future[OutlookAnswer] = concurrent.futures.Future()

        def work_out() -> None:
            if not answer.set_running_or_notify_cancel():
                return  # the review gave up waiting: nothing to work out
            try:
                answer.set_result(self._answer(reservation, dry_run=dry_run))
            except Exception as error:  # an outlook must never fail a create
                log.exception("the outlook of a Reservation could not be worked out")
                answer.set_result(_without(f"not worked out: {error}"))

        try:
            self._loop.call_soon_threadsafe(work_out)
        except RuntimeError:  # the main loop is closed: the process is stopping
            return _without("this replica is stopping")
        try:
            return await asyncio.wait_for(asyncio.wrap_future(answer), self._timeout)
        except TimeoutError:
            detail = (
                f"the operator's ledger did not answer within {self._timeout:g}s; the "
                "decision is left to the operator: see the reservation's status"
            )
            return _without(detail)
