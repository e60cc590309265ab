"""``async with claim_async("gpu-1", ram_mb=4096) as held:`` — the asyncio variant.

The official client blocks, so each API call runs in a worker thread
(``asyncio.to_thread``) through the very procedures the blocking API runs: the
event loop never waits on the network, and the two variants cannot drift. The
heartbeats are a task. A cancelled task (or an exception) unwinds the block and
the claim is released, like a SIGTERM does in the blocking API; no signal handler
is installed here, since the loop's owner decides what a signal means — e.g.
``loop.add_signal_handler(signal.SIGTERM, task.cancel)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType

from headroom.client import plans, procedure, whatif
from headroom.client.claim import HEARTBEAT_JOIN_SECONDS, Options, options
from headroom.client.connection import Connection, connect
from headroom.client.errors import ClaimLostError
from headroom.client.held import ClaimView, Held
from headroom.client.placement import AutoNode
from headroom.client.procedure import Report
from headroom.client.whatif import WhatIf

log = logging.getLogger("headroom.client")


class AsyncClaim(ClaimView):
    """Memory held on a node, heartbeated by a task until released."""

    def __init__(self, held: Held, on_lost: Callable[[ClaimLostError], None] | None) -> None:
        super().__init__(held)
        self._on_lost = on_lost
        self._beats: asyncio.Task[None] | None = None

    async def heartbeat(self) -> None:
        """One heartbeat now (the task's go on); ClaimLostError if it holds nothing."""
        lost = await asyncio.to_thread(procedure.beat, self._held)
        if lost is not None:
            self._held.lost = lost
            raise lost

    async def release(self) -> bool:
        """Stop heartbeating and delete the reservation (uid precondition); idempotent.

        True when it is gone; False when the API server could not be reached (the
        claim then ends with its stale window, as nobody heartbeats it).
        """
        if self._held.released:
            return True
        self._held.stopping = True
        if self._beats is not None:
            self._beats.cancel()
            await asyncio.wait([self._beats], timeout=HEARTBEAT_JOIN_SECONDS)
        gone = await asyncio.to_thread(
            procedure.delete_quietly, self._held.conn, self._held.name, self._held.uid
        )
        self._held.released = True
        return gone

    def _start(self) -> None:
        self._beats = asyncio.create_task(
            self._heartbeats(), name=f"headroom-heartbeat-{self._held.name}"
        )

    async def _heartbeats(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await plans.run_async(procedure.heartbeats(self._held, self._on_lost))
            except Exception:
                log.exception("heartbeats on %s stopped", self._held.reference)


class AsyncClaimContext:
    """What :func:`claim_async` returns: entering claims, leaving releases."""

    def __init__(self, opts: Options) -> None:
        self._opts = opts
        self._claim: AsyncClaim | None = None

    async def __aenter__(self) -> AsyncClaim:
        opts = self._opts
        conn = opts.connection
        if conn is None:
            conn = await asyncio.to_thread(connect)
        held = await plans.run_async(
            procedure.obtain(
                conn,
                opts.request,
                timeout=opts.timeout,
                selector=opts.selector,
                report=opts.report,
            )
        )
        try:
            await plans.run_async(procedure.pace(held, opts.heartbeat_interval))
            claim = AsyncClaim(held, opts.on_lost)
            claim._start()
        except BaseException:
            await asyncio.to_thread(procedure.delete_quietly, conn, held.name, held.uid)
            raise
        self._claim = claim
        return claim

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._claim is not None:
            await self._claim.release()


def claim_async(
    node: str | AutoNode,
    *,
    ram_mb: int = 0,
    vram_mb: int = 0,
    gpus: int | None = None,
    ttl: timedelta | str | None = None,
    wait: timedelta | str | None = None,
    timeout: timedelta | float | str | None = None,
    name: str | None = None,
    description: str | None = None,
    owner_pod: str | bool | None = None,
    selector: str | None = None,
    connection: Connection | None = None,
    heartbeat_interval: timedelta | float | None = None,
    on_lost: Callable[[ClaimLostError], None] | None = None,
    report: Report | None = None,
) -> AsyncClaimContext:
    """:func:`headroom.client.claim` for asyncio: the same arguments, checked here, before
    any call (no SIGTERM handler: cancel the task instead)."""
    opts = options(
        node,
        ram_mb=ram_mb,
        vram_mb=vram_mb,
        gpus=gpus,
        ttl=ttl,
        wait=wait,
        timeout=timeout,
        name=name,
        description=description,
        owner_pod=owner_pod,
        selector=selector,
        connection=connection,
        heartbeat_interval=heartbeat_interval,
        on_lost=on_lost,
        report=report,
    )
    return AsyncClaimContext(opts)


async def what_if_async(
    node: str | AutoNode,
    *,
    ram_mb: int = 0,
    vram_mb: int = 0,
    gpus: int | None = None,
    ttl: timedelta | str | None = None,
    wait: timedelta | str | None = None,
    name: str | None = None,
    description: str | None = None,
    owner_pod: str | bool | None = None,
    selector: str | None = None,
    connection: Connection | None = None,
) -> WhatIf:
    """:func:`headroom.client.what_if` for asyncio: the same arguments and answer, its calls
    in worker threads."""
    opts = options(
        node,
        ram_mb=ram_mb,
        vram_mb=vram_mb,
        gpus=gpus,
        ttl=ttl,
        wait=wait,
        timeout=None,
        name=name,
        description=description,
        owner_pod=owner_pod,
        selector=selector,
        connection=connection,
        heartbeat_interval=None,
        on_lost=None,
        report=None,
    )
    conn = opts.connection
    if conn is None:
        conn = await asyncio.to_thread(connect)
    return await plans.run_async(whatif.foresee(conn, opts.request, opts.selector))
