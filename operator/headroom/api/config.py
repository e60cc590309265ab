"""The operator's configuration file, validated before anything starts.

One YAML document, camelCase like every Kubernetes config (see docs/reference/config.md for
the defaults). Unknown keys are errors, not silently ignored: a typo such as
``systemReserveMb`` must stop the operator with the field named, not run it with
the default. Durations are Go-style strings (``90s``, ``5m``, ``1h30m``) or
seconds as a number.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from fractions import Fraction
from functools import partial
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    model_validator,
)

from headroom.api.constants import (
    DEFAULT_DEVICE_PLUGIN_RESOURCES,
    DEFAULT_DRA_DRIVERS,
    DEFAULT_MAX_ENTRIES_PER_NODE,
    DEFAULT_SYSTEM_RESERVE_MB,
    MAX_DRA_DRIVERS,
    MAX_ENTRIES_PER_NODE,
    MAX_MB,
)
from headroom.api.gpus import GpuPolicy
from headroom.api.limits import Limits
from headroom.api.models import DNS_SUBDOMAIN
from headroom.api.parse import parse_duration, parse_ratio, shown

#: Short timers (sweeps, summaries, lease retries) may be fast, but not a busy loop.
FastDuration = Annotated[
    timedelta, BeforeValidator(partial(parse_duration, low=timedelta(milliseconds=10)))
]
#: How long a stopping replica keeps answering the webhook: 0 (a local process) to 5 min.
DrainDuration = Annotated[
    timedelta, BeforeValidator(partial(parse_duration, low=timedelta(0), high=timedelta(minutes=5)))
]
#: How long a review waits for the ledger's outlook: it must stay under the webhook's
#: timeoutSeconds (the chart's is 2s), so a busy leader answers "no outlook" in time.
OutlookTimeout = Annotated[
    timedelta,
    BeforeValidator(
        partial(parse_duration, low=timedelta(milliseconds=10), high=timedelta(seconds=10))
    ),
]
#: Windows and periods that are meant in seconds or more.
Duration = Annotated[timedelta, BeforeValidator(partial(parse_duration, low=timedelta(seconds=1)))]
Ratio = Annotated[Fraction, BeforeValidator(parse_ratio)]
#: A DRA driver's name, as ``spec.driver`` of a ResourceSlice spells it.
DriverName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
#: An extended resource a device plugin advertises, ``<domain>/<name>`` (``nvidia.com/gpu``).
ExtendedResource = Annotated[
    str,
    Field(
        min_length=3,
        max_length=316,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    ),
]


class LimitsConfig(BaseModel):
    """Default limits for every node; Node annotations override them per node."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    max_overcommit_ratio: Ratio = Field(Fraction(1), alias="maxOvercommitRatio")
    system_reserve_mb: StrictInt = Field(
        DEFAULT_SYSTEM_RESERVE_MB, alias="systemReserveMB", ge=0, le=MAX_MB
    )
    heartbeat_stale_window: Duration = Field(timedelta(minutes=5), alias="heartbeatStaleWindow")
    max_entries_per_node: StrictInt = Field(
        DEFAULT_MAX_ENTRIES_PER_NODE, alias="maxEntriesPerNode", ge=1, le=MAX_ENTRIES_PER_NODE
    )
    max_vram_overcommit_ratio: Ratio = Field(
        Fraction(1),
        alias="maxVramOvercommitRatio",
        description="Reserved/total memory allowed on each GPU device (and a node's VRAM sum).",
    )
    gpu_policy: GpuPolicy = Field(
        GpuPolicy.BINPACK,
        alias="gpuPolicy",
        description="binpack: a claim goes on the fullest device it fits; spread: the emptiest.",
    )

    def to_limits(self) -> Limits:
        return Limits(
            max_overcommit_ratio=self.max_overcommit_ratio,
            system_reserve_mb=self.system_reserve_mb,
            heartbeat_stale_window=self.heartbeat_stale_window,
            max_entries_per_node=self.max_entries_per_node,
            max_vram_overcommit_ratio=self.max_vram_overcommit_ratio,
            gpu_policy=self.gpu_policy,
        )


