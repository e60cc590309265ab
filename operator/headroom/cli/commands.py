"""``kubectl headroom`` subcommands: nodes, reserve, heartbeat (``why`` and ``summary`` have
their own modules).

Each does what the caller's rights allow and says on stderr what it could not
read: a tenant bound to ``headroom-edit`` in one namespace may read its
reservations but not the cluster-scoped NodeHeadrooms, and may not list Events.
"""

from __future__ import annotations

import argparse

from kubernetes.client.exceptions import ApiException

from headroom.cli import arguments, readers
from headroom.cli.exits import CommandError, Exit, describe_api_error, is_forbidden
from headroom.cli.output import emit, table
from headroom.client.placement import NODEHEADROOM_GRANT

Args = argparse.Namespace
#: Phases in which a reservation holds no capacity, and never will again.
HOLDS_NOTHING = ("Rejected", "Reclaimed")


def _cluster(args: Args) -> readers.Cluster:
    return readers.connect(args.kubeconfig, args.context, args.namespace)


def read_reservation(cluster: readers.Cluster, name: str) -> readers.JSON:
    """The named reservation; a missing one ends the command (exit 4) saying where."""
    try:
        return readers.reservation(cluster, name)
    except ApiException as error:
        if error.status != 404:
            raise
        raise CommandError(
            Exit.UNREACHABLE,
            f'reservation "{name}" not found in namespace "{cluster.namespace}"',
        ) from None


def nodes(args: Args) -> int:
    try:
        items = readers.node_headrooms(_cluster(args))
    except ApiException as error:
        if not is_forbidden(error):
            raise
        raise CommandError(
            Exit.UNREACHABLE,
            f"cannot list NodeHeadrooms: {describe_api_error(error)}. {NODEHEADROOM_GRANT}",
        ) from None
    rows = []
    for item in items:
        s = item.get("status") or {}
        vram = s.get("reservedVRAMMB", 0)
        capacity = s.get("vramCapacityMB")
        rows.append(
            [
                item["metadata"]["name"],
                s.get("totalRAMMB"),
                s.get("reservedRAMMB"),
                f"{vram}/{capacity}" if capacity is not None else f"{vram}/-",
                s.get("allocatableRAMMB"),
                s.get("utilizationPercent"),
                s.get("activeEntries"),
                s.get("staleEntries"),
            ]
        )
    data = [{"node": i["metadata"]["name"], **(i.get("status") or {})} for i in items]
    headers = ["NODE", "TOTAL", "RESERVED", "VRAM", "ALLOCATABLE", "UTIL%", "ENTRIES", "STALE"]
    emit(data, table(headers, rows), args.output)
    return Exit.DONE


def heartbeat(args: Args) -> int:
    name = arguments.name(args.reservation)
    cluster = _cluster(args)
    # Read first: a heartbeat on a reservation that holds nothing keeps nothing alive.
    _refuse_if_holds_nothing(read_reservation(cluster, name), name)
    obj = readers.heartbeat(cluster, name)
    _refuse_if_holds_nothing(obj, name)  # decided between the read and the write
    phase = (obj.get("status") or {}).get("phase") or "Pending"
    note = "" if phase == "Admitted" else f" (not decided yet: {phase}; the heartbeat is recorded)"
    emit(
        {"name": name, "namespace": cluster.namespace, "phase": phase, "heartbeat": "sent"},
        f"reservation.headroom.dev/{name} heartbeat sent{note}",
        args.output,
    )
    return Exit.DONE


def _refuse_if_holds_nothing(obj: readers.JSON, name: str) -> None:
    status = obj.get("status") or {}
    if status.get("phase") in HOLDS_NOTHING:
        raise CommandError(
            Exit.REFUSED,
            f"reservation {name} holds nothing: {status['phase']} ({status.get('reason')}): "
            f"{status.get('message')}; a heartbeat cannot revive it",
        )
