"""Create Reservations and wait for their decisions: helpers for tests, demo and bench."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client

GROUP, VERSION, PLURAL = "headroom.dev", "v1alpha1", "reservations"
HEARTBEAT = f"{GROUP}/heartbeat"
DECIDED = ("Admitted", "Rejected", "Reclaimed")


def reservation(name: str, node: str, ram_mb: int, vram_mb: int = 0, **spec: Any) -> dict[str, Any]:
    body_spec: dict[str, Any] = {"node": node, "ramMB": ram_mb, **spec}
    if vram_mb:
        body_spec["vramMB"] = vram_mb
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Reservation",
        "metadata": {"name": name},
        "spec": body_spec,
    }


def create(
    custom: client.CustomObjectsApi,
    namespace: str,
    name: str,
    node: str,
    ram_mb: int,
    vram_mb: int = 0,
    **spec: Any,
) -> dict[str, Any]:
    body = reservation(name, node, ram_mb, vram_mb, **spec)
    return cast(
        dict[str, Any],
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body),
    )


def get(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    return cast(
        dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    )


def list_all(custom: client.CustomObjectsApi, namespace: str | None = None) -> list[dict[str, Any]]:
    if namespace is None:
        result = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    else:
        result = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    return cast(list[dict[str, Any]], cast(dict[str, Any], result)["items"])


def heartbeat(
    custom: client.CustomObjectsApi, namespace: str, name: str, value: str | None = None
) -> None:
    """Write the heartbeat annotation as an owner would (default: now, to the microsecond)."""
    beat = value or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    patch = {"metadata": {"annotations": {HEARTBEAT: beat}}}
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)


def heartbeat_pod(
    core: client.CoreV1Api, namespace: str, name: str, value: str | None = None
) -> None:
    """Write the heartbeat annotation on an owner pod."""
    beat = value or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {HEARTBEAT: beat}}})


def write_status(
    custom: client.CustomObjectsApi, namespace: str, name: str, status: dict[str, Any]
) -> None:
    """Write a status as someone with status rights but not the operator's key would."""
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status}
    )


def delete(custom: client.CustomObjectsApi, namespace: str, name: str) -> None:
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def wait_for(
    custom: client.CustomObjectsApi,
    namespace: str,
    name: str,
    phases: tuple[str, ...] = DECIDED,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """Poll until the reservation exists and its phase is one of ``phases``; return it.
    (Not there yet is waited out: the operator creates the reservations of gated pods.)"""
    deadline = time.monotonic() + timeout
    obj: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            obj = get(custom, namespace, name)
        except client.ApiException as error:
            if error.status != 404:
                raise
            time.sleep(0.05)
            continue
        if (obj.get("status") or {}).get("phase") in phases:
            return obj
        time.sleep(0.05)
    raise TimeoutError(f"{namespace}/{name} not in {phases} after {timeout}s: {obj.get('status')}")


def wait_all(
    custom: client.CustomObjectsApi,
    namespace: str,
    count: int,
    timeout: float = 60.0,
    phases: tuple[str, ...] = DECIDED,
) -> list[dict[str, Any]]:
    """Poll until ``count`` reservations in the namespace are in ``phases``."""
    deadline = time.monotonic() + timeout
    items: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        items = list_all(custom, namespace)
        done = [i for i in items if (i.get("status") or {}).get("phase") in phases]
        if len(done) >= count:
            return items
        time.sleep(0.2)
    phases_seen = [(i.get("status") or {}).get("phase") for i in items]
    raise TimeoutError(f"{namespace}: {len(items)} reservations, phases {phases_seen}")