class GpusConfig(BaseModel):
    """Where a node's GPU devices are read (see ``headroom.objects.gpus``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    dra_drivers: tuple[DriverName, ...] = Field(
        DEFAULT_DRA_DRIVERS,
        alias="draDrivers",
        max_length=MAX_DRA_DRIVERS,
        description=(
            "DRA drivers whose node-local ResourceSlices are read as GPU devices; "
            "empty: ResourceSlices are not read (HAMi or GFD only)."
        ),
    )
    device_plugin_resources: tuple[ExtendedResource, ...] = Field(
        DEFAULT_DEVICE_PLUGIN_RESOURCES,
        alias="devicePluginResources",
        max_length=MAX_DRA_DRIVERS,
        description=(
            "Extended resources that device plugins give whole GPUs by: a bound pod asking "
            "k of them holds k of its node's devices; empty: pods' GPUs are not counted."
        ),
    )


class LeaderElectionConfig(BaseModel):
    """Hot standby: replicas compete for a Lease; only its holder decides."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    enabled: StrictBool = False
    lease_name: str = Field("headroom-operator", alias="leaseName", min_length=1, max_length=253)
    namespace: str | None = Field(
        None, description="Namespace of the Lease; default $POD_NAMESPACE, else 'default'."
    )
    lease_duration: FastDuration = Field(timedelta(seconds=15), alias="leaseDuration")
    renew_deadline: FastDuration = Field(timedelta(seconds=10), alias="renewDeadline")
    retry_period: FastDuration = Field(timedelta(seconds=2), alias="retryPeriod")

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionConfig:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "need retryPeriod < renewDeadline < leaseDuration, got "
                f"{self.retry_period.total_seconds()}s, {self.renew_deadline.total_seconds()}s, "
                f"{self.lease_duration.total_seconds()}s"
            )
        return self


class DecisionKeyConfig(BaseModel):
    """Where the key that stamps decisions lives (see headroom.kube.stamp)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    enabled: StrictBool = False
    secret_name: str = Field("headroom-decision-key", alias="secretName", min_length=1)
    namespace: str | None = Field(
        None, description="Namespace of the Secret; default $POD_NAMESPACE, else 'default'."
    )
    create: StrictBool = Field(
        True,
        description=(
            "Create the Secret when it is missing. False: it must exist (made by the "
            "platform's own secret management); the operator does not start without it."
        ),
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="Labels of the Secret the operator creates."
    )


class QueueingConfig(BaseModel):
    """How reservations that wait for room (``spec.wait``) are admitted, per node."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    strategy: Literal["BestEffortFIFO", "StrictFIFO"] = Field(
        "BestEffortFIFO",
        description=(
            "BestEffortFIFO: in creation order, but a later one that fits goes before an "
            "earlier one that does not (Kueue's default). StrictFIFO: the oldest blocks the "
            "ones behind it, and a new one does not go ahead of those waiting."
        ),
    )

    @property
    def strict(self) -> bool:
        return self.strategy == "StrictFIFO"


