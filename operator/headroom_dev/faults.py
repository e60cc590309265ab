"""A Transport wrapper that makes chosen calls to the *real* API server fail.

For in-process tests of the controller against the real kube-apiserver: the
server and everything it stores are real; only the network between the
operator and it misbehaves, the way a dropped connection, a 503 from an
overloaded server or an answer lost after the write landed would. Rules match
a call by method and path; each says what happens and how many times.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport


@dataclass
class Rule:
    """``method`` and a substring of the path; ``times`` calls get ``fault``.

    fault: "refuse-<status>" (an ApiError, nothing sent), "unavailable" (nothing
    sent), "lose-answer" (sent and applied, then ApiUnavailableError), or "hold"
    (sent and answered, but the answer is handed over only after ``release()``:
    a slow LIST whose snapshot is older than what happens meanwhile).
    """

    method: str
    path_contains: str
    fault: str
    times: int = 1_000_000
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        self.released.set()

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and method == self.method and self.path_contains in path


class FaultyTransport:
    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.rules: list[Rule] = []
        self.calls: list[tuple[str, str]] = []

    def add(self, rule: Rule) -> Rule:
        self.rules.append(rule)
        return rule

    def calls_to(self, method: str, path_contains: str) -> int:
        return sum(1 for m, p in self.calls if m == method and path_contains in p)

    async def _call(self, method: str, path: str, send: Callable[[], Awaitable[JSON]]) -> JSON:
        self.calls.append((method, path))
        rule = next((r for r in self.rules if r.matches(method, path)), None)
        if rule is not None:
            rule.times -= 1
            if rule.fault.startswith("refuse-"):
                status = int(rule.fault.removeprefix("refuse-"))
                raise ApiError(status, "Injected", f"injected {status} for {method} {path}")
            if rule.fault == "unavailable":
                raise ApiUnavailableError(f"injected: no connection for {method} {path}")
        answer = await send()
        if rule is not None and rule.fault == "lose-answer":
            raise ApiUnavailableError(f"injected: answer lost for {method} {path}")
        if rule is not None and rule.fault == "hold":
            rule.reached.set()
            await rule.released.wait()
        return answer

    async def get(self, path: str) -> JSON:
        return await self._call("GET", path, lambda: self.inner.get(path))

    async def create(self, path: str, body: JSON) -> JSON:
        return await self._call("POST", path, lambda: self.inner.create(path, body))

    async def replace(self, path: str, body: JSON) -> JSON:
        return await self._call("PUT", path, lambda: self.inner.replace(path, body))

    async def merge_patch(self, path: str, body: JSON) -> JSON:
        return await self._call("PATCH", path, lambda: self.inner.merge_patch(path, body))

    async def json_patch(self, path: str, operations: list[JSON]) -> JSON:
        return await self._call("PATCH", path, lambda: self.inner.json_patch(path, operations))

    async def delete(self, path: str, *, uid: str | None = None) -> JSON:
        return await self._call("DELETE", path, lambda: self.inner.delete(path, uid=uid))

    async def list_page(
        self,
        path: str,
        *,
        limit: int = 500,
        continue_token: str | None = None,
        label_selector: str | None = None,
    ) -> JSON:
        return await self._call(
            "LIST",
            path,
            lambda: self.inner.list_page(
                path, limit=limit, continue_token=continue_token, label_selector=label_selector
            ),
        )

    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 270,
    ) -> AsyncIterator[JSON]:
        return self.inner.watch(
            path,
            resource_version=resource_version,
            label_selector=label_selector,
            timeout_seconds=timeout_seconds,
        )
