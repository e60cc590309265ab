"""A claim checked against the Reservation schema before anything is sent.

A value the API server would refuse costs a round trip at best; found after a
create, it can leave a reservation behind (the command line once created one, then
refused its own ``--timeout``). So every value goes through the types the CRD
schema is generated from (``headroom.api.models``), then through the generated
schema itself (``headroom.api.crd``) for the patterns and lengths a pydantic
validator reads more loosely (``spec.wait: ".5s"`` parses, the schema refuses it),
and is refused with the API server's wording. Nothing here restates a rule: the
bounds and patterns are the models'. Messages name the field as the caller wrote
it: a flag on the command line (``--ram``), the schema's path in the library
(``spec.ramMB``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from headroom.api.constants import API_VERSION
from headroom.api.crd import structural
from headroom.api.models import DNS_LABEL, MB, NodeName, ReservationSpec, WaitDuration
from headroom.api.parse import InvalidValueError, format_time, parse_duration
from headroom.client.errors import InvalidClaimError

JSON = dict[str, Any]

#: How the library names each value in its messages: by the schema's path.
SCHEMA_NAMES: Mapping[str, str] = {
    "node": "spec.node",
    "ramMB": "spec.ramMB",
    "vramMB": "spec.vramMB",
    "gpus": "spec.gpus",
    "ttl": "ttl",
    "expiresAt": "spec.expiresAt",
    "wait": "spec.wait",
    "description": "spec.description",
    "owner": "spec.owner.pod",
    "name": "metadata.name",
}

#: A Reservation's name, like a Node's, is a DNS subdomain of at most 253 characters.
SUBDOMAIN: TypeAdapter[str] = TypeAdapter(NodeName)
#: Kubernetes' rule for namespace names: a DNS label.
NAMESPACE: TypeAdapter[str] = TypeAdapter(
    Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
)
MIB: TypeAdapter[int] = TypeAdapter(MB)
#: spec.gpus with the model's own bounds (its field's metadata: ``ge``, ``le``).
_GPUS_BOUNDS = ReservationSpec.model_fields["gpus"].metadata
GPUS: TypeAdapter[int] = TypeAdapter(Annotated[int, *_GPUS_BOUNDS])
WAIT: TypeAdapter[timedelta] = TypeAdapter(WaitDuration)
#: The spec's schema as the API server holds it (patterns, lengths).
_SPEC_SCHEMA = structural(ReservationSpec)


def shown(value: object) -> str:
    """As the API server quotes a value: strings in double quotes, numbers bare."""
    if isinstance(value, str):
        text = value if len(value) <= 80 else f"{value[:75]}..."
        return json.dumps(text, ensure_ascii=False)
    return str(value)


def describe(label: str, error: ErrorDetails, unit: str = "MiB") -> str:
    """One pydantic error in the API server's words, naming ``label``; whole numbers
    are counted in ``unit``."""
    kind, ctx, value = error["type"], error.get("ctx") or {}, error["input"]
    if kind == "string_too_long":
        return f"{label}: Too long: may not be more than {ctx['max_length']} characters"
    if kind == "string_too_short":
        return f"{label}: Required value"
    if kind == "string_pattern_mismatch":
        return (
            f"{label}: Invalid value: {shown(value)}: a lowercase RFC 1123 "
            + ("label" if ctx["pattern"] == DNS_LABEL else "subdomain")
            + " must consist of lower case alphanumeric characters, '-'"
            + ("" if ctx["pattern"] == DNS_LABEL else " or '.'")
            + f", and must start and end with an alphanumeric character "
            f"(regex used for validation is '{ctx['pattern']}')"
        )
    if kind == "greater_than_equal":
        return f"{label}: Invalid value: {value}: should be greater than or equal to {ctx['ge']}"
    if kind == "less_than_equal":
        return f"{label}: Invalid value: {value}: should be less than or equal to {ctx['le']}"
    if kind in ("int_parsing", "int_from_float", "int_type"):
        return f"{label}: Invalid value: {shown(value)}: must be a whole number of {unit}"
    if kind == "value_error" and "error" in ctx:  # a total parser's own sentence
        return f"{label}: Invalid value: {shown(value)}: {ctx['error']}"
    return f"{label}: Invalid value: {shown(value)}: {error['msg']}"


def check(adapter: TypeAdapter[Any], label: str, value: object, unit: str = "MiB") -> Any:
    """``value`` through one of the schema's types; else InvalidClaimError naming ``label``."""
    try:
        return adapter.validate_python(value)
    except ValidationError as error:
        raise InvalidClaimError(label, describe(label, error.errors()[0], unit)) from None


def duration(value: str | timedelta, label: str) -> timedelta:
    """A Go-style duration above zero (``parse_duration`` refuses anything under 1 ms)."""
    try:
        return parse_duration(value, label)
    except InvalidValueError as error:
        raise InvalidClaimError(label, str(error)) from None


