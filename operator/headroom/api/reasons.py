"""Machine-readable reasons for every ledger decision, and every other Event reason.

A reason is the CamelCase word that lands in ``status.reason`` and in Event
reasons, so that placement code can switch on it while people read the message.
The set is closed: adding a member is an API change.

``Reason`` is the ledger's (a decision's ``status.reason``); ``EventReason`` the
words of the other Events the operator posts (and of the pod condition
``headroom.dev/Admitted``). An Event's reason is one of either, never a bare string
(the recorder's ``reason`` is typed so). Every member of both is documented in
docs/reference/events.md, and a unit test keeps that page and these two in step.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Why a reservation was admitted, refused or reclaimed."""

    # Admission.
    FITS = "Fits"
    NODE_UNKNOWN = "NodeUnknown"
    INSUFFICIENT_RAM = "InsufficientRAM"
    INSUFFICIENT_VRAM = "InsufficientVRAM"
    TOO_MANY_ENTRIES = "TooManyEntries"
    DUPLICATE_ID = "DuplicateID"
    ALREADY_EXPIRED = "AlreadyExpired"
    INVALID_SPEC = "InvalidSpec"
    OWNER_POD_NOT_FOUND = "OwnerPodNotFound"
    OWNER_POD_NOT_LABELLED = "OwnerPodNotLabelled"
    # Quotas (HeadroomQuota): over a quota of the namespace; no quota selects it and the
    # default is Deny; its quota cannot be read; the node is outside the quota's
    # nodeSelector; a lifetime or wait longer than the quota allows.
    QUOTA_EXCEEDED = "QuotaExceeded"
    NO_QUOTA = "NoQuota"
    QUOTA_INVALID = "QuotaInvalid"
    NODE_NOT_ALLOWED = "NodeNotAllowed"
    LIFETIME_TOO_LONG = "LifetimeTooLong"
    WAIT_TOO_LONG = "WaitTooLong"
    # Queueing: waited as long as spec.wait allowed; or (strict FIFO) others wait ahead.
    WAIT_TIMEOUT = "WaitTimeout"
    WAITERS_AHEAD = "WaitersAhead"
    # Reclaim.
    HEARTBEAT_STALE = "HeartbeatStale"
    EXPIRED = "Expired"
    OWNER_POD_DELETED = "OwnerPodDeleted"
    # A reservation that lives as long as its pod (spec.liveness Pod): the pod ended.
    OWNER_POD_FINISHED = "OwnerPodFinished"
    # Admitted for a gated pod, but the pod could not be pinned and ungated.
    UNGATE_REFUSED = "UngateRefused"
    # Rebuild: an admitted entry that no longer fits its node's limits.
    OVER_COMMITTED = "OverCommitted"


class EventReason(StrEnum):
    """Why an Event is posted, when it is not a decision's ``Reason``."""

    # A gated (or scheduler-placed) pod, and the pod condition headroom.dev/Admitted.
    ADMITTED = "Admitted"
    WAITING = "Waiting"
    NO_NODE = "NoNode"
    NOT_CLAIMED = "NotClaimed"
    BAD_CLAIM = "BadClaim"
    CLAIM_CHANGED = "ClaimChanged"
    NODE_UNSUITABLE = "NodeUnsuitable"
    RESERVATION_NAME_TAKEN = "ReservationNameTaken"
    BIND_TIMEOUT = "BindTimeout"
    # An owner pod's or a reservation's heartbeat annotation that is not a time.
    BAD_HEARTBEAT = "BadHeartbeat"
    # A Reservation whose status carries no valid decision stamp.
    UNTRUSTED_STATUS = "UntrustedStatus"
    # A Node: its Headroom annotations, its GPU inventory, its NodeHeadroom summary.
    BAD_HEADROOM_SETTINGS = "BadHeadroomSettings"
    BAD_GPU_INVENTORY = "BadGpuInventory"
    SUMMARY_NOT_WRITTEN = "SummaryNotWritten"
    # A HeadroomQuota that cannot be used.
    INVALID_QUOTA = "InvalidQuota"


class Phase(StrEnum):
    """Lifecycle of a Reservation, as written to ``status.phase``."""

    PENDING = "Pending"
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    REJECTED = "Rejected"
    RECLAIMED = "Reclaimed"
