"""The Reservation create under review, and the answer that carries its outlook.

The validating webhook on Reservations answers ``allowed`` with warnings
(:mod:`headroom.api.outlook`), which kubectl prints on stderr and a program reads
from the ``Warning`` headers; under strict mode it refuses what the ledger would
reject (403, as ResourceQuota does). A review of anything else (another
kind or operation: the configuration registers only Reservation CREATE) is
allowed without a word.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headroom.api.constants import GROUP
from headroom.objects.gating import REVIEW_API_VERSION, review_request

#: The API server keeps about 4 KiB of warnings per request; one outlook is far less.
MAX_WARNING = 1024


@dataclass(frozen=True, slots=True)
class UnderReview:
    uid: str  # the review's, which its answer must carry
    reservation: dict[str, Any] | None  # None: not a Reservation create
    dry_run: bool


def reservation_under_review(review: Any) -> UnderReview:
    """The Reservation being created (its namespace filled in from the request when the
    object leaves it out), or None for anything else; ReviewError if the body is not an
    AdmissionReview."""
    uid, request = review_request(review)
    dry_run = request.get("dryRun") is True
    return UnderReview(uid, _reservation(request), dry_run)


def _reservation(request: dict[str, Any]) -> dict[str, Any] | None:
    kind = request.get("kind")
    if (
        request.get("operation") != "CREATE"
        or not isinstance(kind, dict)
        or kind.get("group") != GROUP
        or kind.get("kind") != "Reservation"
    ):
        return None
    obj = request.get("object")
    if not isinstance(obj, dict):
        return None
    metadata = obj.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, dict) else {}
    if not metadata.get("namespace") and isinstance(request.get("namespace"), str):
        metadata["namespace"] = request["namespace"]
    return {**obj, "metadata": metadata}


def allowed_with(uid: str, warnings: list[str]) -> dict[str, Any]:
    """The AdmissionReview answer: allowed, with these warnings (each cut to a length the
    API server keeps)."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if warnings:
        response["warnings"] = [text[:MAX_WARNING] for text in warnings]
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}


def refused_with(uid: str, message: str, warnings: list[str]) -> dict[str, Any]:
    """The AdmissionReview answer that refuses a strict create: 403 Forbidden, as a
    ResourceQuota refuses one over its quota, with the ledger's reason and numbers."""
    response: dict[str, Any] = {
        "uid": uid,
        "allowed": False,
        "status": {"code": 403, "reason": "Forbidden", "message": message[:MAX_WARNING]},
    }
    if warnings:
        response["warnings"] = [text[:MAX_WARNING] for text in warnings]
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}
