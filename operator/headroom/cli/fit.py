"""``kubectl headroom fit --ram MiB [--vram MiB [--gpus N]] [-l selector]``: where a claim fits now.

Placement code and people ask "where can I put 8 GiB?" before they claim; the
answer comes from the NodeHeadrooms, ordered by the rule ``--node auto`` uses
(``headroom.client.placement``): most allocatable RAM first, then most free VRAM,
then the name. ``-l`` selects by the Node's labels, which the operator copies onto
each NodeHeadroom: whoever may read NodeHeadrooms may select, no right on Nodes needed.

A node that lists its GPU devices admits VRAM per device, as the operator does: a
claim of ``--vram V --gpus N`` needs N devices with ``ceil(V / N)`` MiB free each
(``--gpus`` defaults to 1; 0 asks only the node's VRAM sum). Three 50 GiB claims do
not fit on two 80 GiB GPUs, and the refusal says so with each device's free MiB.
When some listed node has devices, the table has a FREE-DEVICE column: the most MiB
free on one device (``unlimited`` under a VRAM overcommit ratio of 0).

The HeadroomQuotas that govern the namespace (``-n``, else the context's) count too
(``headroom.cli.quotaview``): a node outside a quota's ``nodeSelector`` is not listed, and
when a quota has too little room left for the claim on any node, ``fit`` says that the
quota, not the nodes, refuses, in the operator's words, and exits 1 as when no node fits.

``--dry-run`` asks the operator instead of reckoning: a create of the claim with
``dryRun=All`` on the node ``fit`` lists first (or ``--node``), nothing stored, and the
outlook its webhook returns (``headroom.client.whatif``): would be admitted (exit 0),
would wait at position N (exit 5, with ``--wait-for-room``), would be rejected with the
reason (exit 1), or no outlook (exit 6: the webhook is not registered or failed, or no
leader decides now). ``--node`` needs no right on NodeHeadrooms, only create on
Reservations, as a real claim.
"""

from __future__ import annotations

import argparse

from headroom.api.outlook import Verdict
from headroom.cli import arguments, quotaview, readers
from headroom.cli.exits import CommandError, Exit, UsageError
from headroom.cli.output import emit, table
from headroom.client import placement, whatif
from headroom.client.errors import InvalidClaimError, PlacementError
from headroom.client.placement import NodeRoom
from headroom.client.spec import ClaimRequest, request

ORDER = (
    "Best first: most allocatable RAM, then most free VRAM (nodes whose VRAM capacity "
    "is unknown after those whose capacity is known), then name: the node with the most "
    "room keeps the most after the claim, so a retry or the next claim fits too, and "
    "claims spread over the nodes."
)
GPUS_HELP = (
    "GPU devices the VRAM is spread over: each needs ceil(vram / gpus) MiB free "
    "(default 1 when --vram > 0; 0: only the node-wide VRAM sum)"
)