def go_duration(value: timedelta) -> str:
    """``1h30m``, ``90s``, ``1500ms``: a duration as ``spec.wait`` is written."""
    micros = round(value.total_seconds() * 1_000_000)
    if micros % 1_000_000:
        return f"{micros // 1000}ms" if micros % 1000 == 0 else f"{micros}us"
    seconds, text = micros // 1_000_000, ""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size:
            text += f"{seconds // size}{unit}"
            seconds %= size
    return text + f"{seconds}s" if seconds or not text else text


def _against_schema(values: JSON, schema: JSON, path: str, labels: Mapping[str, str]) -> None:
    """Strings against the schema's own ``maxLength`` and ``pattern``."""
    for key, value in values.items():
        prop = schema.get("properties", {}).get(key, {})
        where = f"{path}.{key}"
        label = labels.get(key, where) if path == "spec" else labels.get(path[5:], where)
        if isinstance(value, dict):
            _against_schema(value, prop, where, labels)
        elif isinstance(value, str):
            if "maxLength" in prop and len(value) > prop["maxLength"]:
                raise InvalidClaimError(
                    label, f"{label}: Too long: may not be more than {prop['maxLength']} characters"
                )
            if "pattern" in prop and not re.search(prop["pattern"], value):
                raise InvalidClaimError(
                    label,
                    f"{label}: Invalid value: {shown(value)}: "
                    f"{where} in body should match '{prop['pattern']}'",
                )


@dataclass(frozen=True)
class ClaimRequest:
    """A checked claim; :meth:`body` is the Reservation to create on a node."""

    node: str | None  # None: to be placed (``--node auto``)
    ram_mb: int
    vram_mb: int = 0
    #: Over how many GPU devices vram_mb is spread; None: not said (the operator's 1).
    gpus: int | None = None
    ttl: timedelta | None = None
    wait: str | None = None  # as written in spec.wait
    description: str | None = None
    owner_pod: str | None = None
    name: str | None = None

    @property
    def wait_for(self) -> timedelta | None:
        """How long the reservation may wait for room, or None (decided at once)."""
        return None if self.wait is None else WAIT.validate_python(self.wait)

    def spec(self, node: str, now: datetime) -> JSON:
        spec: JSON = {"node": node, "ramMB": self.ram_mb}
        if self.vram_mb:
            spec["vramMB"] = self.vram_mb
        if self.gpus is not None:
            spec["gpus"] = self.gpus
        if self.ttl is not None:
            spec["expiresAt"] = format_time(now + self.ttl)
        if self.description is not None:
            spec["description"] = self.description
        if self.owner_pod is not None:
            spec["owner"] = {"pod": self.owner_pod}
        if self.wait is not None:
            spec["wait"] = self.wait
        return spec

    def body(self, node: str, now: datetime | None = None) -> JSON:
        """The Reservation to create; without a name, ``metadata`` is left empty."""
        metadata = {"name": self.name} if self.name is not None else {}
        return {
            "apiVersion": API_VERSION,
            "kind": "Reservation",
            "metadata": metadata,
            "spec": self.spec(node, now or datetime.now(UTC)),
        }


def request(
    *,
    node: str | None,
    ram_mb: int | str,
    vram_mb: int | str = 0,
    gpus: int | str | None = None,
    ttl: timedelta | str | None = None,
    wait: timedelta | str | None = None,
    description: str | None = None,
    owner_pod: str | None = None,
    name: str | None = None,
    labels: Mapping[str, str] = SCHEMA_NAMES,
    now: datetime | None = None,
) -> ClaimRequest:
    """Every value checked as the API server would; else :class:`InvalidClaimError`."""
    ram: int = check(MIB, labels["ramMB"], ram_mb)
    vram: int = check(MIB, labels["vramMB"], vram_mb)
    devices: int | None = None if gpus is None else check(GPUS, labels["gpus"], gpus, "devices")
    if ram == 0 and vram == 0:
        raise InvalidClaimError(
            labels["ramMB"],
            f"{labels['ramMB']}: Invalid value: at least one of {labels['ramMB']} and "
            f"{labels['vramMB']} must be above 0",
        )
    if node is not None:
        check(SUBDOMAIN, labels["node"], node)
    written_wait: str | None = None
    if wait is not None:
        waited: timedelta = check(WAIT, labels["wait"], wait)
        written_wait = wait.strip() if isinstance(wait, str) else go_duration(waited)
    checked = ClaimRequest(
        node=node,
        ram_mb=ram,
        vram_mb=vram,
        gpus=devices,
        ttl=None if ttl is None else duration(ttl, labels["ttl"]),
        wait=written_wait,
        description=description,
        owner_pod=owner_pod,
        name=None if name is None else check(SUBDOMAIN, labels["name"], name),
    )
    # The spec as a whole, through the model the CRD schema is generated from and then
    # the schema itself, so that nothing the API server would refuse is sent.
    spec = checked.spec(node or "placed-later", now or datetime.now(UTC))
    try:
        ReservationSpec.model_validate(spec)
    except ValidationError as error:
        first = error.errors()[0]
        label = labels.get(str(first["loc"][0]), f"spec.{first['loc'][0]}")
        raise InvalidClaimError(label, describe(label, first)) from None
    _against_schema(spec, _SPEC_SCHEMA, "spec", labels)
    return checked
