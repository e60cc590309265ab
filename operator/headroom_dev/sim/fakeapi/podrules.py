"""What kube-apiserver lets a write do to a Pod: scheduling gates, placement, binding.

The simulation's gated pods prove something only if the fake refuses what the real
server refuses, so the rules the operator's gating relies on are enforced here as
``pkg/apis/core/validation`` (ValidatePodCreate, ValidatePodUpdate) and
``pkg/registry/core/pod`` (the strategy and BindingREST) of v1.36.3 have them:

- create: a gate together with ``spec.nodeName`` is refused, and so are duplicate
  gates; a gated pod starts with the condition ``PodScheduled=False`` reason
  ``SchedulingGated``;
- update of the main resource: gates may only be removed, never added; existing
  tolerations stay; while the stored pod is gated, ``spec.nodeSelector`` accepts
  additions only, a node affinity without required terms may be set, and existing
  required terms accept added requirements only (their number fixed); the rest of
  the spec is immutable but for container images — ``spec.nodeName`` included —
  and ``activeDeadlineSeconds``, which may be set or lowered, never raised or
  removed (the operator sets it in the ungate patch to end a pod with its
  reservation's lifetime). (The real server also lets
  ``terminationGracePeriodSeconds`` go from negative to 1; here it is immutable:
  stricter, so nothing the sim proves leans on it.)
- ``pods/binding``, what kube-scheduler posts: sets ``spec.nodeName`` once, never on
  a gated pod (409, as BindingREST wraps its refusals), and turns ``PodScheduled``
  True, without a new ``metadata.generation`` (it bypasses the pod strategy).

Empty lists and maps count as absent, as Go's semantic equality and ``omitempty``
have them, and an emptied ``schedulingGates`` is not stored. Everything else in a
pod spec is stored as sent, not validated.
"""

from __future__ import annotations

import json
from typing import Any

from headroom.kube.transport import ApiError
from headroom_dev.sim.fakeapi.jsonvalue import json_equal

JSON = dict[str, Any]
GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_TERMS_PATH = f"spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms"
_UPDATABLE = ",".join(
    (
        "`spec.containers[*].image`",
        "`spec.initContainers[*].image`",
        "`spec.activeDeadlineSeconds`",
        "`spec.tolerations` (only additions to existing tolerations)",
        "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously "
        "negative)",
    )
)


def _dicts(value: Any) -> list[JSON]:
    return [v for v in value if type(v) is dict] if type(value) is list else []


def _map(value: Any) -> JSON:
    return value if type(value) is dict else {}


def _plain(value: Any) -> Any:
    """``value`` without absent-equivalent members (None, "", [], {}), recursively."""
    if type(value) is dict:
        members = {k: _plain(v) for k, v in value.items()}
        return {k: v for k, v in members.items() if v is not None and v not in ("", [], {})}
    if type(value) is list:
        return [_plain(v) for v in value]
    return value


def _same(a: Any, b: Any) -> bool:
    return json_equal(_plain(a), _plain(b))


def _shown(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


# -- create ------------------------------------------------------------------------------------


def create_errors(pod: JSON) -> list[str]:
    """ValidatePodCreate's rules on gates, in the API server's words."""
    spec = _map(pod.get("spec"))
    errors: list[str] = []
    seen: set[Any] = set()
    for index, gate in enumerate(_dicts(spec.get("schedulingGates"))):
        name = gate.get("name")
        if name in seen:
            errors.append(f'spec.schedulingGates[{index}]: Duplicate value: "{name}"')
        seen.add(name)
    if spec.get("nodeName") and spec.get("schedulingGates"):
        errors.append(
            "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared"
        )
    return errors


def prepare_create(pod: JSON, now: str) -> None:
    """In place, on the create body: drop empty gates; a gated pod says so in its status."""
    _drop_empty_gates(pod)
    if _map(pod.get("spec")).get("schedulingGates"):
        status = pod.setdefault("status", {})
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": now,
                "reason": "SchedulingGated",
                "message": GATED_MESSAGE,
            }
        ]


def _drop_empty_gates(pod: JSON) -> None:
    spec = pod.get("spec")
    if type(spec) is dict and "schedulingGates" in spec and not spec["schedulingGates"]:
        pod["spec"] = {k: v for k, v in spec.items() if k != "schedulingGates"}


# -- update ------------------------------------------------------------------------------------


