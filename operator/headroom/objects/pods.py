"""Gated pods in ledger terms: the reservation a pod gets, and the patches that place it.

Pure: no I/O. The operator reserves a gated pod's memory on a node the pod may
run on (:mod:`headroom.objects.nodeconstraints` reads its hard constraints, so
the pin we add never contradicts the pod). Soft constraints (preferred affinity,
spreading) are left to the scheduler inside the one node we pin.

The pin is a required ``matchFields metadata.name In [node]``, added to every
existing term that matches anything (terms are ORed, and a gated pod's terms
accept added requirements only; an empty term matches nothing and must stay
empty) or as a new required affinity; one JSON patch adds it, records the
reservation's name and removes our gate, guarded by ``test`` operations on the
pod's uid and on the gate, so it never lands on another incarnation or after
someone else moved the gates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from headroom.api.claims import PodClaim, is_claim_pod, pod_claim
from headroom.api.constants import (
    API_VERSION,
    DEVICES_ANNOTATION,
    MAX_WAIT,
    RESERVATION_ANNOTATION,
    SCHEDULING_GATE,
)
from headroom.api.parse import InvalidValueError
from headroom.ledger import Entry
from headroom.objects.nodeconstraints import REQUIRED as _REQUIRED
from headroom.objects.nodeconstraints import required_terms
from headroom.objects.podmemory import capped_claim, memory_limit_mb

JSON = dict[str, Any]
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: The pod condition that says where its claim stands (True once admitted and pinned).
CONDITION = "headroom.dev/Admitted"


# -- a pod's state ----------------------------------------------------------------------------


def is_gated(pod: JSON) -> bool:
    """Whether our scheduling gate holds the pod."""
    return _gate_index(pod) is not None


def _gate_index(pod: JSON) -> int | None:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    for index, gate in enumerate(gates):
        if isinstance(gate, dict) and gate.get("name") == SCHEDULING_GATE:
            return index
    return None


def is_finished(pod: JSON) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def bound_node(pod: JSON) -> str | None:
    node = (pod.get("spec") or {}).get("nodeName")
    return node if isinstance(node, str) and node else None


def unschedulable(pod: JSON) -> bool:
    """Whether kube-scheduler tried the pod and found no node (PodScheduled False,
    Unschedulable): it tries again on a change of the pod, or after minutes."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == "PodScheduled":
            return condition.get("status") == "False" and condition.get("reason") == "Unschedulable"
    return False


def _waits_for(pod: JSON, scheduler: str | None) -> bool:
    """Whether the pod is unbound and left to ``scheduler``."""
    name = (pod.get("spec") or {}).get("schedulerName")
    return scheduler is not None and name == scheduler and bound_node(pod) is None


def unschedulable_for(pod: JSON, scheduler: str) -> bool:
    """Whether ``scheduler`` tried the pod and left it unbound, finding no node for it."""
    return _waits_for(pod, scheduler) and unschedulable(pod)


def placed_by_operator(pod: JSON, scheduler: str | None) -> bool:
    """Whether only the operator can place the pod now: our gate holds it, or it waits,
    unbound, for ``scheduler`` (placement mode scheduler), whose binds are the operator's."""
    return is_gated(pod) or _waits_for(pod, scheduler)


# -- the reservation of a pod -----------------------------------------------------------------


def pod_wait(claim: PodClaim, max_wait: timedelta | None) -> timedelta | None:
    """How long a pod's reservation may wait for room: what the pod asks
    (``headroom.dev/wait``), else as long as its quotas allow (``max_wait``, their
    smallest ``maxWait``; whole seconds, as ``spec.wait`` says it), else 24h. A default
    over a quota's maxWait would be refused WaitTooLong, and the pod never placed.
    None: it may not wait at all (a maxWait under a second)."""
    if claim.wait is not None:
        return claim.wait
    bound = MAX_WAIT if max_wait is None else min(MAX_WAIT, max_wait)
    seconds = int(bound.total_seconds())
    return timedelta(seconds=seconds) if seconds >= 1 else None


def pod_reservation(
    pod: JSON,
    claim: PodClaim,
    node: str,
    *,
    max_wait: timedelta | None = None,
    node_ram_mb: int | None = None,
    node_vram_mb: int | None = None,
) -> JSON:
    """The Reservation that holds a pod's memory: same namespace and name as the pod,
    owned by it (the garbage collector deletes it with the pod), alive as long as it.
    ``max_wait``: the longest wait its namespace's quotas allow (:func:`pod_wait`).

    For a pod that runs on ``node`` already, the claim is capped at what the pod can
    use (``headroom.objects.podmemory.capped_claim``, with the node's total RAM and VRAM
    as the ledger knows them): it is recorded there past any limit, so it must not say
    more than the pod can hold."""
    if bound_node(pod) == node:
        claim = capped_claim(claim, memory_limit_mb(pod), node_ram_mb, node_vram_mb)
    meta = pod.get("metadata") or {}
    name = str(meta.get("name"))
    spec: JSON = {
        "node": node,
        "ramMB": claim.ram_mb,
        "owner": {"pod": name, "surface": "pod"},
        "liveness": "Pod",
        "description": f"memory of pod {name}",
    }
    wait = pod_wait(claim, max_wait)
    if wait is not None:
        spec["wait"] = _go_duration(wait)
    if claim.vram_mb:
        spec["vramMB"] = claim.vram_mb
    if claim.gpus is not None:
        spec["gpus"] = claim.gpus
    return {
        "apiVersion": API_VERSION,
        "kind": "Reservation",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace"),
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": name,
                    "uid": meta.get("uid"),
                    # No finalizer and no foreground blocking: deleting a pod never
                    # waits for the operator.
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": spec,
    }


