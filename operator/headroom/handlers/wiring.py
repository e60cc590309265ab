"""kopf wiring: each handler is one call into the controller.

Reservations are not watched here: the controller follows them with its own
WATCH from the rebuild's list (see ``headroom.kube.watch``). Only ``on.event``
handlers are used for the kinds kopf watches: they keep no progress
annotations and add no finalizers, so ``kubectl delete`` never waits for the
operator, and an event costs one dictionary lookup when nothing changed. The
handlers are ``async`` on purpose: kopf runs sync handlers in threads, where they
would race the single-threaded ledger.

Pods are watched only if they carry ``headroom.dev/owner=true``; the selector is
sent to the API server, so the operator never receives (or holds) other pods.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import kopf

from headroom.api.constants import OWNER_LABEL
from headroom.kube.client import JSON, Credentials
from headroom.kube.controller import Controller

OWNER_SELECTOR = f"{OWNER_LABEL}=true"


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings the operator depends on (see the README's kopf notes)."""
    settings.posting.enabled = False  # our own Events say what happened; not kopf's logs
    settings.networking.request_timeout = 60  # the default 300 s hides a dead API server
    settings.networking.connect_timeout = 10
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.reconnect_backoff = 1.0
    settings.batching.batch_window = 0.01  # act on an event at once; merging costs latency
    settings.watching.label_selectors["v1", "pods"] = OWNER_SELECTOR


def build_registry(credentials: Credentials) -> kopf.OperatorRegistry:
    """A registry with exactly Headroom's handlers (no module-level global state)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=credentials.server,
            ca_path=credentials.ca_file,
            insecure=not credentials.verify,
            certificate_path=credentials.cert_file,
            private_key_path=credentials.key_file,
            scheme="Bearer" if credentials.token else None,
            token=credentials.token.split(" ", 1)[-1] if credentials.token else None,
        )

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure(settings)
        await controller_of(memo).start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        await controller_of(memo).stop()

    @kopf.on.event("v1", "nodes", registry=registry)
    async def node(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        controller_of(memo).on_node(event["type"], cast(JSON, event["object"]))

    @kopf.on.event("v1", "pods", labels={OWNER_LABEL: "true"}, registry=registry)
    async def pod(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        controller_of(memo).on_pod(event["type"], cast(JSON, event["object"]))

    return registry


def controller_of(memo: kopf.Memo) -> Controller:
    controller: Controller = memo["controller"]
    return controller


logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per event is noise
