"""The Kubernetes API of Headroom, as pydantic models.

These models are the one source of truth for the CRDs: ``headroom.api.crd``
turns their JSON schema into the structural OpenAPI schemas in ``crds/``, and a
test fails when the files drift. Field names are the camelCase names on the
wire; descriptions become ``kubectl explain`` text, so they are written for the
person reading it. Constraints here are the ones the API server enforces at
``kubectl apply`` time; the operator re-validates with the same models.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from headroom.api.constants import (
    GO_DURATION,
    HEARTBEAT_ANNOTATION,
    MAX_DEVICE_NAME,
    MAX_GPUS,
    MAX_MB,
    MAX_NODE_SUM_MB,
    MAX_PID,
    MAX_TIME,
    MAX_WAIT,
    MIN_TIME,
    OWNER_LABEL,
)
from headroom.api.parse import format_time, parse_duration, parse_time
from headroom.api.reasons import Phase, Reason

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

MB = Annotated[int, Field(ge=0, le=MAX_MB)]
#: A sum over one node's reservations.
SumMB = Annotated[int, Field(ge=0, le=MAX_NODE_SUM_MB)]
#: A time a tenant writes: RFC 3339, within [MIN_TIME, MAX_TIME) — checked by the
#: API server (CEL) at apply time and by the same bound in the operator's parser.
TenantTime = Annotated[
    datetime,
    BeforeValidator(parse_time),
    Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        f"self >= timestamp('{format_time(MIN_TIME)}') && "
                        f"self < timestamp('{format_time(MAX_TIME)}')"
                    ),
                    "message": (
                        f"must be at or after {format_time(MIN_TIME)} "
                        f"and before {format_time(MAX_TIME)}"
                    ),
                }
            ]
        }
    ),
]
NodeName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]


WAIT_TOO_LONG = f"must be at most {int(MAX_WAIT.total_seconds() // 3600)}h"


#: How long a reservation may wait for room: a Go duration up to MAX_WAIT, checked by
#: the API server (pattern and CEL) and by the same bound in the operator's parser.
def _wait(value: object) -> timedelta:
    """spec.wait as the API server reads it, with the API server's words: the schema's
    pattern, then its CEL bound."""
    if isinstance(value, str) and not re.fullmatch(GO_DURATION, value):
        raise ValueError(f"spec.wait in body should match '{GO_DURATION}'")
    # A generous parse bound, so that any duration over MAX_WAIT gets the CEL rule's words.
    duration = parse_duration(value, low=timedelta(0), high=timedelta(days=10**6))
    if duration > MAX_WAIT:
        raise ValueError(WAIT_TOO_LONG)
    return duration


WaitDuration = Annotated[
    timedelta,
    BeforeValidator(_wait),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": GO_DURATION,
            "maxLength": 32,
            "x-kubernetes-validations": [
                {
                    "rule": f"duration(self) <= duration('{int(MAX_WAIT.total_seconds())}s')",
                    "message": WAIT_TOO_LONG,
                }
            ],
        }
    ),
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Owner(_Model):
    """Who holds the reservation. Informational, except ``pod``."""

    exec_id: str | None = Field(
        None, alias="execID", max_length=253, description="Execution ID of the owning run."
    )
    surface: str | None = Field(
        None, max_length=63, description="Where the owner runs from, e.g. cli, api, notebook."
    )
    pid: int | None = Field(
        None, ge=1, le=MAX_PID, description="Process ID of the owner on its node."
    )
    origin: str | None = Field(
        None, max_length=63, description="What started the owner, e.g. batch, interactive."
    )
    pod: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description=(
            "A pod in the reservation's namespace that owns it. Its "
            f"`{HEARTBEAT_ANNOTATION}` annotation refreshes the heartbeat, and "
            "deleting the pod releases the reservation. The pod must carry the label "
            f"`{OWNER_LABEL}=true` for the operator to watch it."
        ),
    )


class ReservationSpec(_Model):
    """A claim on a node's memory. Immutable: a different size is a new reservation."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.ramMB > 0 || (has(self.vramMB) && self.vramMB > 0)",
                    "message": "at least one of spec.ramMB and spec.vramMB must be above 0",
                    "fieldPath": ".ramMB",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.liveness) || self.liveness != 'Pod' || "
                    "(has(self.owner) && has(self.owner.pod))",
                    "message": "spec.liveness Pod needs spec.owner.pod: the pod it lives with",
                    "fieldPath": ".liveness",
                    "reason": "FieldValueRequired",
                },
                {
                    "rule": "self == oldSelf",
                    "message": (
                        "spec is immutable: to change a reservation, delete it and create a new one"
                    ),
                },
            ]
        },
    )

    node: NodeName = Field(description="Name of the Node to reserve memory on.")
    ram_mb: MB = Field(alias="ramMB", description="RAM to reserve, in MiB.")
    vram_mb: MB = Field(
        0,
        alias="vramMB",
        description=(
            "GPU memory to reserve, in MiB. Enforced on nodes whose GPU inventory is known "
            "(DRA ResourceSlices, HAMi's annotation or GPU Feature Discovery labels)."
        ),
    )
    gpus: int | None = Field(
        None,
        ge=0,
        le=MAX_GPUS,
        description=(
            "Over how many GPU devices vramMB is spread; each needs its share "
            "(vramMB / gpus, rounded up) free. Absent: 1. 0: no device assignment, only "
            "the node's VRAM sum is checked (a claim spanning the whole node's GPUs)."
        ),
    )
    owner: Owner | None = Field(None, description="Who holds the reservation.")
    expires_at: TenantTime | None = Field(
        None,
        alias="expiresAt",
        description="Hard expiry (RFC 3339). The reservation is reclaimed after it.",
    )
    description: str | None = Field(None, max_length=1024, description="Free text for people.")
    wait: WaitDuration | None = Field(
        None,
        description=(
            "How long the reservation may wait for room (a Go duration, e.g. 10m, at most "
            "24h), measured from its creation. One that does not fit now is Queued instead "
            "of Rejected, admitted in order as soon as it fits, and Rejected WaitTimeout "
            "when the wait runs out. Absent: decided at once."
        ),
    )
    liveness: Literal["Heartbeat", "Pod"] | None = Field(
        None,
        description=(
            "What keeps the reservation alive. Heartbeat (the default): heartbeats, "
            "reclaimed when they stop for the stale window. Pod: the pod named in "
            "spec.owner.pod; never stale, released when that pod ends (Succeeded or "
            "Failed) or is deleted. The operator creates Pod reservations for gated pods."
        ),
    )

    @model_validator(mode="after")
    def _pod_liveness_names_a_pod(self) -> ReservationSpec:
        if self.liveness == "Pod" and (self.owner is None or self.owner.pod is None):
            raise ValueError("spec.liveness Pod needs spec.owner.pod: the pod it lives with")
        return self


