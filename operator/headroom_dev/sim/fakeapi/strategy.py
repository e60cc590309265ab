"""What a write does to an object, kind by kind: kube-apiserver's "strategies".

Given what a client sent and what is stored, these functions produce the object
to store or the ApiError the real server answers, without touching the store:
the create body's checks and server-set fields, the status subresource versus
the main resource, optimistic concurrency, ``metadata.generation``, ObjectMeta
validation (names, label and annotation keys and values) and, for custom
resources, the CRD schema (:mod:`headroom_dev.sim.fakeapi.schema`).
"""

from __future__ import annotations

import re
from typing import Any

from headroom.kube.transport import ApiError
from headroom_dev.sim.fakeapi.jsonvalue import clone, json_equal
from headroom_dev.sim.fakeapi.kinds import PODS, Kind, Target
from headroom_dev.sim.fakeapi.podrules import (
    create_errors,
    prepare_create,
    prepare_update,
    update_errors,
)
from headroom_dev.sim.fakeapi.schema import crd_schemas, invalid, prune_and_default, validate

JSON = dict[str, Any]

SERVER_FIELDS = (
    "uid",
    "creationTimestamp",
    "generation",
    "namespace",
    "name",
    "resourceVersion",
    "generateName",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ANNOTATIONS_MAX_BYTES = 256 * 1024


def not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{kind.resource} "{name}" not found')


def conflict(kind: Kind, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {kind.resource} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
    )


def method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def deleted_status(kind: Kind, name: str | None, uid: str) -> JSON:
    """What a DELETE answers for a kind deleted at once (not a Pod: that is the object)."""
    details: JSON = {"name": name, "kind": kind.plural, "uid": uid}
    if kind.group:
        details = {"name": name, "group": kind.group, **details}
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }


def name_mismatch(sent: object, name: str) -> ApiError:
    return bad_request(
        f"the name of the object ({sent}) does not match the name on the URL ({name})"
    )


# -- create ----------------------------------------------------------------------------------


def create_body(kind: Kind, body: Any) -> JSON:
    """A fresh copy of a create body, its kind checked (custom) or filled in (core)."""
    if type(body) is not dict:
        raise bad_request("the body of the request is not a JSON object")
    obj: JSON = clone(body)
    if kind.custom:
        if not obj.get("kind"):
            raise bad_request(
                f"the object provided is unrecognized (must be of type {kind.kind}): "
                "Object 'Kind' is missing"
            )
        if obj["kind"] != kind.kind:
            raise invalid(
                f"{obj['kind']}.{kind.group}",
                str((obj.get("metadata") or {}).get("name", "")),
                [f'kind: Invalid value: "{obj["kind"]}": must be {kind.kind}'],
            )
        if obj.get("apiVersion") != kind.api_version:
            raise bad_request(
                f"the API version in the data ({obj.get('apiVersion')}) does not match "
                f"the expected API version ({kind.api_version})"
            )
    else:
        obj = {"kind": kind.kind, "apiVersion": kind.api_version, **obj}
    if type(obj.get("metadata")) is not dict:
        obj["metadata"] = {}
    if obj["metadata"].get("resourceVersion"):
        raise ApiError(500, "", "resourceVersion should not be set on objects to be created")
    for field in SERVER_FIELDS:
        if field not in ("name", "namespace", "generateName"):
            obj["metadata"].pop(field, None)
    return obj


def check_name(kind: Kind, name: str) -> None:
    if len(name) > 253 or _SUBDOMAIN.match(name) is None:
        raise invalid(
            kind.qualified_kind,
            name,
            [f'metadata.name: Invalid value: "{name}": must be a lowercase RFC 1123 subdomain'],
        )


def initial_status(kind: Kind, obj: JSON, now: str) -> None:
    """What a create does with ``status`` (and a Namespace's spec and label)."""
    if kind.status_on_create == "drop":
        obj.pop("status", None)
    elif kind.status_on_create == "pending":
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        if kind is PODS:
            prepare_create(obj, now)
    elif kind.status_on_create == "active":
        labels = obj["metadata"].setdefault("labels", {})
        labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        obj["spec"] = {"finalizers": ["kubernetes"]}
        obj["status"] = {"phase": "Active"}


def check_new(kind: Kind, obj: JSON) -> None:
    """Metadata and, for a custom resource, the schema (pruning and defaulting first)."""
    name = obj["metadata"]["name"]
    errors = metadata_errors(obj["metadata"], decoding=True)
    if kind is PODS:
        errors += create_errors(obj)
    if kind.custom:
        schema = crd_schemas()[kind.plural]
        prune_and_default(obj, schema, root=True)
        errors += validate(obj, schema)
    if errors:
        raise invalid(kind.qualified_kind, name, errors)