class QuotasConfig(BaseModel):
    """What governs a namespace that no HeadroomQuota selects."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    unselected_namespaces: Literal["Unlimited", "Deny"] = Field(
        "Unlimited",
        alias="unselectedNamespaces",
        description=(
            "Unlimited: a namespace no HeadroomQuota selects is bound only by the nodes "
            "(as before quotas existed). Deny: it may hold nothing; its reservations are "
            "refused NoQuota (or wait for a quota, with spec.wait)."
        ),
    )


#: The common name of the client certificate the extender's callers present.
EXTENDER_CLIENT = "headroom-scheduler"

#: Certificates live up to a year (the longest configured duration); renewed at 2/3.
CertificateDuration = Annotated[
    timedelta,
    BeforeValidator(partial(parse_duration, low=timedelta(hours=1), high=timedelta(days=366))),
]


class WebhookCertificateConfig(BaseModel):
    """The webhook's CA and serving certificate, kept by the operator in one Secret."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    secret_name: str = Field(
        "headroom-webhook-cert", alias="secretName", min_length=1, max_length=253
    )
    namespace: str | None = Field(
        None, description="Namespace of the Secret; default $POD_NAMESPACE, else 'default'."
    )
    service_name: str = Field("headroom-webhook", alias="serviceName", min_length=1, max_length=63)
    service_namespace: str | None = Field(
        None, alias="serviceNamespace", description="Default: the Secret's namespace."
    )
    extra_names: list[str] = Field(
        default_factory=list,
        alias="extraNames",
        max_length=16,
        description="More DNS names or IP addresses for the serving certificate.",
    )
    webhook_configuration: str | None = Field(
        "headroom",
        alias="webhookConfiguration",
        description="MutatingWebhookConfiguration whose caBundle is kept; null: none.",
    )
    ca_validity: CertificateDuration = Field(timedelta(days=365), alias="caValidity")
    validity: CertificateDuration = Field(timedelta(days=90))
    check_period: FastDuration = Field(
        timedelta(seconds=10),
        alias="checkPeriod",
        description="How often the Secret and the caBundle are checked (and mended).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> WebhookCertificateConfig:
        if not self.check_period * 10 <= self.validity <= self.ca_validity:
            raise ValueError(
                "need 10 × checkPeriod <= validity <= caValidity, got "
                f"{self.check_period.total_seconds()}s, {self.validity.total_seconds()}s, "
                f"{self.ca_validity.total_seconds()}s"
            )
        return self


class WebhookConfig(BaseModel):
    """The mutating admission webhook that gates opted-in pods (every replica serves it)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    enabled: StrictBool = False
    host: str = "0.0.0.0"  # a pod listens on all interfaces
    port: StrictInt = Field(9443, ge=0, le=65535)
    certificate: WebhookCertificateConfig = Field(default_factory=WebhookCertificateConfig)
    drain_delay: DrainDuration = Field(
        timedelta(0),
        alias="drainDelay",
        description=(
            "After a stop signal the webhook keeps answering this long (the Lease is "
            "released at once): a terminating pod's endpoint leaves the Service only as "
            "the EndpointSlice controller and the API server see it go. The chart sets 5s."
        ),
    )
    provisional_hold: Duration = Field(
        timedelta(seconds=5),
        alias="provisionalHold",
        description=(
            "In a namespace labelled headroom.dev/outlook=strict, a create told 'would be "
            "admitted' holds its room until its Reservation is decided; if no Reservation "
            "of its uid is seen within this (its create failed after the webhook allowed "
            "it, or the review was not the API server's), the room is given back."
        ),
    )
    outlook_timeout: OutlookTimeout = Field(
        timedelta(seconds=1),
        alias="outlookTimeout",
        description=(
            "A Reservation create's review (/validate-reservations) waits this long for "
            "the leader's ledger, then is answered with no outlook. Keep it under the "
            "ValidatingWebhookConfiguration's timeoutSeconds."
        ),
    )


class PlacementConfig(BaseModel):
    """Who chooses an opted-in pod's node (``docs/development/design-scheduler-extender.md``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    mode: Literal["gate", "scheduler"] = Field(
        "gate",
        description=(
            "gate: the webhook gates opted-in pods; the operator chooses a node by memory "
            "and its hard constraints, and pins the pod there once admitted. scheduler: the "
            "webhook gives them schedulerName (below), a second kube-scheduler whose "
            "extender is this operator (extenderPort) chooses among the nodes with room "
            "and binds through it. Being built (issue 30): not for production yet."
        ),
    )
    scheduler_name: str = Field(
        "headroom", alias="schedulerName", min_length=1, max_length=253, pattern=r"^[a-z0-9.-]+$"
    )
    bind_grace: FastDuration = Field(
        timedelta(seconds=60),
        alias="bindGrace",
        description=(
            "A reservation admitted for kube-scheduler's choice whose pod is not bound this "
            "long after (no bind in flight) is released, after a fence write on the pod that "
            "makes any Binding still on its way fail."
        ),
    )

    @property
    def scheduler(self) -> str | None:
        """The scheduler the webhook hands opted-in pods to (mode scheduler), else None."""
        return self.scheduler_name if self.mode == "scheduler" else None


