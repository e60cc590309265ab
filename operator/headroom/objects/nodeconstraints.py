"""Where a pod may run: kube-scheduler's hard constraints of a pod against a node.

Pure: no I/O. Split from :mod:`headroom.objects.pods` (which builds a gated pod's
reservation and the patches that place it) because both the placement of a new
reservation and the check that a gated pod's node still suits it read these, and
nothing else of a pod. The candidates are exactly the nodes kube-scheduler could
pick by ``spec.nodeSelector``, required node affinity (``matchExpressions`` on
labels, ``matchFields`` on ``metadata.name``; terms are ORed), NoSchedule/NoExecute
taints against the pod's tolerations, and ``spec.unschedulable``, so that the pin
the operator adds never contradicts the pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What decides whether a pod may run on a node, copied from the Node."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[JSON, ...] = ()
    unschedulable: bool = False


def node_facts(obj: JSON) -> NodeFacts:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    labels = meta.get("labels") or {}
    taints = spec.get("taints") or []
    return NodeFacts(
        name=str(meta.get("name", "")),
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        taints=tuple(t for t in taints if isinstance(t, dict)) if isinstance(taints, list) else (),
        unschedulable=spec.get("unschedulable") is True,
    )


def may_run_on(pod: JSON, node: NodeFacts) -> bool:
    """Whether kube-scheduler's hard constraints of ``pod`` allow ``node``."""
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    if any(node.labels.get(key) != value for key, value in selector.items()):
        return False
    terms = required_terms(spec)
    if terms is not None and not any(_term_matches(term, node) for term in terms):
        return False
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, dict)]
    taints = list(node.taints)
    if node.unschedulable:
        taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
    return all(
        taint.get("effect") not in ("NoSchedule", "NoExecute")
        or any(_tolerates(toleration, taint) for toleration in tolerations)
        for taint in taints
    )


def required_terms(spec: JSON) -> list[JSON] | None:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED) or {}
    terms = required.get("nodeSelectorTerms")
    return [t for t in terms if isinstance(t, dict)] if terms else None


def _term_matches(term: JSON, node: NodeFacts) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no objects (as the scheduler reads it)
    return all(_requirement(r, node.labels) for r in expressions) and all(
        _requirement(r, {"metadata.name": node.name}) for r in fields
    )


def _requirement(requirement: JSON, values: dict[str, str]) -> bool:
    key, operator = requirement.get("key"), requirement.get("operator")
    wanted = [str(v) for v in requirement.get("values") or []]
    present = key in values
    value = values.get(str(key), "")
    if operator == "In":
        return present and value in wanted
    if operator == "NotIn":
        return not present or value not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, bound = int(value), int(wanted[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _tolerates(toleration: JSON, taint: JSON) -> bool:
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key")
    if toleration.get("operator") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")
