"""Claim node memory from a program: ``with claim("gpu-1", ram_mb=4096) as held: ...``.

A Reservation is easy to create and easy to leave behind. This library does the
rest of the protocol every program would otherwise write by hand: check the claim
against the schema before sending it, wait for the decision (through ``Queued``),
turn a refusal into an exception with the reason and the numbers, heartbeat at a
safe fraction of the node's stale window, and delete the reservation however the
block ends (normally, by an exception, on SIGTERM). ``claim_async`` is the same for
asyncio. ``AUTO`` places the claim on the best node (see ``placement``) and tries
the next one when that node filled up in the meantime. ``gpus=N`` spreads
``vram_mb`` over N GPU devices; an admitted claim's ``devices`` and
``cuda_visible_devices`` say which (``headroom.client.devices``). ``what_if`` (and
``what_if_async``) asks, with a server-side dry run, what the operator would decide for
a claim now, creating nothing (``headroom.client.whatif``).

It talks to the API server with the official ``kubernetes`` client, as
``kubectl headroom`` does, from a kubeconfig or from inside a pod; never with the
operator's own code.
"""

from headroom.api.outlook import Outlook, Verdict
from headroom.client.aio import AsyncClaim, AsyncClaimContext, claim_async, what_if_async
from headroom.client.claim import Claim, ClaimContext, claim
from headroom.client.connection import Connection, connect, from_kubeconfig, in_cluster, this_pod
from headroom.client.devices import Device
from headroom.client.errors import (
    ClaimError,
    ClaimLostError,
    ClaimRefusedError,
    ClaimTimeoutError,
    InvalidClaimError,
    NoNodeFitsError,
    PlacementError,
)
from headroom.client.held import DEFAULT_HEARTBEAT_INTERVAL
from headroom.client.placement import AUTO, AutoNode, NodeRoom, nodes_with_room
from headroom.client.whatif import WhatIf, what_if

__all__ = [
    "AUTO",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "AsyncClaim",
    "AsyncClaimContext",
    "AutoNode",
    "Claim",
    "ClaimContext",
    "ClaimError",
    "ClaimLostError",
    "ClaimRefusedError",
    "ClaimTimeoutError",
    "Connection",
    "Device",
    "InvalidClaimError",
    "NoNodeFitsError",
    "NodeRoom",
    "Outlook",
    "PlacementError",
    "Verdict",
    "WhatIf",
    "claim",
    "claim_async",
    "connect",
    "from_kubeconfig",
    "in_cluster",
    "nodes_with_room",
    "this_pod",
    "what_if",
    "what_if_async",
]
