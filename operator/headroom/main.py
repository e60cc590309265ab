"""``headroom run``: load the config, connect, and run the operator until stopped."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import kopf

from headroom.api.config import ConfigError, OperatorConfig, parse_config
from headroom.handlers.wiring import build_registry, configure
from headroom.kube.client import Credentials, KubeClient
from headroom.kube.controller import Controller
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


async def run(config: OperatorConfig, *, stop: asyncio.Event | None = None) -> None:
    credentials = await asyncio.to_thread(Credentials.from_environment)
    client = KubeClient(credentials)
    controller = Controller(config, client)
    probes = ProbeServer(controller, config.metrics_host, config.metrics_port)
    await probes.start()
    log.info("metrics and probes on %s:%d", config.metrics_host, probes.port)
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
        await probes.stop()
        await client.close()
