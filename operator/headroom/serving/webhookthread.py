"""The webhook's server on a thread of its own, out of reach of the main loop's work.

Two things on the main loop would refuse opted-in pod creates during a takeover:

- kopf, as it stops, waits up to 5 s for every task created since it started and
  then cancels them all (it cannot tell its own from others'). The handlers of
  the API server's kept-alive webhook connections are such tasks: cancelled,
  their sockets stay open and unread, and the next review on one times out. The
  wait also held up the Lease's release by those 5 s.
- A new leader's rebuild fills the main loop for seconds under load; reviews
  queued behind it would miss the API server's timeout.

So the server runs on its own event loop on a daemon thread, as the Lease does
(:mod:`headroom.kube.leasethread`). The main loop only loads certificates into it
(scheduled onto its loop) and reads plain attributes (``ready``, ``port``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from headroom.serving.webhook import WebhookServer

STOP_SECONDS = 10.0  # aiohttp's own shutdown of open connections is bounded below this


class WebhookThread:
    """One :class:`WebhookServer`, served by a daemon thread with its own loop."""

    def __init__(self, server: WebhookServer) -> None:
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        return self.server.ready

    @property
    def port(self) -> int:
        return self.server.port

    def drain(self) -> None:
        """Every answer from now on closes its connection (see ``WebhookServer.drain``)."""
        self.server.drain()

    async def start(self) -> None:
        """Start the thread; return once the server listens (or raise why it cannot)."""
        listening: concurrent.futures.Future[None] = concurrent.futures.Future()

        def main() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self.server.start())
            except BaseException as error:  # handed to the caller
                listening.set_exception(error)
                self._loop.close()
                return
            listening.set_result(None)
            try:
                self._loop.run_forever()
            finally:
                self._loop.run_until_complete(self.server.stop())
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
                self._loop.close()

        self._thread = threading.Thread(target=main, name="webhook", daemon=True)
        self._thread.start()
        await asyncio.wrap_future(listening)

    async def load(self, cert_pem: bytes, key_pem: bytes, trust_pem: bytes | None = None) -> None:
        """Serve this pair from the next handshake on (done on the server's loop)."""
        loaded = asyncio.run_coroutine_threadsafe(
            self.server.load(cert_pem, key_pem, trust_pem), self._loop
        )
        await asyncio.wrap_future(loaded)

    async def stop(self) -> None:
        """Stop serving: open connections are closed, the thread ends."""
        if self._thread is None or not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join, STOP_SECONDS)
