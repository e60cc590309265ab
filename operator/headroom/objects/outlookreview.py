"""The Reservation create under review, and the answer that carries its outlook.

The validating webhook on Reservations never refuses: it answers ``allowed`` with
warnings (:mod:`headroom.api.outlook`), which kubectl prints on stderr and a
program reads from the ``Warning`` headers. A review of anything else (another
kind or operation: the configuration registers only Reservation CREATE) is
allowed without a word.
"""

from __future__ import annotations

from typing import Any

from headroom.api.constants import GROUP
from headroom.objects.gating import REVIEW_API_VERSION, review_request

#: The API server keeps about 4 KiB of warnings per request; one outlook is far less.
MAX_WARNING = 1024


def reservation_under_review(review: Any) -> tuple[str, dict[str, Any] | None]:
    """The review's uid and the Reservation being created (its namespace filled in from
    the request when the object leaves it out); None for anything else. ReviewError if
    the body is not an AdmissionReview."""
    uid, request = review_request(review)
    kind = request.get("kind")
    if (
        request.get("operation") != "CREATE"
        or not isinstance(kind, dict)
        or kind.get("group") != GROUP
        or kind.get("kind") != "Reservation"
    ):
        return uid, None
    obj = request.get("object")
    if not isinstance(obj, dict):
        return uid, None
    metadata = obj.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, dict) else {}
    if not metadata.get("namespace") and isinstance(request.get("namespace"), str):
        metadata["namespace"] = request["namespace"]
    return uid, {**obj, "metadata": metadata}


def allowed_with(uid: str, warnings: list[str]) -> dict[str, Any]:
    """The AdmissionReview answer: allowed, with these warnings (each cut to a length the
    API server keeps)."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if warnings:
        response["warnings"] = [text[:MAX_WARNING] for text in warnings]
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}
