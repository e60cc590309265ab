"""The kubelet's endpoint: /healthz and /readyz, plain HTTP on their own port.

They say nothing that needs protecting (ok, standby, or why not ready) and the
kubelet cannot present a token, so they stay apart from /metrics
(:mod:`headroom.serving.scrape`), which needs one.

/healthz answers 503 with the reason as soon as a long-lived task has died (the
process then exits; the kubelet's liveness probe would restart it anyway).

/readyz is what the kubelet's readiness probe asks, and a pod's readiness decides
one thing: whether Services send it traffic. The only traffic a replica gets
through a Service is the admission webhook's (and scrapes), and the webhook's
answer needs no ledger. So with the webhook on, a replica is ready once its serving
certificate is loaded, leader, standby or still rebuilding its ledger: a new leader
must not leave the Service while it rebuilds, or opted-in pod creates are refused
during a takeover (failurePolicy Fail). The body says which: "ok" (the leader
decides), "standby" (waits for the Lease) or "rebuilding the ledger". Without the
webhook a rebuilding replica answers 503. A stopping replica answers 503 "stopping"
(it still answers reviews while it drains; see :mod:`headroom.serving.webhook`).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from headroom.control.controller import Controller


class ProbeServer:
    def __init__(
        self,
        controller: Controller,
        host: str,
        port: int,
        standby: Callable[[], bool] = lambda: False,
        webhook_ready: Callable[[], bool] | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        """``webhook_ready``: whether the webhook has its certificate; None: no webhook."""
        self._controller = controller
        self._host, self._port = host, port
        self._standby, self._webhook_ready = standby, webhook_ready
        self._stopping = stopping
        self._runner: web.AppRunner | None = None
        self.port = port

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        failure = self._controller.supervisor.failure
        if failure is not None:
            return web.Response(status=503, text=failure)
        return web.Response(text="ok")

    async def _readyz(self, _: web.Request) -> web.Response:
        if self._stopping():
            return web.Response(status=503, text="stopping")
        if self._webhook_ready is not None and not self._webhook_ready():
            return web.Response(status=503, text="no webhook serving certificate loaded yet")
        if self._controller.ready.is_set():
            return web.Response(text="ok")
        if self._standby():  # a healthy standby is ready: it may take over at any time
            return web.Response(text="standby")
        # Its webhook answers while it rebuilds: the Service must keep sending it reviews.
        status = 200 if self._webhook_ready is not None else 503
        return web.Response(status=status, text="rebuilding the ledger")
