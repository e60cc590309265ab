"""``with claim("gpu-1", ram_mb=4096) as held:`` — memory held on a node for a block.

A program that claims memory must give it back however it ends: normally, by an
exception, or because it was told to stop. The context manager deletes the
reservation on every exit from the block; for SIGTERM (what Kubernetes, systemd
and ``kill`` send) it installs, for the block only and only in the main thread,
a handler that raises ``SystemExit(143)`` once, so that the block unwinds like on
any exception and the process then exits as a SIGTERM would have ended it. The
previous handler is put back afterwards. A SIGTERM that arrives while the claim is
being released waits until the release is done.

Heartbeats run in a daemon thread. If the claim is lost meanwhile (reclaimed,
deleted), the thread cannot interrupt the block: ``held.lost`` is set,
``held.check()`` raises it, and ``on_lost`` (if given) is called from the thread.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType, TracebackType
from typing import Any

from headroom.client import plans, procedure
from headroom.client.connection import Connection, connect, this_pod
from headroom.client.errors import ClaimLostError, InvalidClaimError
from headroom.client.held import ClaimView, Held
from headroom.client.placement import AutoNode
from headroom.client.procedure import Report
from headroom.client.spec import ClaimRequest, duration, request

log = logging.getLogger("headroom.client")
#: How long a release waits for a heartbeat in flight before deleting anyway.
HEARTBEAT_JOIN_SECONDS = 2.0


@dataclass(frozen=True)
class Options:
    """A claim's arguments, every one checked; shared by :func:`claim` and ``claim_async``."""

    request: ClaimRequest
    timeout: timedelta
    selector: str | None
    heartbeat_interval: float | None
    connection: Connection | None
    report: Report
    on_lost: Callable[[ClaimLostError], None] | None


def options(
    node: str | AutoNode,
    *,
    ram_mb: int,
    vram_mb: int,
    gpus: int | None,
    ttl: timedelta | str | None,
    wait: timedelta | str | None,
    timeout: timedelta | float | str | None,
    name: str | None,
    description: str | None,
    owner_pod: str | bool | None,
    selector: str | None,
    connection: Connection | None,
    heartbeat_interval: timedelta | float | None,
    on_lost: Callable[[ClaimLostError], None] | None,
    report: Report | None,
) -> Options:
    """Check everything before anything is sent; InvalidClaimError names what is wrong."""
    pod: str | None
    if owner_pod is True:
        pod = this_pod()
        if pod is None:
            raise InvalidClaimError(
                "spec.owner.pod",
                "spec.owner.pod: owner_pod=True names the pod this program runs in, from "
                "$POD_NAME, which is not set (set it with the downward API: "
                "env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}])",
            )
    else:
        pod = owner_pod or None
    checked = request(
        node=None if isinstance(node, AutoNode) else node,
        ram_mb=ram_mb,
        vram_mb=vram_mb,
        gpus=gpus,
        ttl=ttl,
        wait=wait,
        description=description,
        owner_pod=pod,
        name=name,
    )
    if selector is not None and not isinstance(node, AutoNode):
        raise InvalidClaimError("selector", "selector: only with automatic placement (node=AUTO)")
    if timeout is None:
        waited = procedure.default_timeout(checked)
    elif isinstance(timeout, timedelta | str):
        waited = duration(timeout, "timeout")
    else:
        waited = duration(timedelta(seconds=timeout), "timeout")
    interval: float | None = None
    if heartbeat_interval is not None:
        seconds = (
            heartbeat_interval.total_seconds()
            if isinstance(heartbeat_interval, timedelta)
            else float(heartbeat_interval)
        )
        interval = duration(timedelta(seconds=seconds), "heartbeat_interval").total_seconds()
    return Options(
        checked,
        waited,
        selector,
        interval,
        connection,
        report or (lambda line: log.info("%s", line)),
        on_lost,
    )


class _StopError(Exception):
    """Ends the heartbeat thread's procedure at its next pause."""


class _Heartbeats(threading.Thread):
    def __init__(self, held: Held, on_lost: Callable[[ClaimLostError], None] | None) -> None:
        super().__init__(name=f"headroom-heartbeat-{held.name}", daemon=True)
        self._held, self._on_lost, self._stopping = held, on_lost, threading.Event()

    def run(self) -> None:
        try:
            plans.run(procedure.heartbeats(self._held, self._on_lost), sleep=self._sleep)
        except _StopError:
            pass
        except Exception:
            log.exception("heartbeats on %s stopped", self._held.reference)

    def _sleep(self, seconds: float) -> None:
        if self._stopping.wait(seconds):
            raise _StopError

    def stop(self) -> None:
        self._stopping.set()
        if self is not threading.current_thread():
            self.join(HEARTBEAT_JOIN_SECONDS)


