"""``kubectl headroom`` subcommands: nodes, summary, why, reserve, heartbeat."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from headroom.api.constants import API_VERSION
from headroom.api.parse import parse_duration
from headroom.cli import readers
from headroom.cli.output import render, table

Args = argparse.Namespace


def _cluster(args: Args) -> readers.Cluster:
    return readers.connect(args.kubeconfig, args.context, args.namespace)


def _print(data: Any, text: str, args: Args) -> None:
    print(text if args.output == "table" else render(data, args.output))


def nodes(args: Args) -> int:
    items = readers.node_headrooms(_cluster(args))
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
    _print(data, table(headers, rows), args)
    return 0


def summary(args: Args) -> int:
    cluster = _cluster(args)
    statuses = [i.get("status") or {} for i in readers.node_headrooms(cluster)]
    phases = Counter(
        (r.get("status") or {}).get("phase") or "Pending"
        for r in readers.reservations(cluster, None)
    )
    data = {
        "nodes": len(statuses),
        "totalReservedMB": sum(s.get("reservedRAMMB", 0) for s in statuses),
        "totalVRAMMB": sum(s.get("reservedVRAMMB", 0) for s in statuses),
        "activeEntries": sum(s.get("activeEntries", 0) for s in statuses),
        "staleEntries": sum(s.get("staleEntries", 0) for s in statuses),
        "reservations": {
            p: phases.get(p, 0) for p in ("Pending", "Admitted", "Rejected", "Reclaimed")
        },
    }
    text = table(
        ["FIELD", "VALUE"],
        [
            ["nodes", data["nodes"]],
            ["reserved RAM (MiB)", data["totalReservedMB"]],
            ["reserved VRAM (MiB)", data["totalVRAMMB"]],
            ["active entries", data["activeEntries"]],
            ["stale entries", data["staleEntries"]],
            *[[f"reservations {p}", n] for p, n in data["reservations"].items()],
        ],
    )
    _print(data, text, args)
    return 0


def why(args: Args) -> int:
    cluster = _cluster(args)
    obj = readers.reservation(cluster, args.reservation)
    spec, status = obj["spec"], obj.get("status") or {}
    events = readers.events_about(cluster, args.reservation)
    data = {
        "name": args.reservation,
        "namespace": cluster.namespace,
        "spec": spec,
        "status": status,
        "events": events,
    }
    lines = [
        f"Reservation {cluster.namespace}/{args.reservation}: {spec.get('ramMB')} MiB RAM, "
        f"{spec.get('vramMB', 0)} MiB VRAM on node {spec.get('node')}",
        f"Phase:   {status.get('phase', 'Pending')}",
        f"Reason:  {status.get('reason', '-')}",
        f"Message: {status.get('message', 'not decided yet')}",
    ]
    for key in ("admittedAt", "lastHeartbeat", "reclaimedAt"):
        if status.get(key):
            lines.append(f"{key}: {status[key]}")
    lines.append("Events:")
    lines += [f"  {e['time']}  {e['type']:<8} {e['reason']:<16} {e['message']}" for e in events]
    if not events:
        lines.append("  <none>")
    _print(data, "\n".join(lines), args)
    return 0


def reserve(args: Args) -> int:
    cluster = _cluster(args)
    name = args.name or f"rsv-{uuid.uuid4().hex[:8]}"
    spec: dict[str, Any] = {"node": args.node, "ramMB": args.ram}
    if args.vram:
        spec["vramMB"] = args.vram
    if args.ttl:
        spec["expiresAt"] = (datetime.now(UTC) + parse_duration(args.ttl)).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
    if args.description:
        spec["description"] = args.description
    if args.owner_pod:
        spec["owner"] = {"pod": args.owner_pod}
    body = {
        "apiVersion": API_VERSION,
        "kind": "Reservation",
        "metadata": {"name": name},
        "spec": spec,
    }
    readers.create_reservation(cluster, body)
    if not args.wait:
        print(f"reservation.headroom.dev/{name} created")
        return 0
    deadline = time.monotonic() + parse_duration(args.timeout).total_seconds()
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = readers.reservation(cluster, name).get("status") or {}
        if status.get("phase") in ("Admitted", "Rejected", "Reclaimed"):
            break
        time.sleep(0.1)
    else:
        print(f"Error: no decision on reservation {name!r} within {args.timeout}", file=sys.stderr)
        return 2
    data = {"name": name, "namespace": cluster.namespace, **status}
    _print(
        data,
        f"reservation.headroom.dev/{name} {status['phase'].lower()}: {status.get('message', '')}",
        args,
    )
    if status["phase"] != "Admitted":
        print(f"{status.get('reason')}: {status.get('message')}", file=sys.stderr)
        return 1
    return 0


def heartbeat(args: Args) -> int:
    readers.heartbeat(_cluster(args), args.reservation, datetime.now(UTC))
    print(f"reservation.headroom.dev/{args.reservation} heartbeat sent")
    return 0


def add(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    def parser(name: str, help_: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help_, parents=[common])

    parser("nodes", "per-node headroom").set_defaults(handler=nodes)
    parser("summary", "cluster-wide totals").set_defaults(handler=summary)
    p = parser("why", "why a reservation is in its phase, with the numbers and events")
    p.add_argument("reservation")
    p.set_defaults(handler=why)
    p = parser("reserve", "create a reservation (and wait for its decision)")
    p.add_argument("--node", required=True)
    p.add_argument("--ram", type=int, required=True, help="MiB")
    p.add_argument("--vram", type=int, default=0, help="MiB")
    p.add_argument("--ttl", help="hard expiry from now, e.g. 1h")
    p.add_argument("--name")
    p.add_argument("--description")
    p.add_argument("--owner-pod")
    p.add_argument("--wait", action="store_true", help="wait; exit 0 admitted, 1 rejected")
    p.add_argument("--timeout", default="60s")
    p.set_defaults(handler=reserve)
    p = parser("heartbeat", "refresh a reservation's heartbeat")
    p.add_argument("reservation")
    p.set_defaults(handler=heartbeat)
