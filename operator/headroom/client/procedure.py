"""How a claim is obtained, kept and given back, as procedures for ``plans``.

- **Obtain**: pick the node (or the best ones, see ``placement``), create the
  Reservation, poll until it is decided (through ``Queued``), and on a refusal
  delete it and raise :class:`ClaimRefusedError` — or, when the node was picked
  automatically and filled up in the meantime, try the next one (each attempt a
  new reservation). Whatever interrupts this (a timeout, Ctrl-C, SIGTERM, a
  cancelled task) deletes what was created: an undecided claim left behind would
  be admitted later and hold memory nobody uses (and, with nobody to heartbeat it,
  be reclaimed only after the stale window).
- **Keep**: heartbeat at once (the stale clock starts at admission), then every
  third of the node's stale window; a claim seen ``Reclaimed``, deleted or
  replaced is *lost*, and the caller is told.
- **Release**: delete with a uid precondition, so that another reservation that
  took the same name is never deleted; one already gone is fine.

Polling, not a watch: a decision usually takes milliseconds (``make bench`` B2:
p99 60 ms), so the first polls are 0.1 s apart, backing off to 1 s for one that
queues; polling needs no long-lived connection, so neither a thread nor a
cancelled task is ever left blocked in a watch.
"""

from __future__ import annotations

import logging
import secrets
import string
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from headroom.client import calls, placement
from headroom.client.connection import Connection
from headroom.client.devices import devices_of
from headroom.client.errors import (
    ClaimError,
    ClaimLostError,
    ClaimRefusedError,
    ClaimTimeoutError,
    NoNodeFitsError,
    api_message,
)
from headroom.client.held import Held
from headroom.client.plans import Plan, call, pause
from headroom.client.spec import ClaimRequest

JSON = dict[str, Any]
log = logging.getLogger("headroom.client")

DECIDED = ("Admitted", "Rejected", "Reclaimed")
HOLDS_NOTHING = ("Rejected", "Reclaimed")
#: Refusals that say "this node is full now" (or, under strict FIFO, "others wait ahead
#: here"): automatic placement tries the next node.
NODE_FULL = ("InsufficientRAM", "InsufficientVRAM", "TooManyEntries", "WaitersAhead")
#: Nodes tried at most by automatic placement.
MOST_NODES = 3
#: Without a ``wait``, how long to wait for the decision by default.
DEFAULT_TIMEOUT = timedelta(seconds=60)
#: Heartbeats come at this fraction of the node's stale window.
HEARTBEAT_FRACTION = 1 / 3
#: After a failed heartbeat, the next try comes at most this much later.
HEARTBEAT_RETRY = 5.0
#: While the node's NodeHeadroom is not readable yet (a node just added), heartbeat this
#: often and read it again (``held.UNREAD_WINDOW_TRIES`` times) before settling on the
#: default: the node's window may be shorter than the default interval.
UNREAD_WINDOW_PACE = 1.0
FIRST_POLL, LONGEST_POLL, POLL_BACKOFF = 0.1, 1.0, 1.5
#: Connection-level failures: the API server did not answer.
NO_ANSWER = (OSError, urllib3.exceptions.HTTPError)
Report = Callable[[str], None]


def default_timeout(request: ClaimRequest) -> timedelta:
    """How long to wait for a decision: a minute, plus the claim's own wait."""
    return DEFAULT_TIMEOUT + (request.wait_for or timedelta(0))


def _polls() -> Iterator[float]:
    delay = FIRST_POLL
    while True:
        yield delay
        delay = min(LONGEST_POLL, delay * POLL_BACKOFF)


def _generated_name() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "claim-" + "".join(secrets.choice(alphabet) for _ in range(10))


def delete_quietly(conn: Connection, name: str, uid: str) -> bool:
    """Delete this very reservation; True when it is gone (deleted now or before)."""
    try:
        calls.delete(conn, name, uid)
    except ApiException as error:
        if error.status in (404, 409):  # gone, or another object took the name
            return True
        log.warning("could not delete reservation %s/%s: %s", conn.namespace, name, error)
        return False
    except NO_ANSWER as error:
        log.warning("could not delete reservation %s/%s: %s", conn.namespace, name, error)
        return False
    return True


def _delete_generated(conn: Connection, name: str) -> None:
    """After a create that was interrupted: delete the object if it landed (the name was
    generated here, so an object of that name is ours)."""
    try:
        obj = calls.get(conn, name)
    except (ApiException, *NO_ANSWER):
        return
    delete_quietly(conn, name, obj["metadata"]["uid"])


