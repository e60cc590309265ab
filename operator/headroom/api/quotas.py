"""HeadroomQuota: how much memory a group of namespaces may hold, where, and for how long.

The per-node ledger keeps a node from being over-committed; it does not keep one
team from holding every node. A HeadroomQuota is the per-tenant dimension on top,
shaped like Kueue's ClusterQueue (a cluster-scoped object whose
``namespaceSelector`` picks the namespaces it governs together) because platform
teams already think in it. It caps what those namespaces hold at once (RAM,
VRAM, Admitted entries), which nodes they may claim on, and how long a claim may
live or wait. A namespace selected by two quotas is bound by both.

Like the Reservation schema, these models are the CRD's one source: the bounds
and CEL rules here are what ``kubectl apply`` refuses, and the operator reads
quotas with the same models, so a quota that passed the API server reads the same
in the operator (one written before a bound tightened is isolated, not obeyed).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from headroom.api.constants import (
    GO_DURATION,
    MAX_LIFETIME,
    MAX_QUOTA_ENTRIES,
    MAX_QUOTA_MB,
    MAX_WAIT,
)
from headroom.api.parse import parse_duration
from headroom.api.selectors import LabelSelector


def _hours(bound: timedelta) -> str:
    return f"{int(bound.total_seconds() // 3600)}h"


def _duration_parser(bound: timedelta) -> Callable[[object], timedelta]:
    """A Go duration up to ``bound``, refused in the API server's words: pattern, then CEL."""

    def parse(value: object) -> timedelta:
        if isinstance(value, str) and not re.fullmatch(GO_DURATION, value):
            raise ValueError(f"should match '{GO_DURATION}'")
        duration = parse_duration(value, low=timedelta(0), high=timedelta(days=10**6))
        if duration > bound:
            raise ValueError(f"must be at most {_hours(bound)}")
        return duration

    return parse


def _duration_schema(bound: timedelta) -> dict[str, object]:
    return {
        "type": "string",
        "pattern": GO_DURATION,
        "maxLength": 32,
        "x-kubernetes-validations": [
            {
                "rule": f"duration(self) <= duration('{int(bound.total_seconds())}s')",
                "message": f"must be at most {_hours(bound)}",
            }
        ],
    }


Lifetime = Annotated[
    timedelta,
    BeforeValidator(_duration_parser(MAX_LIFETIME)),
    WithJsonSchema(_duration_schema(MAX_LIFETIME)),
]
WaitBound = Annotated[
    timedelta,
    BeforeValidator(_duration_parser(MAX_WAIT)),
    WithJsonSchema(_duration_schema(MAX_WAIT)),
]
QuotaMB = Annotated[int, Field(ge=0, le=MAX_QUOTA_MB)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class HeadroomQuotaSpec(_Model):
    """What the selected namespaces may hold together. An absent limit is no limit."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.defaultLifetime) || !has(self.maxLifetime) || "
                    "duration(self.defaultLifetime) <= duration(self.maxLifetime)",
                    "message": "spec.defaultLifetime must not be longer than spec.maxLifetime",
                    "fieldPath": ".defaultLifetime",
                }
            ]
        }
    )

    namespace_selector: LabelSelector = Field(
        alias="namespaceSelector",
        description=(
            "The namespaces this quota governs, together. {} selects every namespace; "
            "kubernetes.io/metadata.name selects one by name."
        ),
    )
    ram_mb: QuotaMB | None = Field(
        None, alias="ramMB", description="The most RAM they may hold at once, MiB."
    )
    vram_mb: QuotaMB | None = Field(
        None, alias="vramMB", description="The most VRAM they may hold at once, MiB."
    )
    max_entries: int | None = Field(
        None,
        alias="maxEntries",
        ge=0,
        le=MAX_QUOTA_ENTRIES,
        description="The most Admitted reservations they may have at once.",
    )
    node_selector: LabelSelector | None = Field(
        None,
        alias="nodeSelector",
        description="The nodes they may reserve on (by Node labels). Absent: every node.",
    )
    max_lifetime: Lifetime | None = Field(
        None,
        alias="maxLifetime",
        description=(
            "The longest a reservation may live: the most spec.expiresAt may be after its "
            "creation. One without expiresAt gets defaultLifetime, or this."
        ),
    )
    default_lifetime: Lifetime | None = Field(
        None,
        alias="defaultLifetime",
        description=(
            "The expiry given to a reservation that sets none, counted from its creation; "
            "shown in its status.expiresAt and enforced like spec.expiresAt."
        ),
    )
    max_wait: WaitBound | None = Field(
        None, alias="maxWait", description="The longest spec.wait a reservation may ask for."
    )
    description: str | None = Field(None, max_length=1024, description="Free text for people.")

    @model_validator(mode="after")
    def _default_within_max(self) -> HeadroomQuotaSpec:
        if (
            self.default_lifetime is not None
            and self.max_lifetime is not None
            and self.default_lifetime > self.max_lifetime
        ):
            raise ValueError("spec.defaultLifetime must not be longer than spec.maxLifetime")
        return self


class NamespaceUsage(_Model):
    """What one governed namespace holds and waits for."""

    namespace: str = Field(max_length=63, description="The namespace.")
    ram_mb: int = Field(alias="ramMB", ge=0, description="RAM held by Admitted reservations.")
    vram_mb: int = Field(alias="vramMB", ge=0, description="VRAM held by Admitted reservations.")
    entries: int = Field(ge=0, description="Admitted reservations.")
    queued: int = Field(0, ge=0, description="Reservations Queued on this quota.")
    queued_ram_mb: int = Field(
        0, alias="queuedRAMMB", ge=0, description="RAM the Queued reservations ask for."
    )


class HeadroomQuotaStatus(_Model):
    """What the governed namespaces hold, together and each, written by the operator."""

    ram_mb: int = Field(alias="ramMB", ge=0, description="RAM held, all namespaces, MiB.")
    vram_mb: int = Field(alias="vramMB", ge=0, description="VRAM held, all namespaces, MiB.")
    entries: int = Field(ge=0, description="Admitted reservations, all namespaces.")
    queued: int = Field(0, ge=0, description="Reservations Queued on this quota.")
    remaining_ram_mb: int | None = Field(
        None,
        alias="remainingRAMMB",
        ge=0,
        description="RAM still to be had under spec.ramMB (0 when over it); absent: no limit.",
    )
    remaining_vram_mb: int | None = Field(
        None,
        alias="remainingVRAMMB",
        ge=0,
        description="VRAM still to be had under spec.vramMB; absent: no limit.",
    )
    remaining_entries: int | None = Field(
        None,
        alias="remainingEntries",
        ge=0,
        description="Entries still to be had under spec.maxEntries; absent: no limit.",
    )
    over: bool = Field(
        False,
        description=(
            "Holds more than a limit (the quota was lowered under what is held): "
            "nothing new is admitted until usage falls below it; nothing is reclaimed."
        ),
    )
    valid: bool = Field(
        True,
        description="False when the operator cannot read the spec; message says why.",
    )
    message: str | None = Field(None, max_length=4096, description="Why the spec is not valid.")
    namespace_count: int = Field(
        0, alias="namespaceCount", ge=0, description="How many namespaces it governs."
    )
    namespaces: list[NamespaceUsage] | None = Field(
        None, max_length=10_000, description="Each governed namespace's usage."
    )
    observed_generation: int | None = Field(
        None, alias="observedGeneration", description="The spec generation this describes."
    )
    updated_at: datetime | None = Field(
        None, alias="updatedAt", description="When the operator last wrote this status."
    )