class OperatorConfig(BaseModel):
    """Everything the operator reads at start."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    gpus: GpusConfig = Field(default_factory=GpusConfig)
    ram_source: Literal["allocatable", "capacity"] = Field(
        "allocatable",
        alias="ramSource",
        description="Which Node figure is a node's total RAM.",
    )
    pod_requests: Literal["subtract", "ignore"] = Field(
        "subtract",
        alias="podRequests",
        description=(
            "subtract: a node's RAM limit leaves out what pods bound to it requested beyond "
            "what they hold in the ledger (kube-scheduler booked it). ignore: the ledger "
            "counts the node's whole RAM, as before."
        ),
    )
    sweep_period: FastDuration = Field(
        timedelta(seconds=10),
        alias="sweepPeriod",
        description="Longest sleep of the reclaim sweeper between checks.",
    )
    reclaimed_retention: Duration = Field(
        timedelta(hours=1),
        alias="reclaimedRetention",
        description="How long a Reclaimed reservation stays before it is deleted.",
    )
    summary_interval: FastDuration = Field(
        timedelta(seconds=1),
        alias="summaryInterval",
        description="Shortest time between two writes of one NodeHeadroom.",
    )
    heartbeat_write_fraction: Decimal = Field(
        Decimal("0.25"),
        alias="heartbeatWriteFraction",
        gt=0,
        le=1,
        description=(
            "status.lastHeartbeat is written again only once the heartbeat has moved "
            "by this fraction of the stale window."
        ),
    )
    resync_period: Duration = Field(
        timedelta(minutes=10),
        alias="resyncPeriod",
        description="How often the ledger is checked against a full list of Reservations.",
    )
    queueing: QueueingConfig = Field(default_factory=QueueingConfig)
    quotas: QuotasConfig = Field(default_factory=QuotasConfig)
    decision_key: DecisionKeyConfig = Field(default_factory=DecisionKeyConfig, alias="decisionKey")
    leader_election: LeaderElectionConfig = Field(
        default_factory=LeaderElectionConfig, alias="leaderElection"
    )
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    probe_port: StrictInt = Field(
        8081, alias="probePort", ge=0, le=65535, description="/healthz and /readyz, plain HTTP."
    )
    probe_host: str = Field("0.0.0.0", alias="probeHost")  # a pod listens on all interfaces
    extender_port: StrictInt | None = Field(
        None,
        alias="extenderPort",
        ge=0,
        le=65535,
        description=(
            "kube-scheduler's extender (filter, prioritize, bind); absent: not served. "
            "Plain HTTP unless extenderClientSecret is set. A preview (issue 30)."
        ),
    )
    extender_host: str = Field("0.0.0.0", alias="extenderHost")
    extender_client_secret: str | None = Field(
        None,
        alias="extenderClientSecret",
        min_length=1,
        max_length=253,
        description=(
            "Serve the extender over HTTPS with the webhook's certificate (name the "
            "extender's Service in webhook.certificate.extraNames) to callers with a client "
            "certificate from its CA only: the operator writes one for "
            f"{EXTENDER_CLIENT} into this Secret (tls.crt, tls.key, ca.crt), beside the "
            "webhook's, for the scheduler to mount. Needs webhook.enabled."
        ),
    )
    extender_scheduler_deployment: str | None = Field(
        None,
        alias="extenderSchedulerDeployment",
        min_length=1,
        max_length=253,
        description=(
            "The scheduler's Deployment, beside that Secret: restarted (a pod-template "
            "annotation) when the CAs in its ca.crt change, which kube-scheduler reads only "
            "at start. Null: restart it by hand after a CA rotation (the operator warns)."
        ),
    )
    metrics_port: StrictInt = Field(8443, alias="metricsPort", ge=0, le=65535)
    metrics_host: str = Field("0.0.0.0", alias="metricsHost")
    metrics_secure: StrictBool = Field(
        True,
        alias="metricsSecure",
        description=(
            "true: /metrics over HTTPS, to a bearer token whose user may get the URL "
            "/metrics (TokenReview, SubjectAccessReview). false: plain HTTP to anyone."
        ),
    )
    metrics_cert_dir: str | None = Field(
        None,
        alias="metricsCertDir",
        min_length=1,
        description=(
            "A directory with tls.crt and tls.key (a mounted Secret), read again every "
            "minute; null: a self-signed certificate made in memory at start."
        ),
    )

    @property
    def binding_for(self) -> str | None:
        """The scheduler whose binds are the operator's: served by the extender
        (``extenderPort``), whatever the webhook's mode; None without it."""
        return self.placement.scheduler_name if self.extender_port is not None else None

    @model_validator(mode="after")
    def _ports_apart(self) -> OperatorConfig:
        if self.probe_port and self.probe_port == self.metrics_port:
            raise ValueError(f"probePort and metricsPort are both {self.probe_port}")
        if self.extender_client_secret is not None and not (
            self.extender_port is not None and self.webhook.enabled
        ):
            raise ValueError(
                f"extenderClientSecret {self.extender_client_secret!r} needs extenderPort and "
                "webhook.enabled: the extender serves the webhook's certificate"
            )
        if self.extender_scheduler_deployment is not None and self.extender_client_secret is None:
            raise ValueError(
                f"extenderSchedulerDeployment {self.extender_scheduler_deployment!r} needs "
                "extenderClientSecret: it is restarted when that Secret's ca.crt changes"
            )
        if self.extender_client_secret == self.webhook.certificate.secret_name:
            raise ValueError(
                f"extenderClientSecret {self.extender_client_secret!r} is the webhook's "
                "certificate Secret (webhook.certificate.secretName): it holds the CA's "
                "key, which the scheduler must not mount; name another Secret"
            )
        if self.placement.mode == "scheduler" and self.extender_port is None:
            raise ValueError(
                "placement.mode: scheduler needs extenderPort: the scheduler binds through it"
            )
        return self


class ConfigError(ValueError):
    """A bad config file; the message names the field and the value."""


def parse_config(text: str, source: str = "config") -> OperatorConfig:
    """Parse and validate a YAML config document (empty means all defaults)."""
    try:
        raw: Any = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top, got {type(raw).__name__}")
    try:
        return OperatorConfig.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {shown(e.get('input'))})"
            for e in error.errors()
        )
        raise ConfigError(f"{source}: {problems}") from None