def _refusal(conn: Connection, obj: JSON) -> ClaimRefusedError:
    status = obj.get("status") or {}
    return ClaimRefusedError(
        namespace=conn.namespace,
        name=obj["metadata"]["name"],
        node=obj["spec"]["node"],
        phase=str(status.get("phase")),
        reason=str(status.get("reason")),
        message=str(status.get("message")),
    )


def obtain(
    conn: Connection,
    request: ClaimRequest,
    *,
    timeout: timedelta,
    selector: str | None = None,
    report: Report,
) -> Plan[Held]:
    """Claim on ``request.node``, or on the best nodes in turn when it is None."""
    deadline = time.monotonic() + timeout.total_seconds()
    if request.node is not None:
        nodes = [request.node]
    else:
        rooms = yield from call(
            placement.read, conn, request.ram_mb, request.vram_mb, selector, request.gpus
        )
        chosen = placement.candidates(rooms, may_wait=request.wait is not None, most=MOST_NODES)
        if not chosen:
            raise NoNodeFitsError(
                placement.no_room(rooms, request.ram_mb, request.vram_mb, selector, request.gpus)
            )
        nodes = [room.node for room in chosen]
        report(f"node {nodes[0]} chosen ({placement.ORDER_RULE}; candidates: {nodes})")
    refused: list[ClaimRefusedError] = []
    for index, node in enumerate(nodes):
        try:
            obj = yield from _attempt(conn, request, node, deadline, timeout, report)
        except ClaimRefusedError as at_create:  # strict mode: it never existed
            if request.node is None and at_create.reason in NODE_FULL and index + 1 < len(nodes):
                refused.append(at_create)
                report(f"node {node} refused it at create; trying node {nodes[index + 1]}")
                continue
            raise
        status = obj.get("status") or {}
        if status.get("phase") == "Admitted":
            return Held(
                conn,
                obj["metadata"]["name"],
                obj["metadata"]["uid"],
                node,
                request.ram_mb,
                request.vram_mb,
                str(status.get("message") or ""),
                devices=devices_of(status),
                refused_by=refused,
            )
        yield from call(delete_quietly, conn, obj["metadata"]["name"], obj["metadata"]["uid"])
        refusal = _refusal(conn, obj)
        if request.node is None and refusal.reason in NODE_FULL and index + 1 < len(nodes):
            refused.append(refusal)
            report(
                f"node {node} refused it ({refusal.reason}: {refusal.message}); "
                f"trying node {nodes[index + 1]}"
            )
            continue
        raise refusal
    raise AssertionError("unreachable: the last attempt returns or raises")


def _attempt(
    conn: Connection,
    request: ClaimRequest,
    node: str,
    deadline: float,
    timeout: timedelta,
    report: Report,
) -> Plan[JSON]:
    """One reservation on one node, until decided; deleted if anything interrupts."""
    body = request.body(node)
    generated = request.name is None
    for _ in range(3):
        if generated:
            body["metadata"]["name"] = _generated_name()
        try:
            obj: JSON = yield from call(calls.create, conn, body)
            break
        except ApiException as error:
            if not (generated and error.status == 409):  # a generated name already taken
                raise
        except (GeneratorExit, ClaimRefusedError):  # refused at create: nothing was made
            raise
        except BaseException:  # interrupted mid-call: the create may have landed
            if generated:
                yield from call(_delete_generated, conn, body["metadata"]["name"])
            raise
    else:
        raise ClaimError(f"no free name for a claim in namespace {conn.namespace}")
    name, uid = obj["metadata"]["name"], obj["metadata"]["uid"]
    try:
        return (yield from _decision(conn, obj, deadline, timeout, report))
    except GeneratorExit:
        raise
    except BaseException:
        yield from call(delete_quietly, conn, name, uid)
        raise


def _decision(
    conn: Connection, obj: JSON, deadline: float, timeout: timedelta, report: Report
) -> Plan[JSON]:
    name, uid = obj["metadata"]["name"], obj["metadata"]["uid"]
    polls, queued_at = _polls(), None
    while calls.phase(obj) not in DECIDED:
        left = deadline - time.monotonic()
        if left <= 0:
            return (yield from _timed_out(conn, obj, timeout))
        yield from pause(min(next(polls), left))
        try:
            obj = yield from call(calls.get, conn, name)
        except ApiException as error:
            if error.status != 404:
                raise
            raise ClaimLostError(
                f"{conn.namespace}/{name}", "Deleted", "deleted while waiting for its decision"
            ) from None
        if obj["metadata"]["uid"] != uid:
            raise ClaimLostError(
                f"{conn.namespace}/{name}", "Replaced", "replaced while waiting for its decision"
            )
        status = obj.get("status") or {}
        if calls.phase(obj) == "Queued" and status.get("queuePosition") != queued_at:
            queued_at = status.get("queuePosition")
            report(
                f"reservation {conn.namespace}/{name} queued on node {obj['spec']['node']} "
                f"at position {queued_at} ({status.get('reason')}: {status.get('message')})"
            )
    return obj


