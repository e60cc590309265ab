"""Decision stamps: the operator trusts on rebuild only the statuses it wrote.

RBAC already keeps tenants away from ``reservations/status``; the stamp covers
everyone else who could write a status (a broad admin role, a misconfigured
controller). Each decision's status carries ``decisionStamp`` = HMAC-SHA256 over
the object's uid, the decision's id and its phase (and, for an admission on GPU
devices, its assignment: ``status.devices`` is what a program is told to use),
keyed by a secret that only the operator reads (a Secret in its own namespace,
created on first start).
Forging a stamp requires reading that Secret, i.e. already being an admin of the
operator's namespace; copying a stamp from another object fails because the uid
differs. A status without a valid stamp is ignored and the reservation decided
again, with an ``UntrustedStatus`` Warning Event.

Losing the key must never take memory back from a reservation in use. When the
Secret is gone (deleted, renamed with the release, a namespace restored without
Secrets, or ``decisionKey`` just turned on), the operator creates a new key and
marks the Secret ``headroom.dev/statuses-adopted: "false"``. While that mark is
there, a status it cannot verify is *adopted*: kept as it is, counted in the
ledger, and re-stamped with the new key; once every one is re-stamped the mark
becomes ``"true"`` and unverifiable statuses are distrusted again. A crash in the
middle leaves the mark at ``"false"``, so the next start finishes the job. This
stays safe against forged statuses: adopting happens only after the old key's
Secret was removed, and removing it takes the same right as reading it (admin of
the operator's namespace) — whoever could use the window could forge a stamp anyway.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from headroom.api.constants import GROUP
from headroom.objects.status import canonical_devices, recorded_devices, recorded_expiry

JSON = dict[str, Any]
KEY_FIELD = "decision-key"
ADOPTED_ANNOTATION = f"{GROUP}/statuses-adopted"


class StampVerdict(Enum):
    TRUSTED = "trusted"  # stamped with our key, or no key in use
    ADOPT = "adopt"  # unverifiable, and the key is new: keep it and stamp it again
    UNTRUSTED = "untrusted"  # unverifiable with a key already established: decide again


@dataclass(frozen=True)
class DecisionKey:
    key: bytes
    adopting: bool  # the key is new: statuses stamped before it cannot be checked


class Stamper:
    """Signs and checks decision stamps; with no key, stamps nothing and trusts RBAC."""

    def __init__(self, key: bytes | None, *, adopting: bool = False) -> None:
        self._key = key
        self.adopting = adopting and key is not None

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def sign(
        self,
        uid: str,
        decision_id: str,
        phase: str,
        devices: Mapping[str, int] | None = None,
        expires_at: str | None = None,
    ) -> str | None:
        """The stamp; without devices and a given expiry (``status.expiresAt``, as written)
        it is the one stamps had before either existed."""
        if self._key is None:
            return None
        message = f"{uid}|{decision_id}|{phase}"
        if devices:
            message += f"|{canonical_devices(devices)}"
        if expires_at:
            message += f"|expires={expires_at}"
        return hmac.new(self._key, message.encode(), hashlib.sha256).hexdigest()[:40]

    def trusted(self, obj: JSON) -> bool:
        """Whether the object's status was written by an operator holding the key."""
        if self._key is None:
            return True
        status = obj.get("status") or {}
        expected = self.sign(
            (obj.get("metadata") or {}).get("uid", ""),
            str(status.get("decisionID", "")),
            str(status.get("phase", "")),
            recorded_devices(status),
            recorded_expiry(status),
        )
        return hmac.compare_digest(expected or "", str(status.get("decisionStamp", "")))

    def verdict(self, obj: JSON) -> StampVerdict:
        if self.trusted(obj):
            return StampVerdict.TRUSTED
        return StampVerdict.ADOPT if self.adopting else StampVerdict.UNTRUSTED
