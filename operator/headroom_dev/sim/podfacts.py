"""What a pod is and where it may run, as the simulation's cluster and judges read it.

kube-scheduler's hard constraints (node selector, required node affinity with its
ORed terms, taints against tolerations, ``unschedulable``), the pin the operator
adds, and the states of a claiming pod, written here again rather than imported
from the operator (``headroom.objects.pods``): the scheduler stand-in in
:mod:`headroom_dev.sim.pods` and the checks in :mod:`headroom_dev.sim.podchecks`
judge the operator, so a mistake of its own must not hide behind the same mistake
in them. Only what the simulation writes is read (``<n>Mi`` quantities, the
operators In, NotIn, Exists, DoesNotExist).
"""

from __future__ import annotations

from typing import Any

from headroom.api.constants import CLAIM_LABEL, SCHEDULING_GATE

JSON = dict[str, Any]
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
FINISHED = ("Succeeded", "Failed")


def gates(pod: JSON) -> list[str]:
    return [g.get("name", "") for g in (pod.get("spec") or {}).get("schedulingGates") or []]


def gated(pod: JSON) -> bool:
    """Held by the operator's gate (a foreign one alone does not count)."""
    return SCHEDULING_GATE in gates(pod)


def claims(pod: JSON) -> bool:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(CLAIM_LABEL) == "true"


def finished(pod: JSON) -> bool:
    return (pod.get("status") or {}).get("phase") in FINISHED


def required_terms(pod: JSON) -> list[JSON]:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    return list((affinity.get(REQUIRED) or {}).get("nodeSelectorTerms") or [])


def allows(pod: JSON, node: JSON) -> bool:
    """Whether ``pod``'s node selector, required affinity and tolerations allow ``node``."""
    spec, name = pod.get("spec") or {}, node["metadata"]["name"]
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    terms = required_terms(pod)
    if terms and not any(_term(term, labels, name) for term in terms):
        return False
    taints = list((node.get("spec") or {}).get("taints") or [])
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    tolerations = spec.get("tolerations") or []
    return all(
        taint.get("effect") not in ("NoSchedule", "NoExecute")
        or any(_tolerates(toleration, taint) for toleration in tolerations)
        for taint in taints
    )


def _term(term: JSON, labels: dict[str, str], name: str) -> bool:
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    return all(_holds(r, labels) for r in expressions) and all(
        _holds(r, {"metadata.name": name}) for r in fields
    )


def _holds(requirement: JSON, values: dict[str, str]) -> bool:
    key, operator = requirement["key"], requirement["operator"]
    wanted = requirement.get("values") or []
    if operator == "In":
        return key in values and values[key] in wanted
    if operator == "NotIn":
        return key not in values or values[key] not in wanted
    if operator == "Exists":
        return key in values
    if operator == "DoesNotExist":
        return key not in values
    raise ValueError(f"the simulation writes no {operator} requirement")


def _tolerates(toleration: JSON, taint: JSON) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return bool(
        toleration.get("key") == taint.get("key")
        and toleration.get("value", "") == taint.get("value", "")
    )


def pinned_to(pod: JSON, node: str) -> bool:
    """Whether the pod may run on ``node`` only by its required affinity: every term
    that matches anything requires ``metadata.name In [node]`` (an empty term matches
    nothing, pinned or not), and one does."""
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    live = [t for t in required_terms(pod) if t.get("matchExpressions") or t.get("matchFields")]
    return bool(live) and all(pin in (term.get("matchFields") or []) for term in live)


def request_mb(pod: JSON) -> int:
    """The memory the pod's containers request (the simulation writes ``<n>Mi``)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        value = ((container.get("resources") or {}).get("requests") or {}).get("memory")
        total += int(value[:-2]) if value else 0
    return total


def memory_mb(node: JSON) -> int:
    """The node's allocatable memory in MiB."""
    value = str(((node.get("status") or {}).get("allocatable") or {}).get("memory", "0Mi"))
    return int(value[:-2]) * (1024 if value.endswith("Gi") else 1)
