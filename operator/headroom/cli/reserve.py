"""``kubectl headroom reserve``: create a Reservation and, with ``--wait``, wait for its decision.

A wait that runs out deletes the reservation it created (unless
``--keep-on-timeout``): left behind, it would be admitted later, when the operator
gets to it, and hold memory nobody uses; the same command run again would get 409.
The delete is conditional on the object's uid and resourceVersion as last seen, so
it never deletes another object of the same name, nor one whose decision arrived
in the meantime: that decision is reported instead.

``--node auto`` picks the best node now (``kubectl headroom fit``'s order) and, with
``--wait``, when that node refuses it for lack of room (it filled up since the
NodeHeadrooms were written), deletes it and tries the next, at most three nodes;
each attempt is a new reservation.

``--gpus N`` spreads ``--vram`` over N GPU devices (``spec.gpus``). An admission on
devices is printed with them, a second line: ``devices: GPU-…,GPU-…`` and the
``CUDA_VISIBLE_DEVICES`` value they make (only when every id is a UUID); ``-o json``
has them in ``devices`` as the status does.

``--wait-for-room D`` sets ``spec.wait``: a reservation that does not fit now is
Queued for up to D instead of refused; ``--wait`` then waits through the queue
(the default ``--timeout`` grows by D), and ``--node auto`` may pick a node where
it could fit once others leave when none has room now.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from headroom.cli import arguments, readers
from headroom.cli.exits import (
    CommandError,
    Exit,
    UsageError,
    describe_api_error,
    describe_connection_error,
)
from headroom.cli.output import emit
from headroom.client import placement, procedure
from headroom.client.devices import cuda_visible_devices, device_list, devices_of
from headroom.client.errors import ClaimRefusedError, PlacementError
from headroom.client.procedure import NODE_FULL
from headroom.client.spec import ClaimRequest

JSON = dict[str, Any]
DECIDED = ("Admitted", "Rejected", "Reclaimed")
POLL_SECONDS = 0.2
#: Conditional deletes retried while others (heartbeats) keep changing the object.
DELETE_ATTEMPTS = 5


def command(args: argparse.Namespace) -> int:
    request = arguments.claim_request(args)
    timeout = (
        arguments.duration(args.timeout, "--timeout")
        if args.timeout is not None
        else procedure.default_timeout(request)
    )
    if args.selector is not None and request.node is not None:
        raise UsageError("-l/--selector: only with --node auto")
    cluster = readers.connect(args.kubeconfig, args.context, args.namespace)
    nodes = [request.node] if request.node is not None else _best_nodes(cluster, request, args)
    deadline = time.monotonic() + timeout.total_seconds()
    for index, node in enumerate(nodes):
        body = request.body(node)
        if "name" not in body["metadata"]:
            body["metadata"]["generateName"] = "rsv-"
        try:
            created = readers.create_reservation(cluster, body)
        except ClaimRefusedError as at_create:  # strict mode: refused at create, never made
            said = f"{at_create.reason}: {at_create.message}"
            if request.node is None and at_create.reason in NODE_FULL and index + 1 < len(nodes):
                print(
                    f"node {node} refused it at create ({said}); trying node {nodes[index + 1]}",
                    file=sys.stderr,
                )
                continue
            raise CommandError(Exit.REFUSED, f"refused at create on node {node}: {said}") from None
        name = created["metadata"]["name"]
        chosen = "" if request.node is not None else f" on node {node} ({placement.ORDER_RULE})"
        if not args.wait:
            emit(
                _data(cluster, created),
                f"reservation.headroom.dev/{name} created{chosen}",
                args.output,
            )
            return Exit.DONE
        obj = _waited(cluster, created, deadline)
        if _phase(obj) not in DECIDED:
            return _timed_out(cluster, obj, args, timeout)
        status = obj.get("status") or {}
        refused = status.get("phase") == "Rejected" and status.get("reason") in NODE_FULL
        if request.node is None and refused and index + 1 < len(nodes):
            procedure.delete_quietly(cluster, name, obj["metadata"]["uid"])
            print(
                f"node {node} refused reservation {cluster.namespace}/{name} "
                f"({status.get('reason')}: {status.get('message')}); deleted it, "
                f"trying node {nodes[index + 1]}",
                file=sys.stderr,
            )
            continue
        return _decided(cluster, obj, args)
    raise AssertionError("unreachable: the last attempt returns")


def _best_nodes(
    cluster: readers.Cluster, request: ClaimRequest, args: argparse.Namespace
) -> list[str]:
    """``--node auto``: the nodes to try, best first, at most MOST_NODES."""
    try:
        rooms = placement.read(
            cluster, request.ram_mb, request.vram_mb, args.selector, request.gpus
        )
    except PlacementError as error:
        raise CommandError(Exit.UNREACHABLE, str(error)) from None
    may_wait = request.wait is not None
    best = placement.candidates(rooms, may_wait=may_wait, most=procedure.MOST_NODES)
    if not best:
        raise CommandError(
            Exit.REFUSED,
            placement.no_room(rooms, request.ram_mb, request.vram_mb, args.selector, request.gpus),
        )
    return [room.node for room in best]


def _data(cluster: readers.Cluster, obj: JSON) -> JSON:
    return {
        "name": obj["metadata"]["name"],
        "namespace": cluster.namespace,
        "uid": obj["metadata"]["uid"],
        "node": obj["spec"]["node"],
        **(obj.get("status") or {}),
    }


def _phase(obj: JSON) -> str | None:
    phase = (obj.get("status") or {}).get("phase")
    return str(phase) if phase else None


def _waited(cluster: readers.Cluster, obj: JSON, deadline: float) -> JSON:
    """The reservation once decided, or as last seen when the deadline came first."""
    try:
        while _phase(obj) not in DECIDED:
            left = deadline - time.monotonic()
            if left <= 0:
                return obj
            time.sleep(min(POLL_SECONDS, left))
            try:
                obj = readers.reservation(cluster, obj["metadata"]["name"])
            except ApiException as error:
                if error.status != 404:
                    raise
                raise CommandError(
                    Exit.UNREACHABLE,
                    f"reservation {cluster.namespace}/{obj['metadata']['name']} was deleted "
                    "while waiting for its decision",
                ) from None
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
        problem = (
            describe_api_error(error)
            if isinstance(error, ApiException)
            else describe_connection_error(error)
        )
        raise CommandError(
            Exit.UNREACHABLE,
            f"{problem} (while waiting for reservation {cluster.namespace}/"
            f"{obj['metadata']['name']}, which was created and may still exist)",
        ) from None
    return obj


def _decided(cluster: readers.Cluster, obj: JSON, args: argparse.Namespace) -> int:
    name, status = obj["metadata"]["name"], obj.get("status") or {}
    phase = status["phase"]
    text = f"reservation.headroom.dev/{name} {phase.lower()}: {status.get('message', '')}"
    held = devices_of(status) if phase == "Admitted" else ()
    if held:
        text += f"\ndevices: {device_list(held)}"
        cuda = cuda_visible_devices(held)
        text += (
            f" (CUDA_VISIBLE_DEVICES={cuda})" if cuda else " (not UUIDs: no CUDA_VISIBLE_DEVICES)"
        )
    emit(_data(cluster, obj), text, args.output)
    if phase != "Admitted":
        print(f"{status.get('reason')}: {status.get('message')}", file=sys.stderr)
        return Exit.REFUSED
    return Exit.DONE


def _timed_out(
    cluster: readers.Cluster, obj: JSON, args: argparse.Namespace, timeout: timedelta
) -> int:
    name, uid = obj["metadata"]["name"], obj["metadata"]["uid"]
    waited = args.timeout or f"{timeout.total_seconds():g}s"
    what = f"no decision on reservation {cluster.namespace}/{name} within {waited}"
    if args.keep_on_timeout:
        raise CommandError(
            Exit.TIMED_OUT,
            f"{what}; kept it (--keep-on-timeout): it is decided when the operator gets to "
            f"it; `kubectl delete rsv {name} -n {cluster.namespace}` releases it",
        )
    for _ in range(DELETE_ATTEMPTS):
        try:
            readers.delete_reservation(cluster, name, uid, obj["metadata"]["resourceVersion"])
        except ApiException as error:
            if error.status == 404:
                raise CommandError(Exit.TIMED_OUT, f"{what}; it is already gone") from None
            if error.status != 409:
                raise
        else:
            raise CommandError(Exit.TIMED_OUT, f"{what}; deleted it (--keep-on-timeout keeps it)")
        # 409: changed since last seen. Decided in the meantime: report that.
        try:
            obj = readers.reservation(cluster, name)
        except ApiException as error:
            if error.status == 404:
                raise CommandError(Exit.TIMED_OUT, f"{what}; it is already gone") from None
            raise
        if obj["metadata"]["uid"] != uid:
            raise CommandError(Exit.TIMED_OUT, f"{what}; it is already gone (replaced)")
        if _phase(obj) in DECIDED:
            return _decided(cluster, obj, args)
    raise CommandError(
        Exit.TIMED_OUT,
        f"{what}; could not delete it (it kept changing): "
        f"`kubectl delete rsv {name} -n {cluster.namespace}` releases it",
    )
