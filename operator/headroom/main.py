"""``headroom run``: load the config, connect, and run the operator until stopped.

The stop order is what a takeover needs: the Lease is released as soon as the
controller has stopped, so a standby decides at once, while the webhook keeps
answering for ``webhook.drainDelay`` (the terminating pod's endpoint leaves the
Service only as the EndpointSlice controller and the API server see it go), and
every replica serves the webhook before it holds the Lease and while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import threading
import uuid
from collections.abc import Awaitable
from functools import partial
from pathlib import Path

import kopf

from headroom.api.config import EXTENDER_CLIENT, ConfigError, OperatorConfig, parse_config
from headroom.api.constants import WEBHOOK_URL_ANNOTATION
from headroom.control.certificates import (
    CertificateKeeper,
    CertificateTarget,
    ClientCertificateTarget,
)
from headroom.control.controller import Controller
from headroom.control.supervisor import Supervisor
from headroom.handlers.wiring import build_registry, configure
from headroom.kube.client import Credentials, KubeClient
from headroom.kube.clock import Clock, SystemClock
from headroom.kube.leader import LeaseSettings
from headroom.kube.leasethread import LeaseThread
from headroom.objects.certificates import Bundle, CertificatePolicy, service_names
from headroom.serving.access import AccessReviewer
from headroom.serving.extender import ExtenderServer
from headroom.serving.forward import ReviewForwarder
from headroom.serving.metrics import EventsCollector, OperatorMetrics
from headroom.serving.outlook import LedgerOutlook
from headroom.serving.probes import ProbeServer
from headroom.serving.scrape import MetricsServer
from headroom.serving.webhook import WebhookServer
from headroom.serving.webhookthread import WebhookThread

log = logging.getLogger("headroom")
CONFIG_ENV = "HEADROOM_CONFIG"


def load_config(path: str | None) -> OperatorConfig:
    """The config at ``path`` (or ``$HEADROOM_CONFIG``); all defaults when neither is set."""
    path = path or os.environ.get(CONFIG_ENV)
    if not path:
        return OperatorConfig()
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    return parse_config(text, path)


def _identity() -> str:
    """This process, for the Lease and for kopf. The pid is 1 in most containers: a
    restarted container must not find itself already holding the Lease it held
    before. Given to kopf too, whose own guess asks the password database for the
    user name, which a non-root uid without a passwd entry (the image's 65532)
    does not have: KeyError at start-up."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _elector(
    config: OperatorConfig,
    credentials: Credentials,
    clock: Clock,
    identity: str,
    metrics: OperatorMetrics,
) -> LeaseThread | None:
    election = config.leader_election
    if not election.enabled:
        return None
    return LeaseThread(
        credentials,
        LeaseSettings(
            namespace=election.namespace or os.environ.get("POD_NAMESPACE", "default"),
            name=election.lease_name,
            identity=identity,
            lease_duration=election.lease_duration,
            renew_deadline=election.renew_deadline,
            retry_period=election.retry_period,
            annotations=_advertised(config),
        ),
        clock,
        on_error=metrics.api_error,
    )


def _advertised(config: OperatorConfig) -> dict[str, str]:
    """What the leader writes on its Lease: its webhook's URL, where the other replicas
    forward the reviews only the leader can answer. The pod's IP (``$POD_IP``, the chart
    sets it), else the address the webhook listens on if it is one; none if neither."""
    webhook = config.webhook
    host = os.environ.get("POD_IP") or (
        webhook.host if webhook.host not in ("0.0.0.0", "::", "") else None
    )
    if not webhook.enabled or not host or webhook.port == 0:
        return {}
    shown = f"[{host}]" if ":" in host else host
    return {WEBHOOK_URL_ANNOTATION: f"https://{shown}:{webhook.port}"}