def prepare_update(pod: JSON) -> None:
    """In place, on the object an update stores (a fresh top-level dict)."""
    _drop_empty_gates(pod)


def update_errors(old: JSON, new: JSON) -> list[str]:
    """ValidatePodUpdate's rules on the spec, in the API server's words."""
    before, after = _map(old.get("spec")), _map(new.get("spec"))
    if _same(before, after):
        return []
    errors = _gate_errors(before, after) + _toleration_errors(before, after)
    errors += _deadline_errors(before, after)
    munged = dict(after)
    munged["activeDeadlineSeconds"] = before.get("activeDeadlineSeconds")
    for key in ("containers", "initContainers"):
        olds, news = _dicts(before.get(key)), _dicts(after.get(key))
        if len(olds) == len(news):
            munged[key] = [_with_image(n, o) for o, n in zip(olds, news, strict=True)]
    for key in ("schedulingGates", "tolerations"):
        munged[key] = before.get(key)
    if before.get("schedulingGates"):
        errors += _gated_placement(before, munged)
    if not _same(munged, before):
        errors.append(f"spec: Forbidden: pod updates may not change fields other than {_UPDATABLE}")
    return errors


def _deadline_errors(before: JSON, after: JSON) -> list[str]:
    """Set from nil, or lowered: nothing else (the spec's own bound, 1 and up, too)."""
    path = "spec.activeDeadlineSeconds"
    old, new = before.get("activeDeadlineSeconds"), after.get("activeDeadlineSeconds")
    if new is None:
        if old is None:
            return []
        return [
            f"{path}: Invalid value: null: must not update from a positive integer to nil value"
        ]
    if type(new) is not int or not 1 <= new <= 2**31 - 1:
        return [
            f"{path}: Invalid value: {_shown(new)}: must be between 1 and 2147483647, inclusive"
        ]
    if type(old) is int and old < new:
        return [f"{path}: Invalid value: {new}: must be less than or equal to previous value"]
    return []


def _with_image(new: JSON, old: JSON) -> JSON:
    munged = {k: v for k, v in new.items() if k != "image"}
    if "image" in old:
        munged["image"] = old["image"]
    return munged


def _gate_errors(before: JSON, after: JSON) -> list[str]:
    had = {gate.get("name") for gate in _dicts(before.get("schedulingGates"))}
    return [
        f"spec.schedulingGates[{index}].name: Forbidden: only deletion is allowed, but found "
        f"new scheduling gate '{gate.get('name')}'"
        for index, gate in enumerate(_dicts(after.get("schedulingGates")))
        if gate.get("name") not in had
    ]


def _toleration_errors(before: JSON, after: JSON) -> list[str]:
    def key(toleration: JSON) -> Any:
        return _plain({k: v for k, v in toleration.items() if k != "tolerationSeconds"})

    now = [key(t) for t in _dicts(after.get("tolerations"))]
    for toleration in _dicts(before.get("tolerations")):
        if not any(json_equal(key(toleration), n) for n in now):
            return [
                "spec.tolerations: Forbidden: existing toleration can not be modified except "
                "its tolerationSeconds"
            ]
    return []


def _gated_placement(before: JSON, munged: JSON) -> list[str]:
    """A gated pod's node selector and node affinity; ``munged`` is set back to the old
    ones, so that what is left to compare is the rest of the spec."""
    errors: list[str] = []
    old_selector, new_selector = _map(before.get("nodeSelector")), _map(munged.get("nodeSelector"))
    if not _same(old_selector, new_selector):
        if any(new_selector.get(k) != v for k, v in old_selector.items()):
            errors.append(
                f"spec.nodeSelector: Invalid value: {_shown(new_selector)}: only additions to "
                "spec.nodeSelector are allowed (no mutations or deletions)"
            )
        munged["nodeSelector"] = before.get("nodeSelector")
    old_affinity, new_affinity = _map(before.get("affinity")), _map(munged.get("affinity"))
    old_node, new_node = old_affinity.get("nodeAffinity"), new_affinity.get("nodeAffinity")
    if not _same(old_node, new_node):
        errors += _node_affinity_errors(_map(new_node), _map(old_node))
        others = {k: v for k, v in new_affinity.items() if k != "nodeAffinity"}
        if old_node is not None:
            munged["affinity"] = {**others, "nodeAffinity": old_node}
        else:
            munged["affinity"] = others
    return errors