# -- update ----------------------------------------------------------------------------------


def updated(target: Target, old: JSON, candidate: JSON, *, patched: bool) -> JSON:
    """The object an update of ``old`` to ``candidate`` stores (``old`` itself if a no-op).

    ``candidate`` is the client's intent (a PUT body, or ``old`` with a patch
    applied); it may share unchanged parts with ``old``, which are never mutated.
    """
    kind, name = target.kind, target.name or ""
    old_metadata = old["metadata"]
    new_metadata = candidate.get("metadata")
    if type(new_metadata) is not dict:
        new_metadata = {}
    wanted = new_metadata.get("resourceVersion")
    if wanted and wanted != old_metadata["resourceVersion"]:
        raise conflict(kind, name)
    if new_metadata.get("name", name) != name:
        raise name_mismatch(new_metadata.get("name"), name)
    errors: list[str] = []
    if target.subresource == "status":
        # Only status moves; everything else, metadata included, stays as stored.
        result = dict(old)
        result["metadata"] = dict(old_metadata)
        if "status" in candidate:
            result["status"] = candidate["status"]
        else:
            result.pop("status", None)
    else:
        result = dict(candidate)
        metadata = dict(new_metadata)
        for field in SERVER_FIELDS:
            if field in old_metadata:
                metadata[field] = old_metadata[field]
            else:
                metadata.pop(field, None)
        result["metadata"] = metadata
        result["apiVersion"], result["kind"] = old["apiVersion"], old["kind"]
        if kind.status_subresource:
            if "status" in old:
                result["status"] = old["status"]
            else:
                result.pop("status", None)
        errors = metadata_errors(metadata, decoding=not (patched and kind.custom))
        if kind is PODS:
            prepare_update(result)
            errors += update_errors(old, result)
    if kind.custom:
        schema = crd_schemas()[kind.plural]
        prune_and_default(result, schema, root=True, old=old)
        errors += validate(result, schema, old)
    if errors:
        raise invalid(kind.qualified_kind, name, errors)
    if kind.generation and content_changed(old, result):
        result["metadata"]["generation"] = old_metadata.get("generation", 1) + 1
    if json_equal(result, old):
        return old  # a no-op: no new revision, no watch event
    return result


def content_changed(old: JSON, new: JSON) -> bool:
    """Anything but metadata and status differs: what bumps ``metadata.generation``."""
    keys = (set(old) | set(new)) - {"metadata", "status"}
    return any(not json_equal(old.get(k), new.get(k)) for k in sorted(keys))


def metadata_errors(metadata: JSON, *, decoding: bool) -> list[str]:
    """ObjectMeta validation of labels and annotations, in the API server's words.

    A label or annotation that is not a string fails to decode (400) in a create
    or PUT body; in a custom resource's patched object it is a field error (422).
    """
    errors: list[str] = []
    for field in ("labels", "annotations"):
        values = metadata.get(field)
        if values is not None and (
            type(values) is not dict or any(type(v) is not str for v in values.values())
        ):
            if decoding:
                raise bad_request(f"json: cannot unmarshal into Go struct field ObjectMeta.{field}")
            return [f"metadata.{field}: Invalid value: must be a map of strings"]
    labels = metadata.get("labels")
    if labels is not None:
        for key, value in labels.items():
            errors += _key_errors("metadata.labels", key)
            if len(value) > 63 or _LABEL_VALUE.match(value) is None:
                errors.append(
                    f'metadata.labels: Invalid value: "{value}": a valid label must be an '
                    "empty string or consist of alphanumeric characters, '-', '_' or '.', "
                    "and must start and end with an alphanumeric character"
                )
    annotations = metadata.get("annotations")
    if annotations is not None:
        size = 0
        for key, value in annotations.items():
            errors += _key_errors("metadata.annotations", key)
            size += len(key) + len(value.encode())
        if size > _ANNOTATIONS_MAX_BYTES:
            errors.append(
                f"metadata.annotations: Too long: must have at most {_ANNOTATIONS_MAX_BYTES} bytes"
            )
    return errors


def _key_errors(field: str, key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    if "/" in prefix or (prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix))):
        return [
            f'{field}: Invalid value: "{key}": prefix part must be a lowercase RFC 1123 subdomain'
        ]
    if len(name) > 63 or not _NAME_PART.match(name):
        return [
            f'{field}: Invalid value: "{key}": name part must consist of alphanumeric '
            "characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ]
    return []
