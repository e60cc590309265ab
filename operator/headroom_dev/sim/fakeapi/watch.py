"""One WATCH, as kube-apiserver's watch cache serves it and as a client reads it.

The server side of a stream is synchronous: the store offers every committed
change of the kind (:meth:`WatchStream.offer`), the stream filters it and puts
it in its queue; timers add bookmarks and close the stream at its timeout. The
client side is the async iterator, which drains the queue through the client's
gate, so a paused process receives nothing and a killed one gets
``ApiUnavailableError`` at once.

What the real server does, and so this does (contract tests):

- a watch from a resourceVersion the history no longer holds answers HTTP 200
  with one ``ERROR`` event (a Status, code 410, reason Expired) and ends; the
  ``expired_watch="api_error"`` server option turns that into ApiError 410;
- with a label selector, a change that makes an object stop matching is a
  ``DELETED`` carrying the object's *previous* content at the change's
  resourceVersion, and one that makes it match is an ``ADDED``;
- a ``BOOKMARK`` carries only ``metadata.resourceVersion``; the server sends one
  only when that version is newer than what the stream last sent. kube-apiserver
  sends them about every minute and 2 s before the timeout; here every
  ``bookmark_interval`` virtual seconds and 2 s before the timeout.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

from headroom.kube.transport import ApiError, ApiUnavailableError
from headroom_dev.sim.fakeapi.faults import EventFate, Fate
from headroom_dev.sim.fakeapi.jsonvalue import clone
from headroom_dev.sim.fakeapi.kinds import Target, parse_path
from headroom_dev.sim.fakeapi.selectors import Matcher, parse_selector
from headroom_dev.sim.fakeapi.store import Change

if TYPE_CHECKING:
    from headroom_dev.sim.fakeapi.client import FakeClient

JSON = dict[str, Any]
_Item = tuple[str, JSON, int | None]  # event type, object (shared), resourceVersion override


def expired_status(asked: int | str, oldest: int) -> JSON:
    """The Status a 410 carries, worded as kube-apiserver words it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {asked} ({oldest})",
        "reason": "Expired",
        "code": 410,
    }