def _timed_out(conn: Connection, obj: JSON, timeout: timedelta) -> Plan[JSON]:
    """Give up waiting: delete it as last seen, unless a decision arrived meanwhile (then
    that decision stands). Raises ClaimTimeoutError; the caller's clean-up deletes it for sure."""
    name, uid = obj["metadata"]["name"], obj["metadata"]["uid"]
    try:
        yield from call(calls.delete, conn, name, uid, obj["metadata"]["resourceVersion"])
    except ApiException as error:
        if error.status != 409:
            raise
        latest = yield from call(calls.get, conn, name)  # changed: decided meanwhile?
        if latest["metadata"]["uid"] == uid and calls.phase(latest) in DECIDED:
            return latest
    seconds = timeout.total_seconds()
    raise ClaimTimeoutError(
        f"no decision on reservation {conn.namespace}/{name} within {seconds:g}s; deleted it"
    )


def stale_window_interval(conn: Connection, node: str) -> float | bool:
    """A third of the node's heartbeat stale window, from its NodeHeadroom. When it cannot
    be read: True if it may be readable later (not written yet, no answer), False if not
    (the caller may not read NodeHeadrooms: a tenant)."""
    try:
        headroom = calls.node_headroom(conn, node)
    except ApiException as error:
        log.debug("NodeHeadroom %s not readable: %s", node, api_message(error))
        return error.status not in (401, 403)
    except NO_ANSWER as error:
        log.debug("NodeHeadroom %s not readable: %s", node, error)
        return True
    seconds = (headroom.get("status") or {}).get("staleWindowSeconds")
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds <= 0:
        return True
    return seconds * HEARTBEAT_FRACTION


def pace(held: Held, interval: float | None) -> Plan[Held]:
    """Set how often ``held`` heartbeats: the caller's interval, else from its node."""
    if interval is not None:
        held.heartbeat_interval, held.interval_from = interval, "caller"
        held.unread_window = 0
        return held
    found = yield from call(stale_window_interval, held.conn, held.node)
    if isinstance(found, float):
        held.heartbeat_interval, held.interval_from = found, "NodeHeadroom"
        held.unread_window = 0
    elif not found:
        held.unread_window = 0
    return held


def beat(held: Held) -> ClaimLostError | None:
    """One heartbeat; the loss it reveals, if any. Transient failures raise."""
    try:
        obj = calls.heartbeat(held.conn, held.name, held.uid)
    except ApiException as error:
        if error.status == 404:
            return ClaimLostError(held.reference, "Deleted", "the reservation was deleted")
        if error.status == 422 and "metadata.uid" in api_message(error):
            # the uid differs: another object took the name
            return ClaimLostError(
                held.reference, "Replaced", "another reservation of the same name replaced it"
            )
        raise
    status = obj.get("status") or {}
    if status.get("phase") in HOLDS_NOTHING:
        return ClaimLostError(
            held.reference,
            str(status.get("reason")),
            f"{status.get('phase')}: {status.get('message')}",
        )
    return None


def heartbeats(held: Held, on_lost: Callable[[ClaimLostError], None] | None) -> Plan[None]:
    """Heartbeat until stopped (the driver's sleep raises) or the claim is lost."""
    delay = 0.0  # at once: the stale clock started when it was admitted
    while not held.stopping:
        yield from pause(delay)
        try:
            lost = yield from call(beat, held)
        except (ApiException, *NO_ANSWER) as error:
            problem = api_message(error) if isinstance(error, ApiException) else str(error)
            log.warning("heartbeat on %s failed (%s); trying again", held.reference, problem)
            delay = min(held.heartbeat_interval, HEARTBEAT_RETRY)
            continue
        if lost is not None:
            if held.stopping:  # our own release deleted it
                return
            held.lost = lost
            log.warning("%s", lost)
            if on_lost is not None:
                on_lost(lost)
            return
        delay = held.heartbeat_interval
        if held.unread_window > 0:
            held.unread_window -= 1
            yield from pace(held, None)
            delay = held.heartbeat_interval if held.unread_window == 0 else UNREAD_WINDOW_PACE