def _webhook(
    config: OperatorConfig,
    client: KubeClient,
    clock: Clock,
    metrics: OperatorMetrics,
    controller: Controller,
    extender: ExtenderServer | None,
    elector: LeaseThread | None,
    identity: str,
) -> tuple[WebhookThread, CertificateKeeper] | None:
    """The admission webhook's server (on its own thread) and the keeper of its
    certificate, when enabled; the keeper also serves the extender's HTTPS and keeps
    its callers' client certificate (``extenderClientSecret``)."""
    webhook = config.webhook
    if not webhook.enabled:
        return None
    certificate = webhook.certificate
    namespace = certificate.namespace or os.environ.get("POD_NAMESPACE", "default")
    service_namespace = certificate.service_namespace or namespace
    placement = config.placement
    scheduler = placement.scheduler
    outlook = LedgerOutlook(
        asyncio.get_running_loop(),
        controller.outlook.answer,
        timeout=webhook.outlook_timeout.total_seconds(),
    )
    names = service_names(
        certificate.service_name, service_namespace, tuple(certificate.extra_names)
    )
    forwarder = None
    if elector is not None:
        forwarder = ReviewForwarder(
            partial(elector.leader_annotation, WEBHOOK_URL_ANNOTATION),
            server_name=names[0],
            identity=identity,
            timeout=webhook.outlook_timeout.total_seconds(),
        )
    server = WebhookThread(
        WebhookServer(
            webhook.host,
            webhook.port,
            on_review=metrics.reviewed,
            scheduler=scheduler,
            outlook=outlook,
            pod_outlook=LedgerOutlook(
                asyncio.get_running_loop(),
                lambda pod, dry_run: controller.outlook.pod_answer(pod),
                timeout=webhook.outlook_timeout.total_seconds(),
            ),
            forwarder=forwarder,
        )
    )
    clients = None
    if config.extender_client_secret is not None:
        clients = ClientCertificateTarget(
            config.extender_client_secret,
            EXTENDER_CLIENT,
            certificate.validity,
            config.extender_scheduler_deployment,
        )

    async def serve(bundle: Bundle) -> None:
        await server.load(bundle.cert, bundle.key, bundle.trust)
        if extender is not None:
            await extender.load(bundle)

    keeper = CertificateKeeper(
        client,
        CertificateTarget(
            namespace=namespace,
            secret=certificate.secret_name,
            configuration=certificate.webhook_configuration,
            policy=CertificatePolicy(names, certificate.ca_validity, certificate.validity),
            client=clients,
        ),
        serve,
        clock=clock,
        period=certificate.check_period.total_seconds(),
    )
    return server, keeper


def _metrics_server(
    config: OperatorConfig, metrics: OperatorMetrics, client: KubeClient, clock: Clock
) -> MetricsServer:
    """/metrics: authenticated HTTPS unless the config opts out (``metricsSecure: false``)."""
    if not config.metrics_secure:
        return MetricsServer(metrics, config.metrics_host, config.metrics_port)
    return MetricsServer(
        metrics,
        config.metrics_host,
        config.metrics_port,
        reviewer=AccessReviewer(client, clock),
        names=("localhost", "127.0.0.1", socket.gethostname()),
        cert_dir=config.metrics_cert_dir,
    )


