"""The mutating admission webhook's HTTPS server: AdmissionReview in, AdmissionReview out.

Every replica serves it, leader, standby or rebuilding: the answer depends on the
pod alone (:mod:`headroom.objects.gating`), never on the ledger, so the Service may
send a review to any replica that has its certificate (what its readiness says).

A stopping replica keeps answering while it drains (:meth:`WebhookServer.drain`):
the API server resolves the Service to an endpoint only when it dials, and keeps
its HTTP/1.1 connections open between reviews, so reviews still arrive after the
pod's endpoint went not-ready. Each answer during the drain closes its connection,
so the API server's next review dials again and reaches a replica that stays.

The certificate can change under a running server (renewal, or another replica
rotated the shared Secret). New TLS handshakes get the new one without a restart
or a dropped listener (:class:`headroom.serving.tls.SwappableContext`); the key
is written to disk only while it is loaded (:func:`headroom.serving.tls.context_from_pem`).

Nothing blocks the event loop: building a context (file writes, key parsing) and
decoding a large body run in a thread.

Each review answered is told to ``on_review(result, seconds)`` (the
``headroom_webhook_reviews_total`` and ``headroom_webhook_review_seconds`` metrics):
``allowed`` unchanged, ``patched`` (gated), ``denied``, or ``error`` when the body
was not a readable AdmissionReview (a 400).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from headroom.api.outlook import Outlook, Verdict
from headroom.control.outlook import NOT_DECIDING, OutlookAnswer
from headroom.objects.gating import ReviewError, review_response
from headroom.objects.outlookreview import (
    MAX_WARNING,
    allowed_with,
    refused_with,
    reservation_under_review,
)
from headroom.serving.forward import FORWARDED_HEADER, ReviewForwarder
from headroom.serving.tls import SwappableContext, context_from_pem

log = logging.getLogger(__name__)

PATH = "/mutate-pods"
#: The validating webhook on Reservation creates: allowed, with the ledger's outlook.
OUTLOOK_PATH = "/validate-reservations"
#: A Pod can be up to ~1.5 MiB in etcd; a review carries it once on CREATE.
MAX_BODY = 4 << 20
#: Bodies larger than this are decoded in a thread.
_LARGE_BODY = 64 << 10


class WebhookServer:
    """Serves ``/mutate-pods`` over HTTPS once :meth:`load` gave it a certificate."""

    def __init__(
        self,
        host: str,
        port: int,
        on_review: Callable[[str, float], None] = lambda result, seconds: None,
        *,
        scheduler: str | None = None,
        outlook: Callable[..., Awaitable[OutlookAnswer]] | None = None,
        pod_outlook: Callable[..., Awaitable[OutlookAnswer]] | None = None,
        forwarder: ReviewForwarder | None = None,
    ) -> None:
        """``scheduler``: the schedulerName opted-in pods get instead of the gate (placement
        by kube-scheduler); None: they are gated. ``outlook``: the warnings for creating a
        Reservation (:class:`headroom.serving.outlook.LedgerOutlook`); None: no
        ``/validate-reservations``. ``forwarder``: how a replica that does not lead hands
        those reviews to the leader (:mod:`headroom.serving.forward`)."""
        self._host, self.port = host, port
        self._scheduler = scheduler
        self._outlook, self._forwarder = outlook, forwarder
        self._pod_outlook = pod_outlook  # an opted-in pod's claim: the same, as warnings
        self._on_review = on_review
        self._runner: web.AppRunner | None = None
        self._tls = SwappableContext()
        self._directory: str | None = None
        self.certificate: bytes | None = None
        self.draining = False

    @property
    def ready(self) -> bool:
        """A serving certificate is loaded: new handshakes can complete."""
        return self._tls.current is not None

    async def start(self) -> None:
        self._directory = await asyncio.to_thread(tempfile.mkdtemp, prefix="headroom-webhook-")
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(PATH, self._mutate)
        if self._outlook is not None:
            app.router.add_post(OUTLOOK_PATH, self._validate_reservation)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self.port, ssl_context=self._tls.listening)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("admission webhook on https://%s:%d%s", self._host, self.port, PATH)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._forwarder is not None:
            await self._forwarder.close()
        if self._directory is not None:
            await asyncio.to_thread(shutil.rmtree, self._directory, True)

    def drain(self) -> None:
        """From now on every answer closes its connection (``Connection: close``)."""
        self.draining = True

    async def load(self, cert_pem: bytes, key_pem: bytes, trust_pem: bytes | None = None) -> None:
        """Serve this pair from the next handshake on (a no-op if it is already served);
        ``trust_pem``: the CAs a forwarded review's leader is verified against."""
        if trust_pem is not None and self._forwarder is not None:
            self._forwarder.trust(trust_pem)
        if cert_pem == self.certificate:
            return
        if self._directory is None:
            raise RuntimeError("load() before start()")
        self._tls.set(await asyncio.to_thread(context_from_pem, self._directory, cert_pem, key_pem))
        self.certificate = cert_pem
        log.info("webhook serving certificate loaded")

    async def _mutate(self, request: web.Request) -> web.Response:
        body = await request.read()
        started = time.perf_counter()
        try:
            if len(body) > _LARGE_BODY:
                review, answer = await asyncio.to_thread(_answer, body, self._scheduler)
            else:
                review, answer = _answer(body, self._scheduler)
        except (ValueError, RecursionError) as error:  # ReviewError is a ValueError
            self._on_review("error", time.perf_counter() - started)
            response = web.Response(status=400, text=f"not an AdmissionReview: {error}"[:1000])
        else:
            if self._pod_outlook is not None and result_of(answer) == "patched":
                answer = await self._with_pod_outlook(request, body, review, answer)
            self._on_review(result_of(answer), time.perf_counter() - started)
            response = web.json_response(answer)
        if self.draining:
            response.force_close()
        return response

    async def _validate_reservation(self, request: web.Request) -> web.Response:
        """Allowed, always, with the outlook as warnings: the decision stays asynchronous."""
        assert self._outlook is not None
        body = await request.read()
        started = time.perf_counter()
        try:
            decoded = (
                await asyncio.to_thread(json.loads, body)
                if len(body) > _LARGE_BODY
                else json.loads(body)
            )
            review = reservation_under_review(decoded)
        except (ValueError, RecursionError) as error:
            self._on_review("error", time.perf_counter() - started)
            response = web.Response(status=400, text=f"not an AdmissionReview: {error}"[:1000])
        else:
            uid, reservation = review.uid, review.reservation
            answer: dict[str, Any] | None = allowed_with(uid, [])
            if reservation is not None:
                answer = await self._from_leader(request, uid, body)
            if answer is None and reservation is not None:
                said = await self._outlook(reservation, dry_run=review.dry_run)
                answer = (
                    allowed_with(uid, said.warnings)
                    if said.refusal is None
                    else refused_with(uid, said.refusal, said.warnings)
                )
            assert answer is not None
            self._on_review(result_of(answer), time.perf_counter() - started)
            response = web.json_response(answer)
        if self.draining:
            response.force_close()
        return response

    async def _with_pod_outlook(
        self, request: web.Request, body: bytes, review: Any, answer: dict[str, Any]
    ) -> dict[str, Any]:
        """An opted-in pod's gating answer, with the outlook of its claim as warnings: the
        leader's answer when this replica does not lead (the same patch: the gate depends
        on the pod alone), else this one's, with the outlook worked out here."""
        assert self._pod_outlook is not None
        response = answer["response"]
        forwarded = await self._from_leader(request, response["uid"], body, PATH)
        if forwarded is not None:
            if result_of(forwarded) == "patched":
                return forwarded
            said = OutlookAnswer(forwarded["response"].get("warnings") or [])
        else:
            said = await self._pod_outlook(review["request"]["object"], dry_run=False)
        if said.warnings:
            response["warnings"] = [text[:MAX_WARNING] for text in said.warnings]
        return answer

    async def _from_leader(
        self, request: web.Request, uid: str, body: bytes, path: str = OUTLOOK_PATH
    ) -> dict[str, Any] | None:
        """The leader's answer to this review, when this replica does not lead and the
        review was not forwarded already; None: answer it here. A leader that gives no
        answer in time leaves an allowing one with no outlook: the forward had the whole
        budget, and this replica has no outlook of its own to give."""
        if self._forwarder is None or FORWARDED_HEADER in request.headers:
            return None
        url = self._forwarder.target()
        if url is None:
            return None
        answer = await self._forwarder.forward(url, path, body)
        response = (answer or {}).get("response")
        if answer is None or not isinstance(response, dict) or response.get("uid") != uid:
            detail = f"the leader ({url}) gave no answer in time; {NOT_DECIDING}"
            return allowed_with(uid, [Outlook(Verdict.UNKNOWN, detail).warning()])
        return answer


def result_of(answer: dict[str, Any]) -> str:
    """allowed, patched or denied: what an AdmissionReview answer says."""
    response = answer.get("response") or {}
    if not response.get("allowed"):
        return "denied"
    return "patched" if response.get("patch") else "allowed"


def _answer(body: bytes, scheduler: str | None) -> tuple[Any, dict[str, Any]]:
    try:
        review = json.loads(body)
    except ValueError as error:
        raise ReviewError(f"body is not JSON: {error}") from None
    return review, review_response(review, scheduler=scheduler)
