"""``headroom run``: load the config, connect, and run the operator until stopped."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import uuid
from pathlib import Path

import kopf

from headroom.api.config import ConfigError, OperatorConfig, parse_config
from headroom.control.certificates import CertificateKeeper, CertificateTarget
from headroom.control.controller import Controller
from headroom.control.supervisor import Supervisor
from headroom.handlers.wiring import build_registry, configure
from headroom.kube.client import Credentials, KubeClient
from headroom.kube.clock import Clock, SystemClock
from headroom.kube.leader import LeaseSettings
from headroom.kube.leasethread import LeaseThread
from headroom.objects.certificates import CertificatePolicy, service_names
from headroom.serving.access import AccessReviewer
from headroom.serving.metrics import EventsCollector, OperatorMetrics
from headroom.serving.probes import ProbeServer
from headroom.serving.scrape import MetricsServer
from headroom.serving.webhook import WebhookServer

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
        ),
        clock,
        on_error=metrics.api_error,
    )


def _webhook(
    config: OperatorConfig, client: KubeClient, clock: Clock, metrics: OperatorMetrics
) -> tuple[WebhookServer, CertificateKeeper] | None:
    """The admission webhook's server and the keeper of its certificate, when enabled."""
    webhook = config.webhook
    if not webhook.enabled:
        return None
    certificate = webhook.certificate
    namespace = certificate.namespace or os.environ.get("POD_NAMESPACE", "default")
    service_namespace = certificate.service_namespace or namespace
    server = WebhookServer(webhook.host, webhook.port, on_review=metrics.reviewed)
    names = service_names(
        certificate.service_name, service_namespace, tuple(certificate.extra_names)
    )
    keeper = CertificateKeeper(
        client,
        CertificateTarget(
            namespace=namespace,
            secret=certificate.secret_name,
            configuration=certificate.webhook_configuration,
            policy=CertificatePolicy(names, certificate.ca_validity, certificate.validity),
        ),
        server.load,
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
    webhook = _webhook(config, client, clock, metrics)
    probes = ProbeServer(
        controller,
        config.probe_host,
        config.probe_port,
        standby=lambda: elector is not None and not elector.is_leader,
        webhook_ready=lambda: webhook is None or webhook[0].ready,
    )
    scrapes = _metrics_server(config, metrics, client, clock)
    await scrapes.start()
    if config.metrics_secure and config.metrics_cert_dir is not None:
        supervisor.spawn("metrics-certificate", scrapes.keep_certificate())
    await probes.start()
    log.info("probes on http://%s:%d", config.probe_host, probes.port)
    if webhook is not None:  # every replica serves it, before and without the Lease
        await webhook[0].start()
        supervisor.spawn("webhook-certificate", webhook[1].run())
    if elector is not None:
        await elector.acquire(on_lost=_stop_deciding_now)  # a standby waits here
        supervisor.spawn("lease", elector.held())
    settings = kopf.OperatorSettings()
    configure(settings)
    try:
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
        if elector is not None:
            await elector.release()
        await probes.stop()
        await scrapes.stop()
        if webhook is not None:
            await webhook[0].stop()
        await client.close()
    return 1 if failures else 0