class Condition(_Model):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str = Field(max_length=316, description="Type of condition, e.g. Admitted.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, description="CamelCase reason for the last transition.")
    message: str = Field("", max_length=32768, description="Human-readable details.")
    last_transition_time: datetime = Field(
        alias="lastTransitionTime", description="When the status last changed."
    )
    observed_generation: int | None = Field(
        None, alias="observedGeneration", ge=0, description="Generation this was set from."
    )


class DeviceShare(_Model):
    """Part of an admission on GPU devices: one device and the MiB held on it."""

    id: str = Field(
        min_length=1,
        max_length=MAX_DEVICE_NAME,
        description=(
            "The device: its UUID (GPU-…, MIG-…) where the inventory has one, what "
            "CUDA_VISIBLE_DEVICES takes; else <driver>/<pool>/<device> or gfd-<n>."
        ),
    )
    memory_mb: MB = Field(alias="memoryMB", description="MiB of its memory held, MiB.")


class ReservationStatus(_Model):
    """Written only by the operator (status subresource)."""

    phase: Phase = Field(description="Pending, Queued, Admitted, Rejected or Reclaimed.")
    reason: Reason | None = Field(None, description="Machine-readable reason for the phase.")
    message: str | None = Field(
        None, max_length=4096, description="One sentence with the numbers that decided it."
    )
    admitted_at: datetime | None = Field(
        None, alias="admittedAt", description="When the reservation was admitted."
    )
    last_heartbeat: datetime | None = Field(
        None, alias="lastHeartbeat", description="Last heartbeat the operator recorded."
    )
    reclaimed_at: datetime | None = Field(
        None, alias="reclaimedAt", description="When the reservation was reclaimed."
    )
    expires_at: datetime | None = Field(
        None,
        alias="expiresAt",
        description=(
            "While Admitted without spec.expiresAt: the expiry its namespace's HeadroomQuota "
            "gave it (defaultLifetime), enforced like spec.expiresAt."
        ),
    )
    decision_id: str | None = Field(
        None,
        alias="decisionID",
        max_length=128,
        description="Stamp of the operator decision that set the phase.",
    )
    decision_stamp: str | None = Field(
        None,
        alias="decisionStamp",
        max_length=128,
        description="HMAC the operator puts on its decisions; it ignores a status without it.",
    )
    observed_generation: int | None = Field(
        None, alias="observedGeneration", ge=0, description="Generation of the decided spec."
    )
    queue_position: int | None = Field(
        None,
        alias="queuePosition",
        ge=1,
        description="While Queued: its place in its node's queue, 1 is next.",
    )
    devices: list[DeviceShare] | None = Field(
        None,
        max_length=MAX_GPUS,
        description=(
            "While Admitted on a node with a GPU inventory: the devices its VRAM is on "
            "and the MiB on each. Part of the decision (covered by decisionStamp)."
        ),
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Standard conditions; `Admitted` carries the decision.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )


class DeviceHeadroom(_Model):
    """One GPU device of a node: its memory, what is held on it and what is free."""

    id: str = Field(min_length=1, max_length=MAX_DEVICE_NAME, description="Device id.")
    kind: Literal["gpu", "mig"] = Field(description="A whole GPU or a MIG device.")
    model: str | None = Field(None, max_length=253, description="Product name, if known.")
    memory_mb: MB = Field(alias="memoryMB", description="Its memory, MiB.")
    reserved_mb: SumMB = Field(alias="reservedMB", description="Held by admitted claims, MiB.")
    external_mb: SumMB = Field(
        0,
        alias="externalMB",
        description=(
            "Held outside Headroom, MiB: by allocated DRA ResourceClaims (their "
            "consumedCapacity memory, or the whole device) and by device-plugin pods "
            "(whole devices), beyond what those pods' own claims hold here."
        ),
    )
    held_outside: Literal["DevicePlugin", "ResourceClaim"] | None = Field(
        None,
        alias="heldOutside",
        description=(
            "Set when the whole device is someone else's, so nothing of it is free: "
            "DevicePlugin (a bound pod's nvidia.com/gpu, taken as the emptiest devices: "
            "the API does not say which) or ResourceClaim (allocated whole)."
        ),
    )
    free_mb: MB | None = Field(
        None,
        alias="freeMB",
        description=(
            "memory × VRAM ratio − reserved − external (0 when held whole outside); "
            "absent when unlimited (ratio 0)."
        ),
    )


class NodeHeadroomStatus(_Model):
    """One node's headroom (seed: NodeSummary), kept current by the operator."""

    capacity_known: bool = Field(
        alias="capacityKnown", description="Whether the node's RAM capacity is known."
    )
    total_ram_mb: MB = Field(alias="totalRAMMB", description="Node RAM the ledger counts, MiB.")
    system_reserve_mb: MB = Field(
        alias="systemReserveMB", description="RAM held back from reservations, MiB."
    )
    max_overcommit_ratio: str = Field(
        alias="maxOvercommitRatio",
        max_length=32,
        description="Overcommit ratio in force, exact decimal; 0 means unlimited.",
    )
    limit_ram_mb: SumMB | None = Field(
        None,
        alias="limitRAMMB",
        description="total × ratio − reserve: the most that can be reserved; absent if unlimited.",
    )
    reserved_ram_mb: SumMB = Field(alias="reservedRAMMB", description="RAM admitted, MiB.")
    allocatable_ram_mb: SumMB = Field(
        alias="allocatableRAMMB", description="RAM that can still be reserved, MiB."
    )
    reserved_vram_mb: SumMB = Field(alias="reservedVRAMMB", description="VRAM admitted, MiB.")
    vram_capacity_mb: MB | None = Field(
        None,
        alias="vramCapacityMB",
        description="VRAM capacity from GPU labels, MiB; absent when unknown (not enforced).",
    )
    max_vram_overcommit_ratio: str | None = Field(
        None,
        alias="maxVramOvercommitRatio",
        max_length=32,
        description="VRAM overcommit ratio in force, per device and for the sum; 0: unlimited.",
    )
    limit_vram_mb: SumMB | None = Field(
        None,
        alias="limitVRAMMB",
        description=(
            "VRAM capacity × VRAM overcommit ratio, less what is held outside Headroom on the "
            "node's devices: the most the node's claims may hold in sum, MiB; absent when "
            "VRAM is unknown or unlimited (ratio 0)."
        ),
    )
    active_entries: int = Field(
        alias="activeEntries", ge=0, description="Admitted reservations on the node."
    )
    stale_entries: int = Field(
        alias="staleEntries", ge=0, description="Admitted reservations past the heartbeat window."
    )
    max_entries: int = Field(alias="maxEntries", ge=0, description="Cap on active entries.")
    utilization_percent: int = Field(
        alias="utilizationPercent",
        ge=0,
        description="Reserved RAM as a whole percent of total RAM (display only).",
    )
    queued_entries: int = Field(
        0, alias="queuedEntries", ge=0, description="Reservations waiting for room on the node."
    )
    queued_ram_mb: SumMB = Field(
        0, alias="queuedRAMMB", description="RAM the waiting reservations ask for, MiB."
    )
    pod_requests_mb: SumMB = Field(
        0,
        alias="podRequestsMB",
        description=(
            "Memory that pods bound to the node requested beyond what they hold in the "
            "ledger, MiB: kube-scheduler booked it, so it is out of the limit (config "
            "podRequests: subtract)."
        ),
    )
    stale_window_seconds: int = Field(
        300,
        alias="staleWindowSeconds",
        ge=1,
        description="Heartbeat stale window on the node: heartbeat well within it.",
    )
    over_committed: bool = Field(
        alias="overCommitted",
        description=(
            "Reserved RAM or VRAM exceeds the limit, or a device holds more than its limit "
            "(e.g. after the node shrank or a GPU went away, or a holder outside Headroom "
            "came after its claims)."
        ),
    )
    gpu_source: str | None = Field(
        None,
        alias="gpuSource",
        max_length=32,
        description="Where the GPU inventory was read: ResourceSlice, HAMi or GFD.",
    )
    gpu_policy: str | None = Field(
        None,
        alias="gpuPolicy",
        max_length=16,
        description="How a claim's devices are chosen here: binpack or spread.",
    )
    largest_free_device_mb: MB | None = Field(
        None,
        alias="largestFreeDeviceMB",
        description="The most VRAM free on one device, MiB: the largest one-GPU claim that fits.",
    )
    device_plugin_gpus: int | None = Field(
        None,
        alias="devicePluginGPUs",
        ge=0,
        description=(
            "GPUs that pods bound here hold through the device plugin beyond the devices "
            "their own claims hold; each is taken as a whole device (heldOutside)."
        ),
    )
    devices: list[DeviceHeadroom] | None = Field(
        None, max_length=MAX_GPUS, description="Every GPU device, by id."
    )
    updated_at: datetime | None = Field(
        None, alias="updatedAt", description="When the operator last wrote this summary."
    )
