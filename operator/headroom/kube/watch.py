"""Follow one resource with a WATCH that starts where the ledger's own LIST ended.

Why Reservations are not watched through kopf: kopf opens every watch with a LIST
of its own and replays it as events, so a restart with 10,000 reservations handled
each one twice (once in the rebuild, once in the replay: about 6 s of CPU, most of
it a deepcopy per object in kopf's diff-base storage), and kopf then keeps state
for every object for as long as it runs. The rebuild's LIST is already a
consistent snapshot with a resourceVersion; a WATCH from that version delivers
exactly the changes after it, with no gap and no replay. Nodes and owner Pods are
followed the same way, for the same reason, and so that the simulation drives the
very code production runs.

When the version is too old for the server (410 Gone, after etcd compaction) the
follower calls ``relist``, the feed's full list (for Reservations, the resync, which
releases what vanished and queues what is new), and watches on from that list's version. A broken
connection (API server restarted, network) is retried from the last version seen,
so nothing is missed and nothing is replayed.

Each new stream is told to ``restarted`` with why the last one ended (``ended``:
the server closed it, as it does at its timeout; ``expired``: 410, relisted;
``failed``: an error or no answer), for the ``headroom_watch_restarts_total`` metric.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable

from headroom.kube.backoff import Backoff
from headroom.kube.retry import api_failure, retry_call
from headroom.kube.transport import JSON, ApiError, Transport

log = logging.getLogger(__name__)


async def follow(
    transport: Transport,
    path: str,
    resource_version: str | None,
    on_event: Callable[[str, JSON], None],
    relist: Callable[[], Awaitable[str]],
    *,
    label_selector: str | None = None,
    rng: random.Random | None = None,
    backoff: Backoff | None = None,
    restarted: Callable[[str], None] = lambda reason: None,
) -> None:
    """Deliver every ADDED/MODIFIED/DELETED event after ``resource_version``, forever."""
    version: str | None = resource_version
    backoff = backoff or Backoff(base=0.5, cap=10.0, rng=rng)

    async def one_stream() -> None:
        """Watch until the stream ends; a 410 relists (no delay), anything else is raised."""
        nonlocal version
        try:
            if version is None:
                version = await relist()
                log.info("relisted %s at resourceVersion %s", path, version)
            async for event in transport.watch(
                path, resource_version=version, label_selector=label_selector
            ):
                version = _deliver(event, version, on_event)
                backoff.reset()
            restarted("ended")  # the server ended the watch (its timeout): watch on from there
        except ApiError as error:  # an answer, or an ERROR event inside the stream
            if not error.gone:
                raise
            log.info("watch of %s expired at resourceVersion %s; relisting", path, version)
            version = None
            restarted("expired")

    def broke(error: Exception, delay: float) -> None:
        restarted("failed")
        log.warning("watch of %s broke (%s); again in %.1fs", path, error, delay)

    while True:  # from the last version seen; the backoff starts over at each event
        await retry_call(one_stream, backoff=backoff, retry_on=api_failure, on_retry=broke)


def _deliver(event: JSON, version: str, on_event: Callable[[str, JSON], None]) -> str:
    """Hand one event on; return the resourceVersion to resume from."""
    kind, obj = event.get("type"), event.get("object") or {}
    if kind == "ERROR":  # a Status object, e.g. 410 when the version was compacted away
        raise ApiError(int(obj.get("code") or 500), obj.get("reason", ""), obj.get("message", ""))
    resumed = (obj.get("metadata") or {}).get("resourceVersion") or version
    if kind in ("ADDED", "MODIFIED", "DELETED"):
        try:
            on_event(kind, obj)
        except Exception:  # one bad object must not end the watch for all the others
            log.exception("handling %s of %s failed", kind, (obj.get("metadata") or {}).get("name"))
    return str(resumed)
