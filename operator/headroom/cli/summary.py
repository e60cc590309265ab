"""``kubectl headroom summary``: the seed's ClusterSummary, from what the caller may read.

Reserved figures are counted from the Admitted Reservations themselves, not summed
from NodeHeadrooms: a deleted Node's NodeHeadroom disappears while its reservations
stay Admitted and held, and summing the two sources side by side once showed
"active entries 4" beside "Admitted 7". What sits on nodes without a NodeHeadroom
is reported on its own line. A tenant bound in one namespace cannot list
reservations cluster-wide nor read the cluster-scoped NodeHeadrooms, so each part
falls back to what is readable and says so on stderr.

When HeadroomQuotas are readable, a QUOTAS table follows (``quotas`` in JSON): each
quota's RAM and VRAM held of its limit, Admitted entries of its cap, claims Queued on
it, and whether it holds more than it allows (lowered under what is held). Figures
from the quota's status, as the operator last wrote it.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from kubernetes.client.exceptions import ApiException

from headroom.cli import quotaview, readers
from headroom.cli.exits import CommandError, Exit, describe_api_error, is_forbidden
from headroom.cli.output import emit, table
from headroom.client.placement import NODEHEADROOM_GRANT

JSON = dict[str, Any]
PHASES = ("Pending", "Admitted", "Rejected", "Reclaimed")


def _phase(obj: JSON) -> str:
    return str((obj.get("status") or {}).get("phase") or "Pending")


def summarize(headrooms: list[JSON] | None, reservations: list[JSON] | None) -> JSON:
    """Totals from the NodeHeadrooms and Reservations read; None for what was not."""
    statuses = None if headrooms is None else [h.get("status") or {} for h in headrooms]
    data: JSON = {
        "nodes": None if statuses is None else len(statuses),
        "staleEntries": _sum(statuses, "staleEntries"),
    }
    if reservations is None:
        # Nothing else to count from: the operator's own per-node figures.
        data["figuresFrom"] = None if statuses is None else "NodeHeadrooms"
        data["totalReservedMB"] = _sum(statuses, "reservedRAMMB")
        data["totalVRAMMB"] = _sum(statuses, "reservedVRAMMB")
        data["activeEntries"] = _sum(statuses, "activeEntries")
        data["reservations"] = None
        data["withoutNodeHeadroom"] = None
        return data
    admitted = [r for r in reservations if _phase(r) == "Admitted"]
    phases = Counter(_phase(r) for r in reservations)
    data["figuresFrom"] = "Reservations"
    data["totalReservedMB"] = sum(r["spec"].get("ramMB", 0) for r in admitted)
    data["totalVRAMMB"] = sum(r["spec"].get("vramMB", 0) for r in admitted)
    data["activeEntries"] = len(admitted)
    data["reservations"] = {p: phases.get(p, 0) for p in (*PHASES, *sorted(phases))}
    if headrooms is None:
        data["withoutNodeHeadroom"] = None
        return data
    known = {h["metadata"]["name"] for h in headrooms}
    orphans = [r for r in admitted if r["spec"]["node"] not in known]
    data["withoutNodeHeadroom"] = {
        "entries": len(orphans),
        "reservedMB": sum(r["spec"].get("ramMB", 0) for r in orphans),
        "reservedVRAMMB": sum(r["spec"].get("vramMB", 0) for r in orphans),
        "nodes": dict(sorted(Counter(r["spec"]["node"] for r in orphans).items())),
    }
    return data


def _sum(statuses: list[JSON] | None, key: str) -> int | None:
    return None if statuses is None else sum(s.get(key, 0) for s in statuses)


def rows(data: JSON) -> list[list[Any]]:
    """The table: one row per figure that could be read."""
    scope = {"cluster": "all namespaces", "namespace": f"namespace {data.get('namespace')}"}
    out: list[list[Any]] = [["reservations read", scope.get(data["scope"], "none")]]
    if data["nodes"] is not None:
        out += [["nodes", data["nodes"]], ["stale entries", data["staleEntries"]]]
    if data["figuresFrom"] is not None:
        suffix = "" if data["figuresFrom"] == "Reservations" else " (from NodeHeadrooms)"
        out += [
            [f"reserved RAM (MiB){suffix}", data["totalReservedMB"]],
            [f"reserved VRAM (MiB){suffix}", data["totalVRAMMB"]],
            [f"active entries{suffix}", data["activeEntries"]],
        ]
    if data["reservations"] is not None:
        out += [[f"reservations {p}", n] for p, n in data["reservations"].items()]
    orphans = data["withoutNodeHeadroom"]
    if orphans is not None:
        nodes = f" ({', '.join(orphans['nodes'])})" if orphans["nodes"] else ""
        out.append(["admitted on nodes without a NodeHeadroom", f"{orphans['entries']}{nodes}"])
    return out


def command(args: argparse.Namespace) -> int:
    cluster = readers.connect(args.kubeconfig, args.context, args.namespace)
    warnings: list[str] = []
    headrooms: list[JSON] | None = None
    try:
        headrooms = readers.node_headrooms(cluster)
    except ApiException as error:
        if not is_forbidden(error):
            raise
        warnings.append(
            f"NodeHeadrooms not readable ({describe_api_error(error)}); {NODEHEADROOM_GRANT}"
        )
    reservations: list[JSON] | None = None
    scope = "none"
    try:
        reservations, scope = readers.reservations(cluster, None), "cluster"
    except ApiException as error:
        if not is_forbidden(error):
            raise
        try:
            reservations, scope = readers.reservations(cluster, cluster.namespace), "namespace"
            warnings.append(
                "reservations cannot be listed in all namespaces (forbidden); "
                f'counting namespace "{cluster.namespace}" only'
            )
        except ApiException as inner:
            if not is_forbidden(inner):
                raise
            warnings.append(f"reservations not readable ({describe_api_error(inner)})")
    if headrooms is None and reservations is None:
        raise CommandError(Exit.UNREACHABLE, "; ".join(warnings))
    readable = quotaview.read(cluster, "quotas not shown", warnings.append)
    data = {"scope": scope, **summarize(headrooms, reservations)}
    if scope == "namespace":
        data["namespace"] = cluster.namespace
    data["quotas"] = None if readable is None else [quota.as_json() for quota in readable]
    for warning in warnings:
        print(f"Warning: {warning}", file=sys.stderr)
    text = table(["FIELD", "VALUE"], rows(data))
    if readable:
        text += "\n\n" + table(quotaview.HEADERS, quotaview.rows(readable))
    emit(data, text, args.output)
    return Exit.DONE
