"""Both sides of the fake API server's contract tests: kube-apiserver and the fake.

A :class:`Backend` runs one scenario (an async function of a Transport and a
namespace) on the real control plane through ``KubeClient``, or on the fake on
the virtual loop. The test modules ``test_fake_api_contract*.py`` parametrize
each scenario over both and assert the same outcomes.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlencode

import aiohttp
import pytest

from headroom.kube import client as kube
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport, resource_path
from headroom_dev.controlplane import ControlPlane
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.loop import run_virtual

T = TypeVar("T")
Scenario = Callable[[Transport, str], Awaitable[T]]

GROUP, VERSION = "headroom.dev", "v1alpha1"
JSON_PATCH_REJECTED = (422, "Invalid")


class KubeTransport:
    """``KubeClient`` seen through the Transport interface.

    The client on this branch predates ``transport.py`` (its own ApiError, no
    ``replace``/``list_page``, no label selector on ``watch``); this adapter adds
    exactly that and nothing else, over the client's own session and requests.
    """

    def __init__(self, client: kube.KubeClient) -> None:
        self.client = client

    async def _do(self, call: Awaitable[JSON]) -> JSON:
        try:
            return await call
        except kube.ApiError as error:
            raise ApiError(error.status, error.reason, error.message) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise ApiUnavailableError(repr(error)) from error

    async def get(self, path: str) -> JSON:
        return await self._do(self.client.get(path))

    async def create(self, path: str, body: JSON) -> JSON:
        return await self._do(self.client.create(path, body))

    async def replace(self, path: str, body: JSON) -> JSON:
        return await self._do(self.client.request("PUT", path, body=body))

    async def merge_patch(self, path: str, body: JSON) -> JSON:
        return await self._do(self.client.merge_patch(path, body))

    async def json_patch(self, path: str, operations: list[JSON]) -> JSON:
        return await self._do(self.client.json_patch(path, operations))

    async def delete(self, path: str, *, uid: str | None = None) -> JSON:
        return await self._do(self.client.delete(path, uid=uid))

    async def list_page(
        self,
        path: str,
        *,
        limit: int = 500,
        continue_token: str | None = None,
        label_selector: str | None = None,
    ) -> JSON:
        params: dict[str, str | int] = {"limit": limit}
        if continue_token:
            params["continue"] = continue_token
        if label_selector:
            params["labelSelector"] = label_selector
        return await self._do(self.client.request("GET", path, params=params))

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 270,
    ) -> AsyncIterator[JSON]:
        params: dict[str, str | int] = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
        }
        if label_selector:
            params["labelSelector"] = label_selector
        url = path.lstrip("/") + "?" + urlencode(params)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30)
        async with self.client._session.get(url, timeout=timeout) as response:
            if response.status >= 300:
                raise ApiError(response.status, "", await response.text())
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)


@dataclass
class Backend:
    name: str
    namespace: str
    run: Callable[[Scenario[Any]], Any]


def real_backend(control_plane: ControlPlane, namespace: str) -> Backend:
    pki = control_plane.pki
    credentials = kube.Credentials(
        server=control_plane.url,
        ca_file=str(pki / "ca.crt"),
        cert_file=str(pki / "admin.crt"),
        key_file=str(pki / "admin.key"),
    )

    def run(scenario: Scenario[T]) -> T:
        async def main() -> T:
            client = kube.KubeClient(credentials, timeout=60)
            try:
                return await scenario(KubeTransport(client), namespace)
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