class Claim(ClaimView):
    """Memory held on a node: an admitted Reservation, heartbeated until released."""

    def __init__(self, held: Held, on_lost: Callable[[ClaimLostError], None] | None) -> None:
        super().__init__(held)
        self._beats = _Heartbeats(held, on_lost)
        self._lock = threading.Lock()
        #: The block's SIGTERM handler, deferred while the claim is released.
        self._sigterm: _Sigterm | None = None

    def heartbeat(self) -> None:
        """One heartbeat now (the background ones go on); ClaimLostError if it holds nothing."""
        lost = procedure.beat(self._held)
        if lost is not None:
            self._held.lost = lost
            raise lost

    def release(self) -> bool:
        """Stop heartbeating and delete the reservation (this very one: uid precondition).

        Idempotent; True when it is gone. False when the API server could not be
        reached: the claim then ends with its stale window, as nobody heartbeats it.
        """
        with self._lock, self._sigterm.deferred() if self._sigterm else nullcontext():
            if self._held.released:
                return True
            self._held.stopping = True
            self._beats.stop()
            gone = procedure.delete_quietly(self._held.conn, self._held.name, self._held.uid)
            self._held.released = True
            return gone

    def _start(self) -> None:
        self._beats.start()


class _Sigterm:
    """SIGTERM raises SystemExit(143) once while installed; deferred during a release."""

    def __init__(self) -> None:
        self._previous: Any = None
        self.raised = self.deferring = self.pending = False

    def install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.raised or self.deferring:
            self.pending = True
            return
        self.raised = True
        raise SystemExit(128 + signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)


class ClaimContext:
    """What :func:`claim` returns: entering claims (and waits for the decision),
    leaving releases."""

    def __init__(self, opts: Options, handle_sigterm: bool) -> None:
        self._opts = opts
        self._handle_sigterm = handle_sigterm
        self._sigterm: _Sigterm | None = None
        self._claim: Claim | None = None

    def __enter__(self) -> Claim:
        if self._handle_sigterm and threading.current_thread() is threading.main_thread():
            self._sigterm = _Sigterm()
            self._sigterm.install()
        try:
            self._claim = self._obtain()
        except BaseException:
            if self._claim is not None:  # a SIGTERM right after it was obtained
                self._claim.release()
            if self._sigterm is not None:
                self._sigterm.restore()
            raise
        return self._claim

    def _obtain(self) -> Claim:
        opts = self._opts
        conn = opts.connection or connect()
        held = plans.run(
            procedure.obtain(
                conn,
                opts.request,
                timeout=opts.timeout,
                selector=opts.selector,
                report=opts.report,
            )
        )
        try:
            plans.run(procedure.pace(held, opts.heartbeat_interval))
            claim = Claim(held, opts.on_lost)
            claim._sigterm = self._sigterm
            claim._start()
        except BaseException:
            procedure.delete_quietly(conn, held.name, held.uid)
            raise
        return claim

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        sigterm = self._sigterm
        try:
            if self._claim is not None:
                self._claim.release()  # SIGTERM deferred meanwhile
        finally:
            if sigterm is not None:
                sigterm.restore()
        if sigterm is not None and sigterm.pending and not sigterm.raised and kind is None:
            raise SystemExit(128 + signal.SIGTERM)


def claim(
    node: str | AutoNode,
    *,
    ram_mb: int = 0,
    vram_mb: int = 0,
    gpus: int | None = None,
    ttl: timedelta | str | None = None,
    wait: timedelta | str | None = None,
    timeout: timedelta | float | str | None = None,
    name: str | None = None,
    description: str | None = None,
    owner_pod: str | bool | None = None,
    selector: str | None = None,
    connection: Connection | None = None,
    heartbeat_interval: timedelta | float | None = None,
    on_lost: Callable[[ClaimLostError], None] | None = None,
    report: Report | None = None,
    handle_sigterm: bool = True,
) -> ClaimContext:
    """Claim memory on ``node`` (or on the best node: ``AUTO``) for a ``with`` block.

    Every argument is checked here, before any call: a value the Reservation schema
    would refuse raises :class:`InvalidClaimError`. Entering creates the reservation and
    waits for the decision (through ``Queued`` when ``wait`` allows) up to
    ``timeout`` (default: 60 s plus ``wait``); it returns a :class:`Claim`, or
    raises :class:`ClaimRefusedError` (the reason and the numbers), :class:`ClaimTimeoutError`
    or :class:`NoNodeFitsError`. Leaving the block releases it. ``gpus`` spreads
    ``vram_mb`` over that many GPU devices (default 1; 0: only the node's VRAM sum); the
    claim's ``devices`` and ``cuda_visible_devices`` say which. ``ttl`` sets a hard expiry;
    ``owner_pod=True`` names this pod (``$POD_NAME``), which must carry the label
    ``headroom.dev/owner=true``. ``report`` receives progress lines (queued, node
    chosen, node refused it); the default logs them. ``connection`` defaults to
    :func:`connect` (kubeconfig as kubectl, else in-cluster).
    """
    opts = options(
        node,
        ram_mb=ram_mb,
        vram_mb=vram_mb,
        gpus=gpus,
        ttl=ttl,
        wait=wait,
        timeout=timeout,
        name=name,
        description=description,
        owner_pod=owner_pod,
        selector=selector,
        connection=connection,
        heartbeat_interval=heartbeat_interval,
        on_lost=on_lost,
        report=report,
    )
    return ClaimContext(opts, handle_sigterm)
