"""``kubectl headroom why NAME`` and ``why pod/NAME``: the phase and what decided it.

A gated pod's reservation has the pod's name, so ``why NAME`` already shows it;
``why pod/NAME`` starts from the pod: whether our scheduling gate still holds it
(and where it stands in its node's queue), or the node it was pinned to, then its
reservation and the Events about both.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kubernetes.client.exceptions import ApiException

from headroom.api.constants import RESERVATION_ANNOTATION, SCHEDULING_GATE
from headroom.cli import arguments, readers
from headroom.cli.exits import CommandError, Exit, describe_api_error, is_forbidden
from headroom.cli.output import emit
from headroom.client.devices import devices_of

JSON = dict[str, Any]
POD_PREFIXES = ("pod/", "pods/", "po/")


def why(args: argparse.Namespace) -> int:
    target: str = args.reservation
    cluster = readers.connect(args.kubeconfig, args.context, args.namespace)
    pod_name = next((target[len(p) :] for p in POD_PREFIXES if target.startswith(p)), None)
    lines: list[str] = []
    data: JSON = {"namespace": cluster.namespace}
    if pod_name is not None:
        pod = _read_pod(cluster, arguments.name(pod_name, "pod"))
        meta = pod.metadata
        gated = any(g.name == SCHEDULING_GATE for g in pod.spec.scheduling_gates or [])
        name = (meta.annotations or {}).get(RESERVATION_ANNOTATION) or meta.name
        state = (
            f"held by the scheduling gate {SCHEDULING_GATE} until its memory is admitted"
            if gated
            else f"not gated; node {pod.spec.node_name or '(not bound yet)'}, "
            f"phase {pod.status.phase if pod.status else 'Pending'}"
        )
        lines += [f"Pod {cluster.namespace}/{meta.name}: {state}"]
        data["pod"] = {"name": meta.name, "uid": meta.uid, "gated": gated}
        data["podEvents"] = _events(cluster, meta.uid)
        lines += _event_lines(data["podEvents"], indent="  ")
    else:
        name = arguments.name(target)
    obj = _read_reservation(cluster, name, missing_ok=pod_name is not None)
    if obj is None:
        lines.append(f"Reservation {cluster.namespace}/{name}: none yet")
        emit(data, "\n".join(lines), args.output)
        return Exit.DONE
    spec, status = obj["spec"], obj.get("status") or {}
    data |= {"name": name, "uid": obj["metadata"]["uid"], "spec": spec, "status": status}
    gpus = spec.get("gpus")
    over = "" if gpus is None or not spec.get("vramMB") else f" over {gpus} GPUs"
    lines += [
        f"Reservation {cluster.namespace}/{name}: {spec.get('ramMB')} MiB RAM, "
        f"{spec.get('vramMB', 0)} MiB VRAM{over} on node {spec.get('node')}",
        f"Phase:   {status.get('phase', 'Pending')}",
        f"Reason:  {status.get('reason', '-')}",
        f"Message: {status.get('message', 'not decided yet')}",
    ]
    if status.get("phase") == "Queued" and status.get("queuePosition"):
        lines.append(f"Queue:   position {status['queuePosition']} on node {spec.get('node')}")
    if held := devices_of(status):
        lines.append("Devices: " + ", ".join(f"{d.id} ({d.memory_mb} MiB)" for d in held))
    for key in ("admittedAt", "lastHeartbeat", "reclaimedAt"):
        if status.get(key):
            lines.append(f"{key}: {status[key]}")
    data["events"] = _events(cluster, obj["metadata"]["uid"])
    lines += _event_lines(data["events"], indent="  ")
    emit(data, "\n".join(lines), args.output)
    return Exit.DONE


def _read_pod(cluster: readers.Cluster, name: str) -> Any:
    try:
        return readers.pod(cluster, name)
    except ApiException as error:
        if error.status != 404:
            raise
        raise CommandError(
            Exit.UNREACHABLE, f'pod "{name}" not found in namespace "{cluster.namespace}"'
        ) from None


def _read_reservation(cluster: readers.Cluster, name: str, *, missing_ok: bool) -> JSON | None:
    try:
        return readers.reservation(cluster, name)
    except ApiException as error:
        if error.status != 404:
            raise
        if missing_ok:
            return None
        raise CommandError(
            Exit.UNREACHABLE,
            f'reservation "{name}" not found in namespace "{cluster.namespace}"',
        ) from None


def _events(cluster: readers.Cluster, uid: str) -> list[JSON] | None:
    try:
        return readers.events_about(cluster, uid)
    except ApiException as error:
        if not is_forbidden(error):
            raise
        print(
            f'Warning: Events in namespace "{cluster.namespace}" are not readable '
            f"({describe_api_error(error)}); showing the status only. "
            'The built-in "view" role grants reading Events in a namespace.',
            file=sys.stderr,
        )
        return None


def _event_lines(events: list[JSON] | None, indent: str) -> list[str]:
    lines = ["Events:"]
    if events is None:
        return [*lines, f"{indent}<not readable>"]
    lines += [
        f"{indent}{e['time']}  {e['type']:<8} {e['reason']:<16} {e['message']}" for e in events
    ]
    return lines if events else [*lines, f"{indent}<none>"]
