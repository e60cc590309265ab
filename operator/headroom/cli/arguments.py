"""Check every argument before anything is sent to the cluster.

A bad ``--timeout`` found after the create used to leave an admitted reservation
behind, so every value is checked first, against the same types the CRD schema
is generated from (``headroom.api.models``), and refused with the API server's
own wording: ``--ram: Invalid value: -5: should be greater than or equal to 0``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from headroom.api.constants import API_VERSION
from headroom.api.models import DNS_LABEL, MB, NodeName, ReservationSpec
from headroom.api.parse import InvalidValueError, format_time, parse_duration
from headroom.cli.exits import UsageError

#: A Reservation's name, like a Node's, is a DNS subdomain of at most 253 characters.
_SUBDOMAIN: TypeAdapter[str] = TypeAdapter(NodeName)
#: Kubernetes' rule for namespace names: a DNS label.
_NAMESPACE: TypeAdapter[str] = TypeAdapter(
    Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
)
_MIB: TypeAdapter[int] = TypeAdapter(MB)
#: Flags for the spec fields a ReservationSpec error can name.
_FLAG_OF_FIELD = {
    "node": "--node",
    "ramMB": "--ram",
    "vramMB": "--vram",
    "expiresAt": "--ttl",
    "description": "--description",
    "owner": "--owner-pod",
}
DEFAULT_TIMEOUT = "60s"


def _shown(value: object) -> str:
    """As the API server quotes a value: strings in double quotes, numbers bare."""
    if isinstance(value, str):
        text = value if len(value) <= 80 else f"{value[:75]}..."
        return json.dumps(text, ensure_ascii=False)
    return str(value)


def _message(flag: str, error: ErrorDetails) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error["input"]
    if kind == "string_too_long":
        return f"{flag}: Too long: may not be more than {ctx['max_length']} characters"
    if kind == "string_too_short":
        return f"{flag}: Required value"
    if kind == "string_pattern_mismatch":
        return (
            f"{flag}: Invalid value: {_shown(value)}: a lowercase RFC 1123 "
            + ("label" if ctx["pattern"] == DNS_LABEL else "subdomain")
            + " must consist of lower case alphanumeric characters, '-'"
            + ("" if ctx["pattern"] == DNS_LABEL else " or '.'")
            + f", and must start and end with an alphanumeric character "
            f"(regex used for validation is '{ctx['pattern']}')"
        )
    if kind == "greater_than_equal":
        return f"{flag}: Invalid value: {value}: should be greater than or equal to {ctx['ge']}"
    if kind == "less_than_equal":
        return f"{flag}: Invalid value: {value}: should be less than or equal to {ctx['le']}"
    if kind in ("int_parsing", "int_from_float", "int_type"):
        return f"{flag}: Invalid value: {_shown(value)}: must be a whole number of MiB"
    return f"{flag}: Invalid value: {_shown(value)}: {error['msg']}"


def _checked(adapter: TypeAdapter[Any], flag: str, value: object) -> Any:
    try:
        return adapter.validate_python(value)
    except ValidationError as error:
        raise UsageError(_message(flag, error.errors()[0])) from None


def name(value: str, flag: str = "name") -> str:
    """An object name: a DNS subdomain."""
    checked: str = _checked(_SUBDOMAIN, flag, value)
    return checked


def namespace(value: str | None) -> str | None:
    """``-n``: a DNS label, or None for the kubeconfig's."""
    if value is None:
        return None
    checked: str = _checked(_NAMESPACE, "--namespace", value)
    return checked


def duration(value: str, flag: str) -> timedelta:
    """A Go-style duration above zero (``parse_duration`` refuses anything under 1 ms)."""
    try:
        return parse_duration(value, flag)
    except InvalidValueError as error:
        raise UsageError(str(error)) from None


def reservation(args: Any, now: datetime | None = None) -> dict[str, Any]:
    """The Reservation ``reserve`` would create, every flag checked; else UsageError."""
    ram: int = _checked(_MIB, "--ram", args.ram)
    vram: int = _checked(_MIB, "--vram", args.vram)
    if ram == 0 and vram == 0:
        raise UsageError("--ram: Invalid value: at least one of --ram and --vram must be above 0")
    spec: dict[str, Any] = {"node": _checked(_SUBDOMAIN, "--node", args.node), "ramMB": ram}
    if vram:
        spec["vramMB"] = vram
    if args.ttl is not None:
        spec["expiresAt"] = format_time((now or datetime.now(UTC)) + duration(args.ttl, "--ttl"))
    if args.description is not None:
        spec["description"] = args.description
    if args.owner_pod is not None:
        spec["owner"] = {"pod": args.owner_pod}
    # The spec as a whole, through the model the CRD schema is generated from, so
    # nothing the API server would refuse is sent (description length, owner pod).
    try:
        ReservationSpec.model_validate(spec)
    except ValidationError as error:
        first = error.errors()[0]
        flag = _FLAG_OF_FIELD.get(str(first["loc"][0]), str(first["loc"][0]))
        raise UsageError(_message(flag, first)) from None
    metadata = {"name": name(args.name, "--name")} if args.name is not None else {}
    return {"apiVersion": API_VERSION, "kind": "Reservation", "metadata": metadata, "spec": spec}
