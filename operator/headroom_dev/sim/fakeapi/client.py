"""One operator process's connection to the fake API server: a Transport with faults.

Every request travels: it yields to the loop on the way in and on the way out
(a virtual latency when the :class:`FaultPlan` has one), so concurrent requests
interleave as they would over a network, and the store applies it in between.
Where it travels it passes the *gate*:

- :meth:`FakeClient.pause` closes the gate: requests neither reach the store nor
  return, watches deliver nothing (a frozen process, a partitioned network);
  :meth:`FakeClient.resume` lets everything through in the order it queued;
- :meth:`FakeClient.kill` fails everything outstanding with
  ``ApiUnavailableError`` at once, and every later call (a crashed process: the
  simulation makes a new client for its successor).

With ``timeout``, a request not answered within that many virtual seconds fails
with ``ApiUnavailableError`` as a client-side timeout would; without it, a
paused client's requests wait for as long as the pause lasts.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from headroom.kube.transport import ApiError, ApiUnavailableError, Transport
from headroom_dev.sim.fakeapi.faults import Fate, FaultPlan
from headroom_dev.sim.fakeapi.jsonvalue import clone
from headroom_dev.sim.fakeapi.kinds import parse_path
from headroom_dev.sim.fakeapi.watch import WatchStream

if TYPE_CHECKING:
    from headroom_dev.sim.fakeapi.server import FakeApiServer

JSON = dict[str, Any]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class FakeClient:
    """A :class:`headroom.kube.transport.Transport` bound to one client identity."""

    def __init__(
        self,
        server: FakeApiServer,
        name: str,
        faults: FaultPlan | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        self.server, self.name, self.faults, self.timeout = server, name, faults, timeout
        self.calls = 0
        self.streams: dict[int, WatchStream] = {}
        self._stream_ids = itertools.count(1)
        self._paused = self._killed = False
        self._blocked: dict[asyncio.Future[None], None] = {}  # waiting at the closed gate
        self._sleeping: dict[asyncio.Future[None], None] = {}  # in transit (latency)

    def __repr__(self) -> str:
        state = "killed" if self._killed else "paused" if self._paused else "up"
        return f"<FakeClient {self.name} {state}>"

    # -- the Transport ---------------------------------------------------------------------

    async def get(self, path: str) -> JSON:
        store = self.server.store

        def apply() -> JSON:
            target = parse_path(path)
            if target.name is None:
                return store.list_page(target, limit=0)
            return clone(store.get(target))

        return await self._call("get", apply)

    async def create(self, path: str, body: JSON) -> JSON:
        store = self.server.store
        return await self._call("create", lambda: clone(store.create(parse_path(path), body)))

    async def replace(self, path: str, body: JSON) -> JSON:
        store = self.server.store
        return await self._call("replace", lambda: clone(store.replace(parse_path(path), body)))

    async def merge_patch(self, path: str, body: JSON) -> JSON:
        store = self.server.store
        return await self._call("patch", lambda: clone(store.merge_patch(parse_path(path), body)))

    async def json_patch(self, path: str, operations: list[JSON]) -> JSON:
        store = self.server.store
        return await self._call(
            "patch", lambda: clone(store.json_patch(parse_path(path), operations))
        )

    async def delete(self, path: str, *, uid: str | None = None) -> JSON:
        store = self.server.store
        return await self._call("delete", lambda: clone(store.delete(parse_path(path), uid)))

    async def list_page(
        self,
        path: str,
        *,
        limit: int = 500,
        continue_token: str | None = None,
        label_selector: str | None = None,
    ) -> JSON:
        store = self.server.store
        return await self._call(
            "list",
            lambda: store.list_page(
                parse_path(path),
                limit=limit,
                continue_token=continue_token,
                label_selector=label_selector,
            ),
        )

    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 270,
    ) -> WatchStream:
        self.calls += 1
        return WatchStream(
            self, next(self._stream_ids), path, resource_version, label_selector, timeout_seconds
        )

    async def close(self) -> None:
        """Like closing a session: outstanding requests and watches fail, later calls too."""
        self.kill()

    # -- the process's fate ----------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def killed(self) -> bool:
        return self._killed

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        for waiter in list(self._blocked):
            _resolve(waiter)

    def kill(self) -> None:
        """The process died: everything outstanding fails now, and everything later."""
        self._killed, self._paused = True, False
        for waiter in [*self._blocked, *self._sleeping]:
            if not waiter.done():
                waiter.set_exception(self._dead())
        for stream in list(self.streams.values()):
            stream.fail(self._dead())

    def _dead(self) -> ApiUnavailableError:
        return ApiUnavailableError(f"{self.name}: connection lost (client killed)")

    # -- the way there and back --------------------------------------------------------------

    async def _call(self, verb: str, apply: Callable[[], JSON]) -> JSON:
        self.calls += 1
        if self._killed:
            raise self._dead()
        if self.timeout is None:
            return await self._exchange(verb, apply)
        try:
            async with asyncio.timeout(self.timeout):
                return await self._exchange(verb, apply)
        except TimeoutError:
            raise ApiUnavailableError(
                f"{self.name}: no answer within {self.timeout:g} s (client timeout)"
            ) from None

    async def _exchange(self, verb: str, apply: Callable[[], JSON]) -> JSON:
        fate = self.faults.fate(verb) if self.faults is not None else Fate.OK
        await self.travel()
        if fate is Fate.REFUSED:
            raise ApiUnavailableError(f"{self.name}: connection refused (fault)")
        error = fate.error()
        result: JSON = {}
        if error is None:
            try:
                result = apply()
            except ApiError as refused:
                error = refused
        await self.travel()
        if error is not None:
            raise error
        if fate is Fate.ANSWER_LOST:
            raise ApiUnavailableError(f"{self.name}: answer lost after the server applied it")
        return result

    async def travel(self) -> None:
        """One way across the network: a latency (or one loop turn), then the gate."""
        delay = self.faults.delay() if self.faults is not None else 0.0
        if delay > 0:
            await self.sleep(delay)
        else:
            await asyncio.sleep(0)
        await self.gate()

    async def gate(self) -> None:
        """Wait while paused; fail if killed."""
        while self._paused:
            waiter = asyncio.get_running_loop().create_future()
            self._blocked[waiter] = None
            try:
                await waiter
            finally:
                self._blocked.pop(waiter, None)
        if self._killed:
            raise self._dead()

    async def sleep(self, delay: float) -> None:
        """A virtual delay that a kill interrupts."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._sleeping[waiter] = None
        handle = loop.call_later(delay, _resolve, waiter)
        try:
            await waiter
        finally:
            handle.cancel()
            self._sleeping.pop(waiter, None)


if TYPE_CHECKING:

    def _is_a_transport(client: FakeClient) -> Transport:
        return client  # mypy checks FakeClient against the Protocol here
