"""``headroom run``: load the config, connect, and run the operator until stopped."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path

import kopf

from headroom.api.config import ConfigError, OperatorConfig, parse_config
from headroom.handlers.wiring import build_registry, configure
from headroom.kube.client import Credentials, KubeClient
from headroom.kube.controller import Controller
from headroom.kube.leader import LeaderElector, LeaseSettings
from headroom.kube.probes import ProbeServer

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


def _elector(config: OperatorConfig, client: KubeClient) -> LeaderElector | None:
    election = config.leader_election
    if not election.enabled:
        return None
    return LeaderElector(
        client,
        LeaseSettings(
            namespace=election.namespace or os.environ.get("POD_NAMESPACE", "default"),
            name=election.lease_name,
            identity=f"{socket.gethostname()}-{os.getpid()}",
            lease_duration=election.lease_duration,
            renew_deadline=election.renew_deadline,
            retry_period=election.retry_period,
        ),
    )


def _stop_deciding_now() -> None:
    """Lost the Lease: exit at once; the Deployment restarts us as a standby."""
    logging.shutdown()
    os._exit(3)


async def run(config: OperatorConfig, *, stop: asyncio.Event | None = None) -> None:
    credentials = await asyncio.to_thread(Credentials.from_environment)
    client = KubeClient(credentials)
    controller = Controller(config, client)
    elector = _elector(config, client)
    probes = ProbeServer(
        controller,
        config.metrics_host,
        config.metrics_port,
        standby=lambda: elector is not None and not elector.is_leader,
    )
    await probes.start()
    log.info("metrics and probes on %s:%d", config.metrics_host, probes.port)
    if elector is not None:
        await elector.acquire()  # a standby waits here, holding no ledger
        holding = asyncio.create_task(elector.hold(on_lost=_stop_deciding_now))
    settings = kopf.OperatorSettings()
    configure(settings)
    try:
        await kopf.operator(
            registry=build_registry(credentials),
            settings=settings,
            clusterwide=True,
            standalone=True,
            memo=kopf.Memo(controller=controller),
            stop_flag=stop,
        )
    finally:
        if elector is not None:
            holding.cancel()
        await probes.stop()
        await client.close()
