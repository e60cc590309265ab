"""Both sides of the fake API server's contract tests: kube-apiserver and the fake.

A :class:`Backend` runs one scenario (an async function of a Transport and a
namespace) on the real control plane through ``KubeClient``, or on the fake on
the virtual loop. The test modules ``test_fake_api_contract*.py`` parametrize
each scenario over both and assert the same outcomes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from headroom.kube import client as kube
from headroom.kube.transport import JSON, ApiError, Transport, resource_path
from headroom_dev.controlplane import ControlPlane
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.loop import run_virtual

T = TypeVar("T")
Scenario = Callable[[Transport, str], Awaitable[T]]

GROUP, VERSION = "headroom.dev", "v1alpha1"
JSON_PATCH_REJECTED = (422, "Invalid")


@dataclass
class Backend:
    name: str
    namespace: str
    run: Callable[[Scenario[Any]], Any]


def real_backend(control_plane: ControlPlane, namespace: str) -> Backend:
    credentials = control_plane.admin_credentials()

    def run(scenario: Scenario[T]) -> T:
        async def main() -> T:
            client = kube.KubeClient(credentials, timeout=60)
            try:
                return await scenario(client, namespace)
            finally:
                await client.close()

        return asyncio.run(main())

    return Backend("real", namespace, run)


def fake_backend() -> Backend:
    server = FakeApiServer(seed=1)
    namespace = "contract"
    server.ensure_namespace(namespace)

    def run(scenario: Scenario[T]) -> T:
        return run_virtual(
            scenario(server.client("contract-test"), namespace), max_virtual_seconds=600
        )

    return Backend("fake", namespace, run)


def make_backend(request: pytest.FixtureRequest) -> Backend:
    """For a fixture parametrized with ``"real"`` and ``"fake"``."""
    if request.param == "real":
        request.getfixturevalue("crds")
        return real_backend(
            request.getfixturevalue("control_plane"), request.getfixturevalue("namespace")
        )
    return fake_backend()


def rsv_path(namespace: str | None, name: str | None = None) -> str:
    return resource_path(GROUP, VERSION, "reservations", namespace, name)


def reservation(name: str, ram_mb: int = 10, **labels: str) -> JSON:
    body: JSON = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Reservation",
        "metadata": {"name": name},
        "spec": {"node": "node-1", "ramMB": ram_mb},
    }
    if labels:
        body["metadata"]["labels"] = labels
    return body


async def refusal(call: Awaitable[Any]) -> tuple[int, str]:
    """The status and reason of the ApiError ``call`` must raise."""
    try:
        await call
    except ApiError as error:
        return error.status, error.reason
    raise AssertionError("the call succeeded; an ApiError was expected")


async def watch_until_end(
    api: Transport, path: str, version: str, *, selector: str | None = None, seconds: int = 2
) -> list[tuple[str, str | None, str, JSON]]:
    """(type, name, resourceVersion, labels) of every event until the server ends the watch;
    bookmarks are checked and left out (the real server sends them only near the end
    of long watches)."""
    events = []
    async for event in api.watch(
        path, resource_version=version, label_selector=selector, timeout_seconds=seconds
    ):
        obj = event["object"]
        if event["type"] == "BOOKMARK":
            assert set(obj["metadata"]) == {"resourceVersion"}
            assert int(obj["metadata"]["resourceVersion"]) >= int(version)
            continue
        metadata = obj.get("metadata") or {}
        events.append(
            (
                event["type"],
                metadata.get("name"),
                metadata.get("resourceVersion"),
                metadata.get("labels") or {},
            )
        )
    return events


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