def _go_duration(duration: timedelta) -> str:
    return f"{max(int(duration.total_seconds()), 1)}s"


def owning_pod_uid(reservation: JSON) -> str | None:
    """The uid of the pod a Reservation belongs to (its Pod ownerReference), if any."""
    for ref in (reservation.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1":
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None


# -- ungating ---------------------------------------------------------------------------------


def ungate_patch(
    pod: JSON,
    node: str,
    reservation: str,
    devices: Mapping[str, int] | None = None,
    *,
    time_left: timedelta | None = None,
) -> list[JSON] | None:
    """One JSON patch: pin to ``node``, name the reservation (and the GPU devices it
    was admitted on, for the pod's program to use), remove our gate; and, when the
    reservation expires (``time_left``, a lifetime its quota gave), make the pod end
    by then (:func:`active_deadline`). None when our gate is not there (nothing to do)."""
    index = _gate_index(pod)
    if index is None:
        return None
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    gate_path = f"/spec/schedulingGates/{index}"
    ops: list[JSON] = [
        {"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
        {"op": "test", "path": f"{gate_path}/name", "value": SCHEDULING_GATE},
    ]
    if meta.get("generation") is not None:
        # The spec as it was checked against the node (its selector, affinity and
        # tolerations): one narrowed since, even while this patch is retried, fails the
        # test and is looked at again, rather than pinned where it cannot run.
        ops.append({"op": "test", "path": "/metadata/generation", "value": meta["generation"]})
    if meta.get("annotations"):
        # And the claim as its reservation was checked against it: one resized since
        # is not let out on the old size's reservation.
        ops.append({"op": "test", "path": "/metadata/annotations", "value": meta["annotations"]})
    ops += [{"op": "remove", "path": gate_path}, *_pin(spec, node)]
    deadline = active_deadline(pod, time_left)
    if deadline is not None:
        ops.append(_add("/spec/activeDeadlineSeconds", deadline))
    told = {RESERVATION_ANNOTATION: reservation}
    if devices:
        told[DEVICES_ANNOTATION] = ",".join(sorted(devices))
    if meta.get("annotations"):
        for key, value in told.items():
            ops.append(_add(f"/metadata/annotations/{_pointer(key)}", value))
    else:
        ops.append(_add("/metadata/annotations", told))
    return ops


def active_deadline(pod: JSON, time_left: timedelta | None) -> int | None:
    """The ``spec.activeDeadlineSeconds`` a pod must be given so that the kubelet ends it
    (Failed, DeadlineExceeded) when its reservation expires: the whole seconds left, at
    least 1 (the API server's minimum). The kubelet counts from the pod's start, which
    comes after the ungate, so the pod may outlive the reservation by that slack, never
    more. None: nothing to set (no expiry, or the pod already has a deadline as near;
    the API server refuses a raised one, and one the pod set itself is its own)."""
    if time_left is None:
        return None
    seconds = max(int(time_left.total_seconds()), 1)
    have = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    if isinstance(have, int) and not isinstance(have, bool) and 0 < have <= seconds:
        return None
    return seconds


def _pointer(key: str) -> str:
    """A map key as one JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _add(path: str, value: object) -> JSON:
    return {"op": "add", "path": path, "value": value}


def _pin(spec: JSON, node: str) -> list[JSON]:
    requirement = {"key": "metadata.name", "operator": "In", "values": [node]}
    term = {"matchFields": [requirement]}
    affinity = spec.get("affinity")
    node_affinity = (affinity or {}).get("nodeAffinity")
    terms = ((node_affinity or {}).get(_REQUIRED) or {}).get("nodeSelectorTerms")
    if terms:
        base = f"/spec/affinity/nodeAffinity/{_REQUIRED}/nodeSelectorTerms"
        ops: list[JSON] = []
        # An empty term matches no node, and the API server refuses requirements added
        # to one while the pod is gated: it is left empty, unless every term is (such a
        # pod runs nowhere; the refusal says so rather than ungating it unpinned).
        empty = [
            not (t or {}).get("matchExpressions") and not (t or {}).get("matchFields")
            for t in terms
        ]
        for index, existing in enumerate(terms):
            if empty[index] and not all(empty):
                continue
            if (existing or {}).get("matchFields"):
                ops.append(_add(f"{base}/{index}/matchFields/-", requirement))
            else:
                ops.append(_add(f"{base}/{index}/matchFields", [requirement]))
        return ops
    required = {"nodeSelectorTerms": [term]}
    if not affinity:
        return [_add("/spec/affinity", {"nodeAffinity": {_REQUIRED: required}})]
    if not node_affinity:
        return [_add("/spec/affinity/nodeAffinity", {_REQUIRED: required})]
    return [_add(f"/spec/affinity/nodeAffinity/{_REQUIRED}", required)]


def pinned_to(pod: JSON, node: str) -> bool:
    """Whether our pin to ``node`` is in every required term the ungate patch pinned:
    each, beside what the pod's own terms say, but an empty one (left as it was)."""
    terms = [
        term
        for term in required_terms(pod.get("spec") or {}) or []
        if (term or {}).get("matchExpressions") or (term or {}).get("matchFields")
    ]
    wanted = {"key": "metadata.name", "operator": "In", "values": [node]}
    return bool(terms) and all(wanted in (term.get("matchFields") or []) for term in terms)


def pinned_node(pod: JSON) -> str | None:
    """The node our pin names, if the pod carries one in every required term."""
    terms = required_terms(pod.get("spec") or {}) or []
    nodes = set()
    for term in terms:
        for requirement in term.get("matchFields") or []:
            if requirement.get("key") == "metadata.name" and requirement.get("operator") == "In":
                values = requirement.get("values") or []
                if len(values) == 1:
                    nodes.add(str(values[0]))
    return nodes.pop() if len(nodes) == 1 else None


# -- the pod's condition ----------------------------------------------------------------------


def condition_reason(pod: JSON) -> str | None:
    """The reason of the pod's condition ``headroom.dev/Admitted``, if it has one."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == CONDITION:
            reason = condition.get("reason")
            return str(reason) if reason is not None else None
    return None


def condition_patch(pod: JSON, status: str, reason: str, message: str, at: str) -> list[JSON]:
    """A JSON patch for ``pods/status`` that sets our condition and touches no other: it
    replaces ours where it is (guarded by a ``test`` of its type, so a list the kubelet
    changed meanwhile is refused, not clobbered), or appends it."""
    condition = {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": at,
    }
    conditions = (pod.get("status") or {}).get("conditions")
    uid = (pod.get("metadata") or {}).get("uid")
    same_pod = {"op": "test", "path": "/metadata/uid", "value": uid}
    if not isinstance(conditions, list):
        return [same_pod, _add("/status/conditions", [condition])]
    for index, existing in enumerate(conditions):
        if isinstance(existing, dict) and existing.get("type") == CONDITION:
            if existing.get("status") == status:
                condition["lastTransitionTime"] = existing.get("lastTransitionTime", at)
            return [
                {"op": "test", "path": f"/status/conditions/{index}/type", "value": CONDITION},
                {"op": "replace", "path": f"/status/conditions/{index}", "value": condition},
            ]
    # Appended only to the list as seen: a second append made from the same view (two
    # passes before the watch showed the first) is refused, never a duplicate condition.
    return [
        same_pod,
        {"op": "test", "path": "/status/conditions", "value": conditions},
        _add("/status/conditions/-", condition),
    ]


# -- the operator's own reservation of a running pod --------------------------------------------


@dataclass(frozen=True, slots=True)
class RunningClaim:
    """A claim pod bound to a node, as the admission of its reservation compares it."""

    node: str
    claim: PodClaim
    memory_limit_mb: int | None  # None: a container sets no memory limit


def running_claim(pod: JSON) -> RunningClaim | None:
    """The claim of a pod that runs on a node, or None: not opted in, not bound, ended, or
    its claim unreadable (then nothing of it is recorded past a limit)."""
    node = bound_node(pod)
    if node is None or is_finished(pod) or not is_claim_pod(pod):
        return None
    try:
        claim = pod_claim(pod)
    except InvalidValueError:
        return None
    return RunningClaim(node, claim, memory_limit_mb(pod))


def is_own_reservation(
    entry: Entry,
    owner_uid: str | None,
    pod_uid: str,
    running: RunningClaim,
    node_ram_mb: int | None,
    node_vram_mb: int | None,
) -> bool:
    """Whether ``entry`` is exactly the reservation the operator writes for this running
    pod (:func:`pod_reservation`): named as the pod and owned by it, by its current
    incarnation (``owner_uid``, the Reservation's Pod ownerReference, is ``pod_uid``),
    alive as long as it, on the node it runs on, with its claim capped as there.

    Only such a reservation is recorded past a node's limit and its quota: a tenant
    can write any name, labels, ownerReferences and spec, but names are unique, so at
    most one reservation per pod passes, and only at the size the pod can use. What
    else names the pod is decided like any other claim."""
    name = entry.id.rsplit("/", 1)[-1]
    expected = capped_claim(running.claim, running.memory_limit_mb, node_ram_mb, node_vram_mb)
    gpus = 1 if expected.gpus is None else expected.gpus
    return (
        entry.pod_lifetime
        and entry.owner.pod == name
        and owner_uid is not None
        and owner_uid == pod_uid
        and entry.node == running.node
        and entry.expires_at is None
        and (entry.ram_mb, entry.vram_mb, entry.gpus) == (expected.ram_mb, expected.vram_mb, gpus)
    )
