"""The ledger's promises, checked from the API alone (for chaos tests).

- No node's Admitted reservations exceed its limit.
- Every reservation has a decision; none is stuck undecided.
- No reservation is decided twice: each one's status only ever carries one
  final decision (Admitted or Rejected; Queued is not final), and Admitted only
  ever moves on to Reclaimed.
- Each NodeHeadroom equals a recount of the Admitted reservations on its node.
- Under StrictFIFO, once the queues are still: per node, no reservation that waited
  was admitted while an older one still waits, and the oldest waiting one does not
  fit (:func:`strict_fifo`).

A :class:`History` watches every status change while the chaos runs.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from typing import Any, cast

from kubernetes import client, watch

from headroom.api.parse import memory_mib
from headroom_dev.reservations import list_all

GROUP, VERSION, PLURAL = "headroom.dev", "v1alpha1", "reservations"
ALLOWED_NEXT = {
    "Queued": {"Queued", "Admitted", "Rejected"},
    "Admitted": {"Admitted", "Reclaimed"},
    "Rejected": {"Rejected"},
    "Reclaimed": {"Reclaimed"},
}


class History(threading.Thread):
    """Records (phase, decisionID) per uid from a watch that survives API restarts."""

    def __init__(self, custom: client.CustomObjectsApi) -> None:
        super().__init__(daemon=True)
        self.custom = custom
        self.seen: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self.stopped = threading.Event()
        self.gaps = 0

    def record(self, obj: dict[str, Any]) -> None:
        status = obj.get("status") or {}
        phase = status.get("phase")
        if phase:
            entry = (phase, status.get("decisionID", ""))
            events = self.seen[obj["metadata"]["uid"]]
            if not events or events[-1] != entry:
                events.append(entry)

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                listed = cast(
                    dict[str, Any], self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
                )
                for obj in listed["items"]:
                    self.record(obj)
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self.custom.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    PLURAL,
                    resource_version=listed["metadata"]["resourceVersion"],
                    timeout_seconds=30,
                )
                for event in stream:
                    self.record(event["object"])
                    if self.stopped.is_set():
                        return
            except Exception:  # the API server is being restarted on purpose
                self.gaps += 1
                time.sleep(0.2)

    def stop(self) -> None:
        self.stopped.set()

    def violations(self) -> list[str]:
        found = []
        for uid, events in self.seen.items():
            stamps = {stamp for phase, stamp in events if phase in ("Admitted", "Rejected")}
            if len(stamps) > 1:
                found.append(f"{uid} decided {len(stamps)} times: {events}")
            for (before, _), (after, _) in itertools.pairwise(events):
                if after not in ALLOWED_NEXT[before]:
                    found.append(f"{uid} went {before} -> {after}: {events}")
        return found


def limit_mb(node: dict[str, Any], reserve_mb: int) -> int:
    """floor(allocatable × 1) − reserve, for the chaos config (ratio 1)."""
    return memory_mib(node["status"]["allocatable"]["memory"]) - reserve_mb


def check(
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    reserve_mb: int,
    nodes: list[str],
) -> list[str]:
    """Violations of the static invariants in ``namespace`` (empty when all hold)."""
    found = []
    items = list_all(custom, namespace)
    admitted: dict[str, int] = defaultdict(int)
    for obj in items:
        phase = (obj.get("status") or {}).get("phase")
        if phase not in ("Queued", "Admitted", "Rejected", "Reclaimed"):
            found.append(f"{obj['metadata']['name']} undecided: {obj.get('status')}")
        if phase == "Admitted":
            admitted[obj["spec"]["node"]] += obj["spec"]["ramMB"]
    for name in nodes:
        node = core.read_node(name).to_dict()
        limit = limit_mb(node, reserve_mb)
        if admitted[name] > limit:
            found.append(f"node {name}: admitted {admitted[name]} MiB > limit {limit} MiB")
    return found


def headroom_matches(
    custom: client.CustomObjectsApi, namespace: str, nodes: list[str], timeout: float = 15.0
) -> list[str]:
    """NodeHeadroom.reservedRAMMB equals a recount (given time for the coalesced write)."""
    deadline = time.monotonic() + timeout
    mismatches: list[str] = []
    while time.monotonic() < deadline:
        items = list_all(custom, namespace)
        recount: dict[str, int] = defaultdict(int)
        for obj in items:
            if (obj.get("status") or {}).get("phase") == "Admitted":
                recount[obj["spec"]["node"]] += obj["spec"]["ramMB"]
        mismatches = []
        for name in nodes:
            summary = custom.get_cluster_custom_object(GROUP, VERSION, "nodeheadrooms", name)
            status = cast(dict[str, Any], summary).get("status", {})
            if status.get("reservedRAMMB") != recount[name]:
                mismatches.append(
                    f"{name}: NodeHeadroom {status.get('reservedRAMMB')} != recount {recount[name]}"
                )
        if not mismatches:
            return []
        time.sleep(0.5)
    return mismatches


def after_the_run(
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    reserve_mb: int,
    nodes: list[str],
    history: History,
) -> list[str]:
    """Every invariant at the end of a chaos run: the static ones, the history's and
    NodeHeadroom's recount."""
    time.sleep(1.0)  # let the history watch catch the last writes
    violations = check(custom, core, namespace, reserve_mb, nodes)
    violations += history.violations()
    violations += headroom_matches(custom, namespace, nodes)
    return violations


def strict_fifo(
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    reserve_mb: int,
    nodes: list[str],
) -> list[str]:
    """Violations of strict FIFO in the final state of reservations that waited.

    Creation order is (creationTimestamp, namespace/name), the operator's. A
    Queued one older than an Admitted waiter on the same node means the Admitted
    one went ahead of it; a Queued head that fits means the queue stalled. Valid
    when every waiter existed before the first of them was admitted and none was
    deleted or ran out of wait while it waited.
    """
    found = []
    waiters: dict[str, list[dict[str, Any]]] = defaultdict(list)
    held: dict[str, int] = defaultdict(int)
    for obj in list_all(custom, namespace):
        phase = (obj.get("status") or {}).get("phase")
        if phase == "Admitted":
            held[obj["spec"]["node"]] += obj["spec"]["ramMB"]
        if obj["spec"].get("wait"):
            waiters[obj["spec"]["node"]].append(obj)
    for name in nodes:
        queue = sorted(
            waiters[name],
            key=lambda o: (o["metadata"]["creationTimestamp"], namespace, o["metadata"]["name"]),
        )
        phases = [(o.get("status") or {}).get("phase") for o in queue]
        if "Queued" not in phases:
            continue
        first = phases.index("Queued")
        head = queue[first]
        went_ahead = [
            o["metadata"]["name"]
            for o, phase in zip(queue[first:], phases[first:], strict=True)
            if phase == "Admitted"
        ]
        if went_ahead:
            found.append(
                f"node {name}: {went_ahead} admitted while the older "
                f"{head['metadata']['name']} still waits"
            )
        room = limit_mb(core.read_node(name).to_dict(), reserve_mb) - held[name]
        if head["spec"]["ramMB"] <= room:
            found.append(
                f"node {name}: head {head['metadata']['name']} ({head['spec']['ramMB']} MiB) "
                f"fits the {room} MiB left but still waits"
            )
    return found
