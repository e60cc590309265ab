"""The narrow interface between the control code and an API server.

Everything the operator asks of Kubernetes is one of these calls, on REST paths
(``/api/v1/nodes``, ``/apis/headroom.dev/v1alpha1/namespaces/ns/reservations/x/status``).
Two things implement it: :class:`headroom.kube.client.KubeClient` (aiohttp, the
real API server) and the deterministic simulation's in-memory API server
(``headroom_dev.sim``), which replays interleavings and failures the real
control plane cannot. That is why the failure modes are ours, not aiohttp's:

- :class:`ApiError`: the server answered, and said no (a status and a reason).
- :class:`ApiUnavailableError`: no answer (connection refused or reset, timeout).
  A write may or may not have been applied; the caller must not assume either.

No asyncio or aiohttp here: the pure and control layers import this module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from headroom.api.paths import resource_path

__all__ = ["JSON", "ApiError", "ApiUnavailableError", "Transport", "list_all", "resource_path"]

JSON = dict[str, Any]


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        """The resourceVersion asked for is older than the server keeps (relist)."""
        return self.status == 410

    @property
    def invalid(self) -> bool:
        """422: e.g. a JSON patch ``test`` failed (another incarnation, or the status moved)."""
        return self.status == 422

    @property
    def retriable(self) -> bool:
        """Throttled or a server-side fault: the same request may succeed later."""
        return self.status == 429 or self.status >= 500


class ApiUnavailableError(Exception):
    """No answer from the API server; a write may or may not have been applied."""


class Transport(Protocol):
    """The API calls the operator makes. Bodies are plain JSON dicts."""

    async def get(self, path: str) -> JSON: ...

    async def create(self, path: str, body: JSON) -> JSON: ...

    async def replace(self, path: str, body: JSON) -> JSON:
        """PUT; with ``metadata.resourceVersion`` it fails with 409 if the object moved.
        Without one it is 422 for Reservations, NodeHeadrooms and Leases; a PUT to a
        missing Lease creates it."""
        ...

    async def merge_patch(self, path: str, body: JSON) -> JSON: ...

    async def json_patch(self, path: str, operations: list[JSON]) -> JSON:
        """RFC 6902; a failed ``test`` operation is an ApiError 422."""
        ...

    async def delete(self, path: str, *, uid: str | None = None) -> JSON:
        """With ``uid``: only that incarnation (precondition; 409 if another)."""
        ...

    async def list_page(
        self,
        path: str,
        *,
        limit: int = 500,
        continue_token: str | None = None,
        label_selector: str | None = None,
    ) -> JSON:
        """One page of a LIST: ``items`` and ``metadata`` (resourceVersion, continue)."""
        ...

    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 270,
    ) -> AsyncIterator[JSON]:
        """Events after ``resource_version`` (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR),
        until the server ends the watch. A version too old for the server comes back
        as an ERROR event carrying a 410 Status (kube-apiserver answers 200 and sends
        that event), or as ApiError 410."""
        ...


async def list_all(
    transport: Transport, path: str, *, limit: int = 500, label_selector: str | None = None
) -> tuple[list[JSON], str]:
    """Every item of a paged LIST and the list's resourceVersion (a consistent snapshot)."""
    items: list[JSON] = []
    version, token = "", None
    while True:
        page = await transport.list_page(
            path, limit=limit, continue_token=token, label_selector=label_selector
        )
        items.extend(page.get("items") or [])
        metadata = page.get("metadata") or {}
        version = metadata.get("resourceVersion", version)
        token = metadata.get("continue")
        if not token:
            return items, version