def _node_affinity_errors(new: JSON, old: JSON) -> list[str]:
    if old.get(REQUIRED) is None:
        return []  # no required terms before: anything may be set
    old_terms = _dicts(_map(old.get(REQUIRED)).get("nodeSelectorTerms"))
    new_terms = _dicts(_map(new.get(REQUIRED)).get("nodeSelectorTerms"))
    if old_terms and len(old_terms) != len(new_terms):
        return [
            f"{_TERMS_PATH}: Invalid value: {_shown(new_terms)}: no additions/deletions to "
            "non-empty NodeSelectorTerms list are allowed"
        ]
    return [
        f"{_TERMS_PATH}[{index}]: Invalid value: {_shown(new_term)}: only additions are "
        "allowed (no mutations or deletions)"
        for index, (old_term, new_term) in enumerate(zip(old_terms, new_terms, strict=False))
        if not _only_additions(new_term, old_term)
    ]


def _only_additions(new: JSON, old: JSON) -> bool:
    old_parts = [_dicts(old.get(k)) for k in ("matchExpressions", "matchFields")]
    new_parts = [_dicts(new.get(k)) for k in ("matchExpressions", "matchFields")]
    if not any(old_parts) and any(new_parts):
        return False  # an empty term stays empty
    return all(
        not was or (len(now) >= len(was) and _same(now[: len(was)], was))
        for was, now in zip(old_parts, new_parts, strict=True)
    )


# -- pods/binding ------------------------------------------------------------------------------

BOUND = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def binding_errors(name: str, binding: Any) -> None:
    """A Binding's own checks, made before the pod is read (so before a 404)."""
    if type(binding) is not dict:
        raise ApiError(400, "BadRequest", "the body of the request is not a JSON object")
    target = _map(binding.get("target"))
    if _map(binding.get("metadata")).get("name") != name:
        raise ApiError(400, "BadRequest", "name in URL does not match name in Binding object")
    errors = []
    if target.get("kind") not in (None, "", "Node"):
        errors.append(
            f'target.kind: Unsupported value: "{target.get("kind")}": supported values: '
            '"Node", "<empty>"'
        )
    if not target.get("name"):
        errors.append("target.name: Required value")
    if errors:  # not a StatusError in BindingREST: the handler answers 500
        raise ApiError(500, "", errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")


def bound(pod: JSON, binding: JSON, now: str) -> JSON:
    """The pod a Binding (checked by :func:`binding_errors`) makes of ``pod`` (a new
    dict), or the ApiError the server answers."""
    meta = pod["metadata"]
    name = meta["name"]
    binding_meta, target = _map(binding.get("metadata")), _map(binding.get("target"))
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        wanted = binding_meta.get(field)
        if wanted and wanted != meta[field]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods "{name}": Precondition failed: '
                f"{label} in precondition: {wanted}, {label} in object meta: {meta[field]}",
            )
    spec = _map(pod.get("spec"))
    refusal = None
    if spec.get("nodeName"):
        refusal = f'pod {name} is already assigned to node "{spec["nodeName"]}"'
    elif spec.get("schedulingGates"):
        refusal = f"pod {name} has non-empty .spec.schedulingGates"
    if refusal is not None:
        raise ApiError(
            409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": {refusal}'
        )
    result = dict(pod)
    result["metadata"] = dict(meta)
    annotations = _map(binding_meta.get("annotations"))
    if annotations:
        result["metadata"]["annotations"] = {**_map(meta.get("annotations")), **annotations}
    result["spec"] = {**spec, "nodeName": target["name"]}
    result["status"] = _scheduled(_map(pod.get("status")), now)
    return result


def _scheduled(status: JSON, now: str) -> JSON:
    """UpdatePodCondition(PodScheduled=True): replaces the condition where it is."""
    condition: JSON = {
        "type": "PodScheduled",
        "status": "True",
        "lastProbeTime": None,
        "lastTransitionTime": now,
    }
    conditions = list(_dicts(status.get("conditions")))
    for index, existing in enumerate(conditions):
        if existing.get("type") == "PodScheduled":
            if existing.get("status") == "True":
                condition["lastTransitionTime"] = existing.get("lastTransitionTime")
            conditions[index] = condition
            break
    else:
        conditions.append(condition)
    return {**status, "conditions": conditions}
