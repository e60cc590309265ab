"""What can go wrong with a claim, as exceptions a program can branch on.

A program that claims memory needs to tell apart "the cluster said no" (with the
reason and the numbers, so that it can pick another node or a smaller size), "no
answer in time", "lost after it was admitted" and "my own arguments were wrong";
each is one class here, all under :class:`ClaimError`. Errors of the transport
itself (``kubernetes.client.ApiException``, ``urllib3`` and ``OSError`` for an
unreachable server, ``kubernetes.config.ConfigException`` for no usable
configuration) are not wrapped: they mean the same here as everywhere else.
"""

from __future__ import annotations

import json
import re


class ClaimError(Exception):
    """Base class of every error the claim library raises itself."""


class InvalidClaimError(ClaimError, ValueError):
    """An argument the Reservation schema would refuse; nothing was sent.

    ``field`` names what was wrong (``spec.ramMB``, ``metadata.name``, ``ttl``…), and
    the message is the API server's wording for it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ClaimRefusedError(ClaimError):
    """The operator decided against the claim: ``Rejected``, or ``Reclaimed`` before
    it was ever seen ``Admitted``. The reservation was deleted; ``reason`` is the
    machine reason (``InsufficientRAM``, ``WaitTimeout``…), ``message`` the
    operator's sentence with the numbers."""

    def __init__(
        self, *, namespace: str, name: str, node: str, phase: str, reason: str, message: str
    ) -> None:
        super().__init__(
            f"reservation {namespace}/{name} on node {node}: {phase} ({reason}): {message}"
        )
        self.namespace = namespace
        self.name = name
        self.node = node
        self.phase = phase
        self.reason = reason
        self.message = message


class ClaimTimeoutError(ClaimError, TimeoutError):
    """No decision within the timeout. The reservation was deleted (if the API server
    could not be reached for that, it is reclaimed once admitted, as nobody heartbeats
    it)."""


class ClaimLostError(ClaimError):
    """An admitted claim that no longer holds memory: reclaimed by the operator
    (``HeartbeatStale``, ``Expired``, ``OwnerPodDeleted``), deleted, or replaced by
    another object of the same name."""

    def __init__(self, reference: str, reason: str, message: str) -> None:
        super().__init__(f"reservation {reference} lost: {reason}: {message}")
        self.reference = reference
        self.reason = reason
        self.message = message


class NoNodeFitsError(ClaimError):
    """Automatic placement found no node with room for the claim now."""


class PlacementError(ClaimError):
    """Automatic placement could not read what it needs (NodeHeadrooms, or Nodes for
    a label selector); the message says which right is missing."""


def api_message(error: BaseException) -> str:
    """The API server's own sentence for a refused request (its Status ``message``),
    or the HTTP reason; it names the user, verb and resource of a 403."""
    body, reason = getattr(error, "body", None), getattr(error, "reason", None)
    try:
        message = json.loads(body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return " ".join(str(message or reason or "").split())


#: The Reservations' webhook refuses a strict create (``headroom.dev/outlook: strict``)
#: with the reason and the message its status would have carried.
_REFUSED_AT_CREATE = re.compile(
    r'admission webhook "outlook\.headroom\.dev" denied the request: '
    r"(?P<reason>[A-Za-z]+): (?P<message>.*)"
)


def refused_at_create(error: BaseException) -> tuple[str, str] | None:
    """(reason, message) when ``error`` is the operator refusing a strict create, else None."""
    if getattr(error, "status", None) != 403:
        return None
    match = _REFUSED_AT_CREATE.search(api_message(error))
    return (match["reason"], match["message"]) if match else None
