"""kube-scheduler's extender endpoint: POST /filter, /prioritize and /bind, served by the leader.

The wire format is ``k8s.io/kube-scheduler/extender/v1`` (Go structs without JSON
tags: the field names as they are, ``Pod``, ``NodeNames``, ``FailedAndUnresolvableNodes``,
``Host``, ``Score``). The scheduler is configured ``nodeCacheCapable: true``, so it
sends node names, not Node objects.

What the calls do is :class:`headroom.control.schedulerextender.SchedulerExtender`'s;
this module carries them.

Only a leader whose ledger is rebuilt answers; any other replica answers 503, which
kube-scheduler treats as an error and retries with backoff: the pod is never bound
on an answer that did not come from the ledger. The 503 closes its connection, so the
retry opens a new one, which the Service may send to another replica (kube-proxy
keeps a connection on the endpoint it chose): a scheduler never stays stuck on a
standby. aiohttp sets ``TCP_NODELAY`` on its
connections: without it every answer waits for the scheduler's delayed ACK (95 ms
instead of 10 ms per pod in the design's spike).

With ``tls`` it serves HTTPS with the webhook's certificate and completes a handshake
only with a client certificate its CA issued for ``clientAuth``: the scheduler's
(:mod:`headroom.objects.clientcerts`). ``/bind`` binds a claim pod to any node the
ledger has room on, so no other caller in the cluster may reach it. Until the first
certificate is loaded every handshake fails, and the scheduler retries.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from aiohttp import web

from headroom.control.binder import BindCall
from headroom.control.controller import Controller
from headroom.control.schedulerextender import SchedulerExtender
from headroom.objects.certificates import Bundle
from headroom.serving.tls import SwappableContext, context_from_pem

log = logging.getLogger(__name__)


class ExtenderServer:
    def __init__(
        self,
        controller: Controller,
        host: str,
        port: int,
        *,
        deciding: Callable[[], bool],
        binpack: bool = False,
        tls: bool = False,
    ) -> None:
        """``deciding``: whether this replica leads with its ledger rebuilt. ``tls``:
        HTTPS to the scheduler's client certificate only, from :meth:`load` on."""
        self._host, self._port, self._deciding = host, port, deciding
        self._extender = SchedulerExtender(controller, binpack=binpack)
        self._tls = SwappableContext(require_clients=True) if tls else None
        self._directory: str | None = None
        self._certificate: bytes | None = None
        self._runner: web.AppRunner | None = None
        self.port = port

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/filter", self._filter)
        app.router.add_post("/prioritize", self._prioritize)
        app.router.add_post("/bind", self._bind)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        context = None
        if self._tls is not None:
            self._directory = await asyncio.to_thread(tempfile.mkdtemp, prefix="headroom-ext-")
            context = self._tls.listening
        site = web.TCPSite(self._runner, self._host, self._port, ssl_context=context)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    @property
    def scheme(self) -> str:
        return "http" if self._tls is None else "https"

    async def load(self, bundle: Bundle) -> None:
        """Serve the bundle's pair to clients its CAs trust, from the next handshake on
        (a no-op for the pair served already, or without ``tls``)."""
        if self._tls is None or (bundle.cert + bundle.trust) == self._certificate:
            return
        if self._directory is None:
            raise RuntimeError("load() before start()")
        context = await asyncio.to_thread(
            context_from_pem, self._directory, bundle.cert, bundle.key, client_cas=bundle.trust
        )
        self._tls.set(context)
        self._certificate = bundle.cert + bundle.trust
        log.info("extender serving certificate and client CAs loaded")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self._extender.stop()
        if self._directory is not None:
            await asyncio.to_thread(shutil.rmtree, self._directory, True)

    async def _args(self, request: web.Request) -> tuple[dict[str, Any], list[str]] | None:
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("Pod"), dict):
            return None
        names = body.get("NodeNames")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return None
        return body["Pod"], names

    def _not_deciding(self) -> web.Response | None:
        if self._deciding():
            return None
        answer = web.Response(status=503, text="not the leader, or its ledger is rebuilding")
        answer.force_close()
        return answer

    async def _filter(self, request: web.Request) -> web.Response:
        if (refused := self._not_deciding()) is not None:
            return refused
        args = await self._args(request)
        if args is None:
            return web.json_response({"Error": "expected ExtenderArgs with Pod and NodeNames"})
        found = self._extender.filter(*args)
        return web.json_response(
            {"NodeNames": found.nodes, "FailedAndUnresolvableNodes": found.refused, "Error": ""}
        )

    async def _prioritize(self, request: web.Request) -> web.Response:
        if (refused := self._not_deciding()) is not None:
            return refused
        args = await self._args(request)
        if args is None:
            return web.json_response([])
        scores = self._extender.prioritize(*args)
        return web.json_response([{"Host": n, "Score": s} for n, s in scores.items()])

    async def _bind(self, request: web.Request) -> web.Response:
        if (refused := self._not_deciding()) is not None:
            return refused
        body = await request.json()
        fields = ("PodNamespace", "PodName", "PodUID", "Node")
        if not isinstance(body, dict) or not all(isinstance(body.get(f), str) for f in fields):
            return web.json_response({"Error": f"expected ExtenderBindingArgs with {fields}"})
        call = BindCall(body["PodNamespace"], body["PodName"], body["PodUID"], body["Node"])
        return web.json_response({"Error": await self._extender.bind(call)})
