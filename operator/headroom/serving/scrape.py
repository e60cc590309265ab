"""The /metrics endpoint: HTTPS with a bearer token the API server vouches for.

By default (``metricsSecure: true``) a scrape needs TLS and a token, checked as
controller-runtime's ``WithAuthenticationAndAuthorization`` does (see
:mod:`headroom.serving.access`): 401 without a token or with one the API server
does not know, 403 when its user may not ``get`` ``/metrics``, 200 with the
metrics otherwise. Reservation names, nodes and namespaces show in the metrics
and their events; an open port would give them to anyone who can reach the pod.

The certificate is, by default, self-signed and made in memory at start (no
cert-manager needed; Prometheus skips verification, as for controller-runtime's
default). Given ``metricsCertDir`` (a mounted Secret with ``tls.crt`` and
``tls.key``), the pair there is served and read again every minute, so a renewed
Secret is served without a restart.

``metricsSecure: false`` serves plain HTTP to anyone: an explicit opt-in (local
runs, the test harness).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from headroom.objects.access import AccessVerdict
from headroom.objects.certificates import CertificatePolicy, fresh
from headroom.serving.access import AccessReviewer, ReviewUnavailableError
from headroom.serving.metrics import OperatorMetrics
from headroom.serving.tls import SwappableContext, context_from_pem

log = logging.getLogger(__name__)

PATH = "/metrics"
CERT_FILE, KEY_FILE = "tls.crt", "tls.key"
#: The self-signed certificate's lifetime; a new one is made at every start.
SELF_SIGNED_VALIDITY = timedelta(days=365)
#: How often a mounted certificate is read again.
RELOAD_PERIOD = 60.0


def self_signed(names: tuple[str, ...], now: datetime) -> tuple[bytes, bytes]:
    """A serving certificate for ``names`` (with the CA that signed it, as its chain)
    and its key: (chain PEM, key PEM)."""
    bundle = fresh(CertificatePolicy(names, SELF_SIGNED_VALIDITY, SELF_SIGNED_VALIDITY), now)
    return bundle.cert + bundle.ca_cert, bundle.key


class MetricsServer:
    """Serves ``/metrics``: over HTTPS to authorized scrapes, or as plain HTTP when
    ``reviewer`` is None."""

    def __init__(
        self,
        metrics: OperatorMetrics,
        host: str,
        port: int,
        *,
        reviewer: AccessReviewer | None = None,
        names: tuple[str, ...] = ("localhost", "127.0.0.1"),
        cert_dir: str | None = None,
    ) -> None:
        self._registry = metrics.registry
        self._host, self.port = host, port
        self._reviewer, self._names, self._cert_dir = reviewer, names, cert_dir
        self._tls = SwappableContext() if reviewer is not None else None
        self._runner: web.AppRunner | None = None
        self._directory: str | None = None
        self._served: tuple[bytes, bytes] | None = None

    @property
    def secure(self) -> bool:
        return self._tls is not None

    async def start(self) -> None:
        if self._tls is not None:
            self._directory = await asyncio.to_thread(tempfile.mkdtemp, prefix="headroom-metrics-")
            if self._cert_dir is None:
                pair = await asyncio.to_thread(self_signed, self._names, datetime.now(UTC))
                await self._load(pair)
            else:
                await self._load(await asyncio.to_thread(self._read_pair))
        app = web.Application()
        app.router.add_get(PATH, self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        context = self._tls.listening if self._tls is not None else None
        site = web.TCPSite(self._runner, self._host, self.port, ssl_context=context)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        scheme = "https (authenticated)" if self.secure else "http (unauthenticated)"
        log.info("metrics on %s://%s:%d%s", scheme, self._host, self.port, PATH)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._directory is not None:
            await asyncio.to_thread(shutil.rmtree, self._directory, True)

    async def keep_certificate(self, period: float = RELOAD_PERIOD) -> None:
        """Read the mounted pair again every ``period`` and serve it if it changed; a
        pair that cannot be loaded is logged and the one served stays."""
        if self._cert_dir is None:
            return
        while True:
            await asyncio.sleep(period)
            try:
                await self._load(await asyncio.to_thread(self._read_pair))
            except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
                log.warning("metrics certificate in %s not reloaded: %s", self._cert_dir, error)

    def _read_pair(self) -> tuple[bytes, bytes]:
        directory = Path(self._cert_dir or ".")
        return (directory / CERT_FILE).read_bytes(), (directory / KEY_FILE).read_bytes()

    async def _load(self, pair: tuple[bytes, bytes]) -> None:
        if pair == self._served or self._tls is None or self._directory is None:
            return
        context = await asyncio.to_thread(context_from_pem, self._directory, *pair)
        self._tls.set(context)
        if self._served is not None:
            log.info("metrics serving certificate reloaded from %s", self._cert_dir)
        self._served = pair

    async def _metrics(self, request: web.Request) -> web.Response:
        if self._reviewer is not None:
            try:
                verdict = await self._reviewer.verdict(request.headers.get("Authorization"), PATH)
            except ReviewUnavailableError:
                return web.Response(status=503, text="cannot review the token now; try again")
            if verdict is AccessVerdict.UNAUTHENTICATED:
                return web.Response(
                    status=401, text="Unauthorized", headers={"WWW-Authenticate": "Bearer"}
                )
            if verdict is AccessVerdict.FORBIDDEN:
                return web.Response(status=403, text="Forbidden")
        body = generate_latest(self._registry)  # on the loop: collectors read the ledger
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