def add(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List the nodes where a claim of this size fits now (capacity known, under the "
        "entry cap, allocatable RAM and, where known, free VRAM enough; where the node "
        "lists its GPU devices, --gpus of them with the share free), from the "
        f"NodeHeadrooms. {ORDER} Nodes outside the nodeSelector of a HeadroomQuota that "
        "governs the namespace are left out. Exit 1 when none fits, or when such a quota "
        "has too little room left (it is named, with the numbers). --dry-run asks the "
        "operator instead (its outlook, from a server-side dry run; see --dry-run)."
    )
    parser.add_argument("--ram", required=True, help="MiB")
    parser.add_argument("--vram", default="0", help="MiB (default 0)")
    parser.add_argument("--gpus", metavar="N", help=GPUS_HELP)
    parser.add_argument(
        "-l",
        "--selector",
        help="only nodes whose labels match this selector (copied onto their NodeHeadrooms)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="ask the operator what it would decide for the claim on the first node listed "
        "(or --node), by a server-side dry-run create: nothing is created. Exit 0 would be "
        "admitted, 5 would wait (queued), 1 would be rejected, 6 no outlook",
    )
    parser.add_argument("--node", help="with --dry-run: this node (no NodeHeadroom is read)")
    parser.add_argument(
        "--wait-for-room",
        dest="wait_for",
        help="with --dry-run: how long the claim may wait for room, Queued (spec.wait, e.g. 10m)",
    )
    parser.set_defaults(handler=command)


def free_device(room: NodeRoom) -> str:
    """The FREE-DEVICE cell: ``-`` without devices, ``unlimited``, or the MiB."""
    if not room.has_devices:
        return "-"
    mib = room.largest_free_device_mb
    return "unlimited" if mib is None else str(mib)


def refused(
    refusals: list[str], rooms: list[NodeRoom], size: ClaimRequest, selector: str | None
) -> str:
    """Why nothing fits: the quotas that refuse on every node, then the nodes."""
    nodes = placement.no_room(rooms, size.ram_mb, size.vram_mb, selector, size.gpus)
    if not refusals:
        return nodes
    fitting = sum(room.fits for room in rooms)
    if not fitting:
        return f"{'; '.join(refusals)}; and {nodes}"
    text = placement.size_text(size.ram_mb, size.vram_mb, size.gpus)
    nodes_have = f"{fitting} nodes have" if fitting > 1 else "1 node has"
    quota = "the quota refuses" if len(refusals) == 1 else "the quotas refuse"
    return f"{'; '.join(refusals)} ({nodes_have} room for {text}: {quota}, not the nodes)"


#: ``fit --dry-run``'s exit code for each verdict.
VERDICT_EXITS = {
    Verdict.ADMITTED: Exit.DONE,
    Verdict.QUEUED: Exit.WOULD_WAIT,
    Verdict.REJECTED: Exit.REFUSED,
    Verdict.UNKNOWN: Exit.NO_OUTLOOK,
}


def _size(args: argparse.Namespace) -> ClaimRequest:
    if not args.dry_run:
        for flag, value in (("--node", args.node), ("--wait-for-room", args.wait_for)):
            if value is not None:
                raise UsageError(f"{flag}: only with --dry-run")
    if args.node is not None and args.selector is not None:
        raise UsageError("-l/--selector: not with --node (it selects the nodes to list)")
    try:
        return request(
            node=args.node,
            ram_mb=args.ram,
            vram_mb=args.vram,
            gpus=args.gpus,
            wait=args.wait_for,
            labels={**arguments.FLAGS, "wait": "--wait-for-room"},
        )
    except InvalidClaimError as error:
        raise UsageError(str(error)) from None


def _rooms(
    cluster: readers.Cluster, size: ClaimRequest, selector: str | None
) -> tuple[list[NodeRoom], list[str]]:
    """Every node's room for the claim (quotas' nodeSelectors
    applied) best first, and the quotas that refuse it whatever the node."""
    try:
        headrooms = placement.node_headrooms(cluster, selector)
    except PlacementError as error:
        raise CommandError(Exit.UNREACHABLE, str(error)) from None
    rooms = placement.rank(headrooms, size.ram_mb, size.vram_mb, size.gpus)
    namespace = cluster.namespace
    governing = quotaview.governing(quotaview.read(cluster, "quotas not checked") or [], namespace)
    labels = {h["metadata"]["name"]: h["metadata"].get("labels") or {} for h in headrooms}
    rooms = [quotaview.within(r, governing, namespace, labels.get(r.node, {})) for r in rooms]
    refusals = [
        why
        for quota in governing
        if (why := quotaview.refusal(quota, namespace, size.ram_mb, size.vram_mb)) is not None
    ]
    return rooms, refusals


def dry_run(cluster: readers.Cluster, size: ClaimRequest, args: argparse.Namespace) -> int:
    """``--dry-run``: the operator's outlook for the claim on one node, nothing created."""
    node = size.node
    if node is None:
        rooms, refusals = _rooms(cluster, size, args.selector)
        best = placement.candidates(rooms, may_wait=size.wait is not None, most=1)
        if not best:
            raise CommandError(Exit.REFUSED, refused(refusals, rooms, size, args.selector))
        node = best[0].node  # a quota that refuses: the operator says so, in its words
    answer = whatif.ask(cluster, size, node)
    emit(answer.as_json(), "\n".join(answer.lines()), args.output)
    return VERDICT_EXITS[answer.verdict]


def command(args: argparse.Namespace) -> int:
    size = _size(args)
    cluster = readers.connect(args.kubeconfig, args.context, args.namespace)
    if args.dry_run:
        return dry_run(cluster, size, args)
    rooms, refusals = _rooms(cluster, size, args.selector)
    fitting = [room for room in rooms if room.fits]
    if refusals or not fitting:
        raise CommandError(Exit.REFUSED, refused(refusals, rooms, size, args.selector))
    devices = any(room.has_devices for room in fitting)
    rows = [
        [
            room.node,
            room.allocatable_ram_mb,
            "-" if room.free_vram_mb is None else room.free_vram_mb,
            *([free_device(room)] if devices else []),
            f"{room.active_entries}/{room.max_entries}",
            room.queued_entries,
        ]
        for room in fitting
    ]
    headers = ["NODE", "ALLOCATABLE", "FREE-VRAM", "ENTRIES", "QUEUED"]
    if devices:
        headers.insert(3, "FREE-DEVICE")
    emit([room.as_json() for room in fitting], table(headers, rows), args.output)
    return Exit.DONE
