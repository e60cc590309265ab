"""The Lease kept on its own thread, so the work it guards cannot starve it.

A leader that takes over under load (a rebuild of every reservation, a burst of
hundreds of events) keeps its event loop full for seconds. When the renewals ran
on that loop they queued behind the work, missed ``renew_deadline`` and the new
leader exited: nobody decided until the Deployment restarted a replica. client-go
renews on a goroutine of its own for the same reason. Here a thread runs its own
event loop and its own connection to the API server; the interpreter hands it
the GIL within its switch interval (5 ms) however busy the main loop is.

The main loop only reads: ``may_act()`` and ``time_left()`` are plain reads of
floats the lease thread writes, safe under the GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from headroom.kube.client import Credentials, KubeClient
from headroom.kube.clock import Clock
from headroom.kube.leader import LeaderElector, LeaseSettings

RELEASE_SECONDS = 5.0  # the release itself is bounded by 2 s (LeaderElector.release)


class LeaseThread:
    """One :class:`LeaderElector`, run on a daemon thread with its own loop and client."""

    def __init__(
        self,
        credentials: Credentials,
        settings: LeaseSettings,
        clock: Clock,
        *,
        on_error: Callable[[str, str], None] | None = None,
    ) -> None:
        """``on_error``: the lease client's failed requests (``KubeClient``), called on
        the lease thread."""
        self._credentials, self._settings, self._clock = credentials, settings, clock
        self._on_error = on_error
        self._elector: LeaderElector | None = None
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()  # bound to self._loop at its first wait
        self._thread: threading.Thread | None = None
        self._ended: asyncio.Future[None] | None = None

    @property
    def is_leader(self) -> bool:
        return self._elector is not None and self._elector.is_leader

    def may_act(self) -> bool:
        return self._elector is not None and self._elector.may_act()

    def time_left(self) -> float:
        return self._elector.time_left() if self._elector is not None else 0.0

    def leader_annotation(self, key: str) -> str | None:
        """:meth:`LeaderElector.leader_annotation` (a plain read, safe from any thread)."""
        return self._elector.leader_annotation(key) if self._elector is not None else None

    async def acquire(self, on_lost: Callable[[], None]) -> None:
        """Start the thread; return once it holds the Lease.

        ``on_lost`` is called *on the lease thread* once a renewal cannot be done
        in time; :meth:`held` ends when the thread does.
        """
        caller = asyncio.get_running_loop()
        acquired: asyncio.Future[None] = caller.create_future()
        ended = self._ended = caller.create_future()

        def settle(future: asyncio.Future[None], error: BaseException | None) -> None:
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        def tell(future: asyncio.Future[None], error: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop closed: nobody waits
                caller.call_soon_threadsafe(settle, future, error)

        def main() -> None:
            error: BaseException | None = None
            try:
                self._loop.run_until_complete(self._hold(on_lost, lambda: tell(acquired, None)))
            except BaseException as raised:  # handed to the caller's loop
                error = raised
            finally:
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
                self._loop.close()
            tell(acquired, error or RuntimeError("lease thread ended before it held the Lease"))
            tell(ended, error)

        self._thread = threading.Thread(target=main, name="lease", daemon=True)
        self._thread.start()
        try:
            await acquired
        except asyncio.CancelledError:  # stopped while a standby
            await self.release()
            raise

    async def held(self) -> None:
        """Wait while the thread holds the Lease; raise what ended it, if anything did."""
        if self._ended is not None:
            await asyncio.shield(self._ended)

    async def release(self) -> None:
        """Give the Lease up if held (a clean shutdown) and let the thread end."""
        if self._thread is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._stop.set)
        except RuntimeError:  # its loop has closed: the thread has ended
            return
        await asyncio.to_thread(self._thread.join, RELEASE_SECONDS)

    async def _hold(self, on_lost: Callable[[], None], acquired: Callable[[], None]) -> None:
        client = KubeClient(
            self._credentials, user_agent="headroom-operator/lease", on_error=self._on_error
        )
        try:
            self._elector = LeaderElector(client, self._settings, self._clock)
            if not await self._until_stopped(self._elector.acquire()):
                return
            acquired()
            if not await self._until_stopped(self._elector.hold(on_lost)):
                await self._elector.release()
        finally:
            await client.close()

    async def _until_stopped(self, work: Coroutine[Any, Any, None]) -> bool:
        """Run ``work`` until it ends (True) or a stop is asked (False, work cancelled)."""
        task = asyncio.create_task(work)
        stopping = asyncio.create_task(self._stop.wait())
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if task.done():
            task.result()  # raises what ended it
            return True
        task.cancel()
        # Let a write already on the wire finish or fail before the release is sent.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return False
