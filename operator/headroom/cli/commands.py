"""``kubectl headroom`` subcommands: nodes, reserve, heartbeat (``why`` and ``summary`` have
their own modules).

Each does what the caller's rights allow and says on stderr what it could not
read: a tenant bound to ``headroom-edit`` in one namespace may read its
reservations but not the cluster-scoped NodeHeadrooms, and may not list Events.

``nodes`` adds a GPU-FREE column when some node lists its GPU devices: the most
MiB free on one device, the largest one-GPU claim that fits there (the node-wide
VRAM column alone would promise 150 GiB on 2 × 80 GiB GPUs holding 50 GiB
each). ``nodes --devices`` lists the devices themselves, one row each, rather
than a wide table: a node may have up to 1024 of them (MIG). Its OUTSIDE column is
the MiB held outside Headroom (DRA claims' consumed capacity), or who holds the
whole device (``DevicePlugin``, ``ResourceClaim``).
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
    if getattr(args, "devices", False):
        return _devices(items, args.output)
    with_devices = any(isinstance((i.get("status") or {}).get("devices"), list) for i in items)
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
                *([_gpu_free(s)] if with_devices else []),
                s.get("allocatableRAMMB"),
                s.get("utilizationPercent"),
                s.get("activeEntries"),
                s.get("staleEntries"),
            ]
        )
    data = [{"node": i["metadata"]["name"], **(i.get("status") or {})} for i in items]
    headers = ["NODE", "TOTAL", "RESERVED", "VRAM", "ALLOCATABLE", "UTIL%", "ENTRIES", "STALE"]
    if with_devices:
        headers.insert(4, "GPU-FREE")
    emit(data, table(headers, rows), args.output)
    return Exit.DONE


def _gpu_free(status: readers.JSON) -> object:
    """The most MiB free on one device: ``-`` without devices, ``unlimited`` when free
    is not bounded (a VRAM overcommit ratio of 0)."""
    if not isinstance(status.get("devices"), list):
        return "-"
    largest = status.get("largestFreeDeviceMB")
    return "unlimited" if largest is None else largest


def _devices(items: list[readers.JSON], output: str) -> int:
    """``nodes --devices``: one row per GPU device, nodes in order, devices by id."""
    rows, data = [], []
    for item in items:
        node = item["metadata"]["name"]
        devices = (item.get("status") or {}).get("devices")
        for device in devices if isinstance(devices, list) else []:
            if not isinstance(device, dict):
                continue
            free = device.get("freeMB")
            rows.append(
                [
                    node,
                    device.get("id"),
                    device.get("kind"),
                    device.get("model") or "-",
                    device.get("memoryMB"),
                    device.get("reservedMB"),
                    device.get("heldOutside") or device.get("externalMB") or 0,
                    "unlimited" if free is None else free,
                ]
            )
            data.append({"node": node, **device})
    headers = ["NODE", "DEVICE", "KIND", "MODEL", "MEMORY", "RESERVED", "OUTSIDE", "FREE"]
    emit(data, table(headers, rows), output)
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
