"""A Service's stand-in on loopback: one port that spreads TCP connections over backends.

kube-proxy sends each new connection to one of a Service's ready endpoints and keeps
it there. Tests that run several operator replicas as local processes need the same in
front of their extender ports, so that kube-scheduler reaches whichever replica the
connection lands on, as in a cluster. A backend that refuses the connection (a killed
replica, whose endpoint a cluster removes) is skipped for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading

from headroom_dev.process import free_port


class LoopbackService:
    def __init__(self, backends: list[int]) -> None:
        self.port = free_port()
        self._backends = backends
        self._turn = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loopback-service", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LoopbackService:
        self._thread.start()
        self._started.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", self.port)
        )
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = None
        for _ in self._backends:
            port = self._backends[next(self._turn) % len(self._backends)]
            with contextlib.suppress(OSError):
                upstream = await asyncio.open_connection("127.0.0.1", port)
                break
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()
