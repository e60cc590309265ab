"""``kubectl headroom fit --ram MiB [--vram MiB] [-l selector]``: where a claim fits now.

Placement code and people ask "where can I put 8 GiB?" before they claim; the
answer comes from the NodeHeadrooms, ordered by the rule ``--node auto`` uses
(``headroom.client.placement``): most allocatable RAM first, then most free VRAM,
then the name. ``-l`` selects by the Node's labels, which the operator copies onto
each NodeHeadroom: whoever may read NodeHeadrooms may select, no right on Nodes needed.
"""

from __future__ import annotations

import argparse

from headroom.cli import arguments, readers
from headroom.cli.exits import CommandError, Exit, UsageError
from headroom.cli.output import emit, table
from headroom.client import placement
from headroom.client.errors import InvalidClaimError, PlacementError
from headroom.client.spec import request

ORDER = (
    "Best first: most allocatable RAM, then most free VRAM (nodes whose VRAM capacity "
    "is unknown after those whose capacity is known), then name: the node with the most "
    "room keeps the most after the claim, so a retry or the next claim fits too, and "
    "claims spread over the nodes."
)


def add(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List the nodes where a claim of this size fits now (capacity known, under the "
        "entry cap, allocatable RAM and, where known, free VRAM enough), from the "
        f"NodeHeadrooms. {ORDER} Exit 1 when none fits."
    )
    parser.add_argument("--ram", required=True, help="MiB")
    parser.add_argument("--vram", default="0", help="MiB (default 0)")
    parser.add_argument(
        "-l",
        "--selector",
        help="only nodes whose labels match this selector (copied onto their NodeHeadrooms)",
    )
    parser.set_defaults(handler=command)


def command(args: argparse.Namespace) -> int:
    try:
        size = request(node=None, ram_mb=args.ram, vram_mb=args.vram, labels=arguments.FLAGS)
    except InvalidClaimError as error:
        raise UsageError(str(error)) from None
    cluster = readers.connect(args.kubeconfig, args.context, args.namespace)
    try:
        rooms = placement.read(cluster, size.ram_mb, size.vram_mb, args.selector)
    except PlacementError as error:
        raise CommandError(Exit.UNREACHABLE, str(error)) from None
    fitting = [room for room in rooms if room.fits]
    if not fitting:
        raise CommandError(
            Exit.REFUSED, placement.no_room(rooms, size.ram_mb, size.vram_mb, args.selector)
        )
    rows = [
        [
            room.node,
            room.allocatable_ram_mb,
            "-" if room.free_vram_mb is None else room.free_vram_mb,
            f"{room.active_entries}/{room.max_entries}",
            room.queued_entries,
        ]
        for room in fitting
    ]
    headers = ["NODE", "ALLOCATABLE", "FREE-VRAM", "ENTRIES", "QUEUED"]
    emit([room.as_json() for room in fitting], table(headers, rows), args.output)
    return Exit.DONE