class WatchStream:
    """The events of one WATCH; iterate it with ``async for``. Transport.watch returns one."""

    def __init__(
        self,
        client: FakeClient,
        stream_id: int,
        path: str,
        resource_version: str,
        label_selector: str | None,
        timeout_seconds: int,
    ) -> None:
        self._client, self.id = client, stream_id
        self._path, self._asked = path, resource_version
        self._selector_text, self._timeout = label_selector, timeout_seconds
        self._target: Target | None = None
        self._matches: Matcher | None = None
        self._queue: deque[_Item] = deque()
        self._opened = self._server_done = self._finished = self._head_checked = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._sent_revision = self._since = 0
        self.delivered = 0

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> JSON:
        if self._finished:
            raise StopAsyncIteration
        try:
            return await self._next()
        except BaseException:  # end of stream, an error, or the reader was cancelled
            self._finish()
            raise

    async def aclose(self) -> None:
        """The client hangs up."""
        self._finish()

    # -- client side -----------------------------------------------------------------------

    async def _next(self) -> JSON:
        client = self._client
        if not self._opened:
            await self._open()
        faults = client.faults
        while True:
            await client.gate()
            if self._error is not None:
                raise self._error
            if self._queue:
                if faults is not None and not self._head_checked:
                    self._head_checked = True
                    if faults.breaks_stream():
                        raise ApiUnavailableError(f"{client.name}: watch stream broken (fault)")
                    if faults.expires_stream():
                        self._queue.clear()
                        store = client.server.store
                        oldest = store.revision
                        self._queue.append(
                            ("ERROR", expired_status(self._sent_revision, oldest), None)
                        )
                        self._close_server_side()
                    delay = faults.event_delay()
                    if delay > 0:
                        await client.sleep(delay)
                        continue
                self._head_checked = False
                self.delivered += 1
                return self._render(self._queue.popleft())
            if self._server_done:
                raise StopAsyncIteration
            await self._wait()

    async def _wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    @staticmethod
    def _render(item: _Item) -> JSON:
        type_, obj, revision = item
        if type_ in ("BOOKMARK", "ERROR"):
            return {"type": type_, "object": obj}
        copy: JSON = clone(obj)
        if revision is not None:
            copy["metadata"]["resourceVersion"] = str(revision)
        return {"type": type_, "object": copy}

    async def _open(self) -> None:
        client = self._client
        server, store = client.server, client.server.store
        fate = client.faults.fate("watch") if client.faults is not None else Fate.OK
        await client.travel()
        if fate in (Fate.REFUSED, Fate.ANSWER_LOST):
            raise ApiUnavailableError(f"{client.name}: connection refused (fault)")
        error = fate.error()
        if error is not None:
            raise error
        self._opened = True
        target = self._target = parse_path(self._path)
        if target.name is not None:
            raise ApiError(405, "MethodNotAllowed", "watch a collection, not one object")
        self._matches = parse_selector(self._selector_text)
        loop = asyncio.get_running_loop()
        if self._asked in ("", "0"):  # "any version": the current objects, then changes
            since, backlog = (
                store.revision,
                [
                    Change(store.revision, "ADDED", obj, None)
                    for obj in store.all(target.kind, target.namespace)
                ],
            )
        else:
            try:
                since = int(self._asked)
            except ValueError:
                raise ApiError(
                    500,
                    "",
                    f'resourceVersion: Invalid value: "{self._asked}": strconv.ParseUint: '
                    f'parsing "{self._asked}": invalid syntax',
                ) from None
            changes = store.changes_since(target.kind, since)
            if changes is None:
                status = expired_status(since, store.compacted[target.kind])
                if server.expired_watch == "api_error":
                    raise ApiError(410, "Expired", status["message"])
                self._queue.append(("ERROR", status, None))
                self._server_done = True
                return
            backlog = changes
        self._sent_revision = since
        store.watchers[target.kind][self.id] = self
        client.streams[self.id] = self
        for change in backlog:
            self.offer(change)
        self._since = since  # from now on, only what comes after it
        now = loop.time()
        deadline = now + self._timeout
        self._timers["deadline"] = loop.call_at(deadline, self._close_server_side)
        last_bookmark = deadline - 2.0
        if last_bookmark > now:
            self._timers["last-bookmark"] = loop.call_at(last_bookmark, self._bookmark)
        interval = server.bookmark_interval
        if interval and now + interval < last_bookmark:
            self._timers["bookmark"] = loop.call_at(
                now + interval, self._periodic_bookmark, interval, last_bookmark
            )

    # -- server side -------------------------------------------------------------------------

    def offer(self, change: Change) -> None:
        """A committed change of this kind: filter it and queue what the client would see."""
        if change.revision <= self._since:
            return  # asked from a version not reached yet: only what comes after it
        obj = change.obj
        target = self._target
        if (
            target is not None
            and target.namespace is not None
            and obj["metadata"].get("namespace") != target.namespace
        ):
            return
        matches = self._matches
        item: _Item
        if matches is None:
            item = (change.type, obj, None)
        elif change.type == "DELETED":
            if not matches(obj["metadata"].get("labels")):
                return
            item = ("DELETED", obj, None)
        else:
            now_in = matches(obj["metadata"].get("labels"))
            was_in = change.prev is not None and matches(change.prev["metadata"].get("labels"))
            if now_in:
                item = ("MODIFIED" if was_in else "ADDED", obj, None)
            elif was_in and change.prev is not None:
                item = ("DELETED", change.prev, change.revision)
            else:
                return
        self._sent_revision = change.revision
        faults = self._client.faults
        fate = faults.event_fate() if faults is not None else EventFate.DELIVER
        if fate is EventFate.DROP:
            return
        self._queue.append(item)
        if fate is EventFate.DUPLICATE:
            self._queue.append(item)
        self._wake()

    def _bookmark(self) -> None:
        if self._server_done or self._target is None:
            return
        revision = self._client.server.store.revision
        if revision <= self._sent_revision:
            return
        self._sent_revision = revision
        kind = self._target.kind
        self._queue.append(
            (
                "BOOKMARK",
                {
                    "apiVersion": kind.api_version,
                    "kind": kind.kind,
                    "metadata": {"resourceVersion": str(revision)},
                },
                None,
            )
        )
        self._wake()

    def _periodic_bookmark(self, interval: float, last_bookmark: float) -> None:
        self._bookmark()
        loop = asyncio.get_running_loop()
        if not self._server_done and loop.time() + interval < last_bookmark:
            self._timers["bookmark"] = loop.call_later(
                interval, self._periodic_bookmark, interval, last_bookmark
            )

    def fail(self, error: BaseException) -> None:
        """The connection is gone (the client was killed): the reader gets ``error``."""
        self._error = error
        self._close_server_side()

    def _close_server_side(self) -> None:
        self._server_done = True
        self._unregister()
        self._wake()

    def _finish(self) -> None:
        self._finished = True
        self._server_done = True
        self._unregister()
        self._client.streams.pop(self.id, None)

    def _unregister(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._target is not None:
            self._client.server.store.watchers[self._target.kind].pop(self.id, None)
