"""The HTTP statuses an operator's log reports, not digits that happen to be in it.

A test once looked for a 403 with ``\\b403\\b`` and found the milliseconds of a
timestamp (``21:35:23,403``); before that, the digits of a port. A status is read
only where a status is written: before its reason (``403 Forbidden``, the HTTP
phrase or the Kubernetes Status reason, as the operator's ``ApiError`` says it), in
parentheses (``(403)``, the official client's ``ApiException``), after
``status``/``code``/``HTTP``, or at the end of a line after a colon (``...: 403``).
"""

from __future__ import annotations

import re
from http import HTTPStatus

# Kubernetes StatusReasons (metav1.StatusReason) beside the HTTP phrases.
_KUBE_REASONS = frozenset(
    {
        *("AlreadyExists", "Invalid", "Expired", "Timeout", "ServerTimeout", "BadRequest"),
        *("MethodNotAllowed", "NotAcceptable", "RequestEntityTooLarge", "InternalError"),
        *("UnsupportedMediaType", "ServiceUnavailable", "TooManyRequests", "Unauthorized"),
        *("Forbidden", "NotFound", "Conflict", "Gone"),
    }
)
_REASONS = sorted({status.phrase for status in HTTPStatus} | _KUBE_REASONS, key=len, reverse=True)
_STATUS = re.compile(
    r"(?<![\w.,:/+-])(?P<phrase>[1-5]\d\d) (?:" + "|".join(map(re.escape, _REASONS)) + r")\b"
    r"|\((?P<paren>[1-5]\d\d)\)"
    r"|\b(?i:status|code|HTTP)[ =:]+(?P<named>[1-5]\d\d)\b"
    r"|: (?P<tail>[1-5]\d\d)$",
    re.MULTILINE,
)


def http_statuses(text: str) -> set[int]:
    """Every HTTP status ``text`` reports, as numbers."""
    return {int(next(g for g in match.groups() if g)) for match in _STATUS.finditer(text)}
