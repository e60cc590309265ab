"""GPUs held outside Headroom, read from the API's objects: ResourceClaims and pods.

Pure and total (never raises): what a DRA ResourceClaim's allocation holds, and how
many device-plugin GPUs a pod holds, in the terms of ``headroom.ledger.external``.

A ResourceClaim (``resource.k8s.io/v1``, ``k8s.io/api/resource/v1/types.go``) is
allocated when ``status.allocation.devices.results[]`` is set, each result naming
``{request, driver, pool, device}``; with the consumable-capacity API (KEP-5075,
feature gate ``DRAConsumableCapacity``, beta and on by default since 1.36) a result
on a device that allows several allocations also carries ``shareID`` and
``consumedCapacity`` (capacity name -> quantity, the same names as the slice's
``capacity``: ``memory``, or qualified ``gpu.nvidia.com/memory``). So a result
holds its device by its consumed memory where that is given, else whole. A result
with ``adminAccess: true`` holds nothing: admin access is monitoring access to a
device that others may be using, and it never keeps the device from them.
``status.reservedFor[]`` names the pods (``resource: pods``) that use the claim.

A pod's device-plugin GPUs are an extended resource (``nvidia.com/gpu``): the API
requires a limit for it, and a request, where given, equal to it; kube-scheduler
books the larger of the containers' sum (sidecars included) and the largest init
container, as for memory (``headroom.objects.podmemory``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from headroom.api.constants import MAX_GPUS
from headroom.api.parse import InvalidValueError, memory_mib
from headroom.ledger.external import Amount, ClaimKey, DraClaim, PodKey

#: The API allows 32 results per claim; more is not a claim the API server accepted.
MAX_RESULTS = 256
MAX_RESERVED_FOR = 256


def claim_key(claim: Mapping[str, Any]) -> ClaimKey:
    meta = claim.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def claim_holdings(claim: object, drivers: Collection[str]) -> DraClaim | None:
    """What an allocated ResourceClaim holds on devices of ``drivers``; None: nothing."""
    if not isinstance(claim, dict):
        return None
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, dict) else None
    devices = allocation.get("devices") if isinstance(allocation, dict) else None
    results = devices.get("results") if isinstance(devices, dict) else None
    if not isinstance(results, list) or not results or len(results) > MAX_RESULTS:
        return None
    amounts: dict[str, Amount] = {}
    for result in results:
        read = _result(result, drivers)
        if read is None:
            continue
        ref, amount = read
        if ref in amounts:  # several shares of one device: their sum; whole wins
            before = amounts[ref]
            amounts[ref] = None if before is None or amount is None else before + amount
        else:
            amounts[ref] = amount
    if not amounts:
        return None
    namespace = claim_key(claim)[0]
    return DraClaim(amounts, _pods(status, namespace) if isinstance(status, dict) else frozenset())


def _result(result: object, drivers: Collection[str]) -> tuple[str, Amount] | None:
    if not isinstance(result, dict) or result.get("adminAccess") is True:
        return None
    driver, pool, device = (result.get(k) for k in ("driver", "pool", "device"))
    if driver not in drivers or not isinstance(pool, str) or not isinstance(device, str):
        return None
    if not pool or not device:
        return None
    ref = f"{driver}/{pool}/{device}"
    consumed = result.get("consumedCapacity")
    if not isinstance(consumed, dict):
        return ref, None
    value = consumed.get("memory", consumed.get(f"{driver}/memory"))
    if value is None:
        return ref, None
    try:
        return ref, memory_mib(value, round_up=True)  # a holding is never smaller than given
    except InvalidValueError:
        return ref, None  # unreadable: the whole device, rather than none of it


def _pods(status: Mapping[str, Any], namespace: str) -> frozenset[PodKey]:
    users = status.get("reservedFor")
    if not isinstance(users, list):
        return frozenset()
    return frozenset(
        (namespace, user["name"])
        for user in users[:MAX_RESERVED_FOR]
        if isinstance(user, dict)
        and user.get("resource") == "pods"
        and user.get("apiGroup") in (None, "")
        and isinstance(user.get("name"), str)
    )


def device_plugin_gpus(pod: object, resources: Collection[str]) -> int:
    """How many device-plugin GPUs (any of ``resources``) the pod holds, as kube-scheduler
    books them; 0 when none (or unreadable: the API server validated them)."""
    if not resources or not isinstance(pod, dict):
        return 0
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return 0
    containers = [c for c in _list(spec.get("containers")) if isinstance(c, dict)]
    inits = [c for c in _list(spec.get("initContainers")) if isinstance(c, dict)]
    sidecars = [c for c in inits if c.get("restartPolicy") == "Always"]
    others = [c for c in inits if c.get("restartPolicy") != "Always"]
    summed = sum(_gpus(c, resources) for c in containers + sidecars)
    largest_init = max((_gpus(c, resources) for c in others), default=0)
    return min(max(summed, largest_init), MAX_GPUS)


def _gpus(container: Mapping[str, Any], resources: Collection[str]) -> int:
    requirements = container.get("resources")
    if not isinstance(requirements, dict):
        return 0
    total = 0
    for kind in ("limits", "requests"):  # a limit is required; a request equals it
        values = requirements.get(kind)
        if not isinstance(values, dict):
            continue
        found = [_count(values[name]) for name in resources if name in values]
        if found:
            total = sum(found)
            break
    return total


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _count(value: object) -> int:
    text = str(value) if isinstance(value, int | str) and not isinstance(value, bool) else ""
    # isdigit() alone takes "²", which int() refuses: ASCII digits only.
    readable = text.isascii() and text.isdigit() and len(text) <= 6
    return min(int(text), MAX_GPUS) if readable else 0
