"""kopf wiring: the operator's life cycle runs on kopf; each handler is one call.

kopf runs the process: start-up and clean-up handlers, login, signal handling
and its own liveness. Resource events do not come through kopf: the controller
follows Reservations, Nodes and owner Pods with its own WATCHes, each started
from the resourceVersion of the LIST its ledger was rebuilt from (see
``headroom.kube.watch``): no gap and no replay between the rebuild and the
first event, no per-object kopf state (10,000 reservations cost 145 MB more
through kopf), and one code path that the deterministic simulation drives.
The handlers are ``async`` on purpose: kopf runs sync handlers in threads,
where they would race the single-threaded ledger.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from headroom.control.controller import Controller
from headroom.kube.client import Credentials


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings the operator depends on."""
    settings.posting.enabled = False  # our own Events say what happened; not kopf's logs
    settings.networking.request_timeout = 60  # the default 300 s hides a dead API server
    settings.networking.connect_timeout = 10


async def connection_info(credentials: Credentials) -> kopf.ConnectionInfo:
    """kopf's connection: called at start, and again by kopf after a 401, so the token
    file is read each time (the kubelet rotates a projected token)."""
    token = await asyncio.to_thread(credentials.read_token) or credentials.token
    return kopf.ConnectionInfo(
        server=credentials.server,
        ca_path=credentials.ca_file,
        insecure=not credentials.verify,
        certificate_path=credentials.cert_file,
        private_key_path=credentials.key_file,
        scheme="Bearer" if token else None,
        token=token.split(" ", 1)[-1] if token else None,
    )


def build_registry(credentials: Credentials) -> kopf.OperatorRegistry:
    """A registry with exactly Headroom's handlers (no module-level global state)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return await connection_info(credentials)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure(settings)
        await controller_of(memo).start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        await controller_of(memo).stop()
        # kopf waits for its task watching the stop flag (up to 5 s) when it stops for
        # another reason (a signal): raise the flag, and it ends at once.
        stop = memo.get("stop")
        if isinstance(stop, asyncio.Event):
            stop.set()

    return registry


def controller_of(memo: kopf.Memo) -> Controller:
    controller: Controller = memo["controller"]
    return controller


logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per event is noise
