"""The custom resources' OpenAPI schema, applied as kube-apiserver applies it.

A fake that accepts a status the real server refuses would hide exactly the bugs
a simulation is for, so writes to Reservations and NodeHeadrooms go through the
same three steps as on the real server, from the same schema (generated from the
models by :func:`headroom.api.crd.all_crds`, so the fake follows model changes):

1. pruning: fields the schema does not know are dropped (a structural schema), and so
   is a null where the schema does not say ``nullable``;
2. defaulting: a missing property with a ``default`` gets it (``spec.vramMB: 0``);
3. validation: type, required, enum, bounds, lengths, pattern, ``date-time``,
   ``maxItems``, list-map keys, and the CEL rules (``x-kubernetes-validations``).

CEL is not interpreted: each rule the CRDs use has a Python twin in
:data:`CEL_RULES`. A rule without one stops the fake at start, loudly, so that a
new rule in the models cannot be silently skipped here.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from headroom.api.crd import all_crds
from headroom.api.selectors import LABEL_KEY
from headroom.kube.transport import ApiError
from headroom_dev.sim.fakeapi.jsonvalue import json_equal

Schema = dict[str, Any]
_ABSENT: Any = object()

CelRule = Callable[[Any, Any], bool]
"""(self, oldSelf or _ABSENT) -> the rule holds."""

CEL_RULES: dict[str, CelRule] = {
    # Transition rule: only checked on update, against the stored value.
    "self == oldSelf": lambda new, old: old is _ABSENT or json_equal(new, old),
    "self.ramMB > 0 || (has(self.vramMB) && self.vramMB > 0)": (
        lambda spec, _: spec.get("ramMB", 0) > 0 or spec.get("vramMB", 0) > 0
    ),
    # The value has already passed the date-time format check, so its year is its first 4 chars.
    "self >= timestamp('1970-01-01T00:00:00Z') && self < timestamp('9000-01-01T00:00:00Z')": (
        lambda value, _: "1970" <= value[:4] < "9000"
    ),
    "!has(self.liveness) || self.liveness != 'Pod' || (has(self.owner) && has(self.owner.pod))": (
        lambda spec, _: spec.get("liveness") != "Pod" or "pod" in (spec.get("owner") or {})
    ),
    # spec.wait (and a HeadroomQuota's maxWait) has already matched the Go-duration pattern.
    "duration(self) <= duration('86400s')": lambda value, _: _seconds(value) <= 86400,
    # HeadroomQuota: maxLifetime and defaultLifetime, Go durations.
    "duration(self) <= duration('316224000s')": lambda value, _: _seconds(value) <= 316224000,
    "!has(self.defaultLifetime) || !has(self.maxLifetime) || "
    "duration(self.defaultLifetime) <= duration(self.maxLifetime)": (
        lambda spec, _: (
            "defaultLifetime" not in spec
            or "maxLifetime" not in spec
            or _seconds(spec["defaultLifetime"]) <= _seconds(spec["maxLifetime"])
        )
    ),
    # A label selector's requirement, and its matchLabels' keys.
    "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : "
    "(!has(self.values) || size(self.values) == 0)": (
        lambda req, _: (
            bool(req.get("values"))
            if req.get("operator") in ("In", "NotIn")
            else not req.get("values")
        )
    ),
    f"self.all(k, size(k) <= 317 && k.matches(r'{LABEL_KEY}'))": (
        lambda labels, _: all(len(k) <= 317 and re.search(LABEL_KEY, k) for k in labels)
    ),
}


def _seconds(value: str) -> float:
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)(ns|us|ms|s|m|h)", value))


_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


@functools.cache
def crd_schemas() -> dict[str, Schema]:
    """plural -> openAPIV3Schema of the served version; every CEL rule checked to be known."""
    schemas: dict[str, Schema] = {}
    for crd in all_crds().values():
        version = crd["spec"]["versions"][0]
        schema = version["schema"]["openAPIV3Schema"]
        _check_rules(schema, crd["spec"]["names"]["plural"])
        schemas[crd["spec"]["names"]["plural"]] = schema
    return schemas


def _check_rules(schema: Schema, where: str) -> None:
    for rule in schema.get("x-kubernetes-validations", []):
        if rule["rule"] not in CEL_RULES:
            raise NotImplementedError(
                f"CRD {where} has the CEL rule {rule['rule']!r}, which the fake API server "
                "does not model: add its Python twin to CEL_RULES in "
                "headroom_dev/sim/fakeapi/schema.py"
            )
    for sub in schema.get("properties", {}).values():
        _check_rules(sub, where)
    for part in ("items", "additionalProperties"):
        if part in schema:
            _check_rules(schema[part], where)


def prune_and_default(value: Any, schema: Schema, *, root: bool = False, old: Any = _ABSENT) -> Any:
    """Drop unknown fields and fill defaults, in place (``value`` is the caller's copy).

    A part that *is* the stored object's (``old``) was conformed when stored: skipped.
    """
    if value is old:
        return value
    if type(value) is dict and "additionalProperties" in schema:  # a map
        for item in value.values():
            prune_and_default(item, schema["additionalProperties"])
    elif type(value) is dict and schema.get("type") == "object":
        properties = schema.get("properties")
        if properties is not None or not schema.get("x-kubernetes-preserve-unknown-fields"):
            known = properties or {}
            for key in [k for k in value if k not in known]:
                if not (root and key in ("apiVersion", "kind", "metadata")):
                    del value[key]
            for key, sub in known.items():
                if key in value and value[key] is None and not sub.get("nullable"):
                    del value[key]  # a null where the schema has no nullable: dropped, not refused
                if key in value:
                    if not (root and key == "metadata"):
                        old_sub = old.get(key, _ABSENT) if type(old) is dict else _ABSENT
                        prune_and_default(value[key], sub, old=old_sub)
                elif "default" in sub:
                    value[key] = _copy_default(sub["default"])
    elif type(value) is list and "items" in schema:
        for item in value:
            prune_and_default(item, schema["items"])
    return value


def _copy_default(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy_default(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_default(v) for v in value]
    return value


def validate(value: Any, schema: Schema, old: Any = _ABSENT) -> list[str]:
    """Field errors in the API server's words; empty when valid. ``old``: the stored object."""
    errors: list[str] = []
    for key, sub in schema.get("properties", {}).items():
        if key == "metadata":
            continue
        if key in value:
            old_sub = old.get(key, _ABSENT) if type(old) is dict else _ABSENT
            _validate(value[key], sub, key, old_sub, errors)
    for key in schema.get("required", []):
        if key not in value:
            errors.append(f"{key}: Required value")
    return errors


def _validate(value: Any, schema: Schema, path: str, old: Any, errors: list[str]) -> None:
    if value is old:
        return  # the stored value itself, shared by the update: validated when it was written
    before = len(errors)
    expected = schema.get("type")
    if expected and not _has_type(value, expected):
        errors.append(
            f'{path}: Invalid value: "{_json_type(value)}": {path} in body must be of type '
            f'{expected}: "{_json_type(value)}"'
        )
        return
    if "enum" in schema and not any(json_equal(value, e) for e in schema["enum"]):
        supported = ", ".join(f'"{e}"' for e in schema["enum"])
        errors.append(f'{path}: Unsupported value: "{value}": supported values: {supported}')
    if expected in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(
                f"{path}: Invalid value: {value}: {path} in body should be greater than "
                f"or equal to {schema['minimum']}"
            )
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(
                f"{path}: Invalid value: {value}: {path} in body should be less than "
                f"or equal to {schema['maximum']}"
            )
    elif expected == "string":
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: Too long: may not be more than {schema['maxLength']} bytes")
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                f'{path}: Invalid value: "{value}": {path} in body should be at least '
                f"{schema['minLength']} chars long"
            )
        if "pattern" in schema and _pattern(schema["pattern"]).search(value) is None:
            errors.append(
                f'{path}: Invalid value: "{value}": {path} in body should match '
                f"'{schema['pattern']}'"
            )
        if schema.get("format") == "date-time" and _DATE_TIME.match(value) is None:
            errors.append(
                f'{path}: Invalid value: "{value}": {path} in body must be of type date-time: '
                f'"{value}"'
            )
    elif expected == "object":
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                old_sub = old.get(key, _ABSENT) if type(old) is dict else _ABSENT
                _validate(value[key], sub, f"{path}.{key}", old_sub, errors)
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}.{key}: Required value")
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            errors.append(
                f"{path}: Too many: {len(value)}: must have at most {schema['maxProperties']} items"
            )
        if "additionalProperties" in schema:
            for key, item in value.items():
                _validate(item, schema["additionalProperties"], f"{path}[{key}]", _ABSENT, errors)
    elif expected == "array":
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(
                f"{path}: Too many: {len(value)}: must have at most {schema['maxItems']} items"
            )
        for index, item in enumerate(value):
            _validate(item, schema.get("items", {}), f"{path}[{index}]", _ABSENT, errors)
        _check_list_map(value, schema, path, errors)
    if len(errors) == before:  # CEL runs only on values that passed the schema
        for rule in schema.get("x-kubernetes-validations", []):
            if not CEL_RULES[rule["rule"]](value, old):
                field = path + rule.get("fieldPath", "")
                errors.append(f"{field}: Invalid value: {rule.get('message', rule['rule'])}")


@functools.cache
def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _check_list_map(value: list[Any], schema: Schema, path: str, errors: list[str]) -> None:
    if schema.get("x-kubernetes-list-type") != "map":
        return
    keys = schema.get("x-kubernetes-list-map-keys", [])
    seen: list[list[Any]] = []
    for index, item in enumerate(value):
        if type(item) is not dict:
            continue
        identity = [item.get(k) for k in keys]
        if identity in seen:
            errors.append(f"{path}[{index}]: Duplicate value: {identity}")
        seen.append(identity)


def _has_type(value: Any, expected: str) -> bool:
    kind = type(value)
    if expected == "integer":
        return kind is int
    if expected == "number":
        return kind is int or kind is float
    if expected == "string":
        return kind is str
    if expected == "boolean":
        return kind is bool
    if expected == "object":
        return kind is dict
    if expected == "array":
        return kind is list
    return True


def _json_type(value: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        dict: "object",
        list: "array",
    }.get(type(value), "null")


def invalid(qualified_kind: str, name: str, errors: list[str]) -> ApiError:
    """422 Invalid, worded as kube-apiserver words it."""
    detail = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    return ApiError(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {detail}')
