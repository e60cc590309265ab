"""Check every argument before anything is sent to the cluster.

A bad ``--timeout`` found after the create used to leave an admitted reservation
behind, so every value is checked first, against the same types the CRD schema
is generated from (``headroom.api.models``, through the claim library's
``headroom.client.spec``, which the library's own callers go through too), and
refused with the API server's own wording, naming the flag:
``--ram: Invalid value: -5: should be greater than or equal to 0``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from headroom.cli.exits import UsageError
from headroom.client import spec
from headroom.client.errors import InvalidClaimError
from headroom.client.spec import ClaimRequest

#: Flags for the values a claim is made of.
FLAGS = {
    "node": "--node",
    "ramMB": "--ram",
    "vramMB": "--vram",
    "gpus": "--gpus",
    "ttl": "--ttl",
    "expiresAt": "--ttl",
    "wait": "--wait",
    "description": "--description",
    "owner": "--owner-pod",
    "name": "--name",
}
DEFAULT_TIMEOUT = "60s"
#: ``--node auto``: the best node now, by the rule ``kubectl headroom fit`` shows.
AUTO_NODE = "auto"


def name(value: str, flag: str = "name") -> str:
    """An object name: a DNS subdomain."""
    try:
        checked: str = spec.check(spec.SUBDOMAIN, flag, value)
    except InvalidClaimError as error:
        raise UsageError(str(error)) from None
    return checked


def namespace(value: str | None) -> str | None:
    """``-n``: a DNS label, or None for the kubeconfig's."""
    if value is None:
        return None
    try:
        checked: str = spec.check(spec.NAMESPACE, "--namespace", value)
    except InvalidClaimError as error:
        raise UsageError(str(error)) from None
    return checked


def mib(value: str, flag: str) -> int:
    """A size in MiB, within the schema's bounds."""
    try:
        checked: int = spec.check(spec.MIB, flag, value)
    except InvalidClaimError as error:
        raise UsageError(str(error)) from None
    return checked


def duration(value: str, flag: str) -> timedelta:
    """A Go-style duration above zero (``parse_duration`` refuses anything under 1 ms)."""
    try:
        return spec.duration(value, flag)
    except InvalidClaimError as error:
        raise UsageError(str(error)) from None


def claim_request(args: Any, now: datetime | None = None) -> ClaimRequest:
    """The claim the flags describe (``--node auto``: node None), every flag checked."""
    node = None if args.node == AUTO_NODE else args.node
    try:
        return spec.request(
            node=node,
            ram_mb=args.ram,
            vram_mb=args.vram,
            gpus=getattr(args, "gpus", None),
            ttl=args.ttl,
            wait=getattr(args, "wait_for", None),
            description=args.description,
            owner_pod=args.owner_pod,
            name=args.name,
            labels={**FLAGS, "wait": getattr(args, "wait_flag", FLAGS["wait"])},
            now=now,
        )
    except InvalidClaimError as error:
        raise UsageError(str(error)) from None


def reservation(args: Any, now: datetime | None = None) -> dict[str, Any]:
    """The Reservation ``reserve`` would create on ``--node``, every flag checked."""
    request = claim_request(args, now)
    return request.body(request.node or AUTO_NODE, now)