class _Signals:
    """SIGTERM and SIGINT set ``stop``; one more while draining ends the drain at once.

    kopf installs its own handlers while it runs (its stop ends in our cleanup, which
    sets ``stop``); these cover a standby waiting for the Lease and the drain after kopf.
    """

    NUMBERS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.draining = False
        self._hurry = asyncio.Event()
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may handle signals (an embedded run)
        loop = asyncio.get_running_loop()
        for number in self.NUMBERS:
            loop.add_signal_handler(number, self._signalled)
        self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            loop = asyncio.get_running_loop()
            for number in self.NUMBERS:
                loop.remove_signal_handler(number)

    def _signalled(self) -> None:
        if self.stop.is_set():
            self._hurry.set()
        self.stop.set()

    async def drain(self, seconds: float) -> None:
        """Wait ``seconds``, or less if signalled again."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), seconds)


async def _unless_stopped(work: Awaitable[None], stop: asyncio.Event) -> bool:
    """Await ``work``, unless ``stop`` is set first (then it is cancelled): did it end?"""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False


def _stop_deciding_now() -> None:
    """Lost the Lease: exit at once; the Deployment restarts us as a standby."""
    logging.shutdown()
    os._exit(3)


async def run(config: OperatorConfig, *, stop: asyncio.Event | None = None) -> int:
    """Run until stopped; 0 after a clean stop, 1 when a long-lived task died."""
    credentials = await asyncio.to_thread(Credentials.from_environment)
    controller: Controller | None = None
    metrics = OperatorMetrics(
        lambda: controller.state.ledger if controller and controller.ready.is_set() else None
    )
    client = KubeClient(credentials, on_error=metrics.api_error)
    clock = SystemClock()
    stop = stop or asyncio.Event()
    failures: list[str] = []

    def failed(reason: str) -> None:
        failures.append(reason)
        stop.set()  # kopf stops, its cleanup stops the controller (bounded), we exit 1

    supervisor = Supervisor(on_failure=failed)
    identity = _identity()
    elector = _elector(config, credentials, clock, identity, metrics)
    controller = Controller(
        config,
        client,
        clock=clock,
        telemetry=metrics,
        supervisor=supervisor,
        may_act=elector.may_act if elector is not None else (lambda: True),
        time_left=elector.time_left if elector is not None else (lambda: math.inf),
    )
    metrics.registry.register(EventsCollector(controller.events))
    metrics.count_gated(lambda: controller.gates.gated if controller is not None else 0)
    metrics.count_undecided(controller.admission.undecided)
    metrics.follow_leadership(
        (lambda: elector.is_leader) if elector is not None else controller.ready.is_set
    )
    signals = _Signals(stop)
    extender = None
    if config.extender_port is not None:
        extender = ExtenderServer(
            controller,
            config.extender_host,
            config.extender_port,
            # A leader with its ledger rebuilt, still holding the Lease, not stopping: a
            # draining or deposed one answers 503, so the scheduler asks again elsewhere.
            deciding=lambda: (
                controller.ready.is_set()
                and (elector is None or elector.may_act())
                and not signals.draining
            ),
            tls=config.extender_client_secret is not None,
        )
    webhook = _webhook(config, client, clock, metrics, controller, extender, elector, identity)
    probes = ProbeServer(
        controller,
        config.probe_host,
        config.probe_port,
        standby=lambda: elector is not None and not elector.is_leader,
        webhook_ready=(lambda: webhook[0].ready) if webhook is not None else None,
        stopping=lambda: signals.draining,
    )
    scrapes = _metrics_server(config, metrics, client, clock)
    await scrapes.start()
    if config.metrics_secure and config.metrics_cert_dir is not None:
        supervisor.spawn("metrics-certificate", scrapes.keep_certificate())
    await probes.start()
    log.info("probes on http://%s:%d", config.probe_host, probes.port)
    if extender is not None:
        await extender.start()
        log.info(
            "scheduler extender on %s://%s:%d",
            extender.scheme,
            config.extender_host,
            extender.port,
        )
    if webhook is not None:  # every replica serves it, before and without the Lease
        await webhook[0].start()
        supervisor.spawn("webhook-certificate", webhook[1].run())
    signals.install()
    try:
        if elector is not None:  # a standby waits here, serving the webhook
            if not await _unless_stopped(elector.acquire(on_lost=_stop_deciding_now), stop):
                return 1 if failures else 0  # stopped as a standby (the finally drains)
            supervisor.spawn("lease", elector.held())
        settings = kopf.OperatorSettings()
        configure(settings)
        await kopf.operator(
            registry=build_registry(credentials),
            settings=settings,
            clusterwide=True,
            standalone=True,
            memo=kopf.Memo(controller=controller, stop=stop),
            stop_flag=stop,
            # kopf's Identity is a NewType of str it does not export.
            identity=identity,  # type: ignore[arg-type]
        )
    finally:
        signals.draining = True  # /readyz: 503 from now on
        signals.install()  # kopf's handlers went with it: one more signal ends the drain
        drain = config.webhook.drain_delay.total_seconds() if webhook is not None else 0.0
        drained = asyncio.get_running_loop().time() + drain
        if webhook is not None:
            webhook[0].drain()
        if elector is not None:
            await elector.release()  # at once: a standby decides while this one drains
        if drain > 0:
            log.info("stopping: the webhook answers %.0fs more, the Lease is released", drain)
            await signals.drain(drained - asyncio.get_running_loop().time())
        await probes.stop()
        if extender is not None:
            await extender.stop()
        await scrapes.stop()
        if webhook is not None:
            await webhook[0].stop()
        await client.close()
        signals.uninstall()
    return 1 if failures else 0
