"""The API calls a claim makes, each one synchronous and bounded by a timeout.

One place for them, used by the library (directly, or from asyncio through a
worker thread) and by the command line, so that a claim's create, heartbeat and
release are the same requests whoever makes them. Every call has a timeout: an
unreachable or silent API server ends a call instead of hanging a program.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client

from headroom.api.constants import GROUP, HEARTBEAT_ANNOTATION, VERSION
from headroom.client.connection import Connection
from headroom.client.errors import ClaimRefusedError, refused_at_create

JSON = dict[str, Any]
#: Seconds to connect, and to wait for an answer, per request.
REQUEST_TIMEOUT = (5.0, 30.0)
RESERVATIONS = "reservations"
NODEHEADROOMS = "nodeheadrooms"


def phase(obj: JSON) -> str | None:
    """The reservation's ``status.phase``, or None before the operator wrote one."""
    value = (obj.get("status") or {}).get("phase")
    return str(value) if value else None


def create(conn: Connection, body: JSON) -> JSON:
    """Create the Reservation. Refused at create under strict mode: ClaimRefusedError with
    the reason and message its status would have carried (nothing was created)."""
    try:
        obj = conn.custom.create_namespaced_custom_object(
            GROUP, VERSION, conn.namespace, RESERVATIONS, body, _request_timeout=REQUEST_TIMEOUT
        )
    except client.ApiException as error:
        refusal = refused_at_create(error)
        if refusal is None:
            raise
        metadata = body.get("metadata") or {}
        raise ClaimRefusedError(
            namespace=conn.namespace,
            name=str(metadata.get("name") or metadata.get("generateName") or ""),
            node=str((body.get("spec") or {}).get("node")),
            phase="Rejected",
            reason=refusal[0],
            message=refusal[1],
        ) from error
    return cast(JSON, obj)


def dry_run_create(conn: Connection, body: JSON) -> tuple[JSON, list[str]]:
    """Create ``body`` with ``dryRun=All``: the object as it would be stored (nothing is),
    and the response's ``Warning`` header values, one per header line as sent.

    Asked with the status and the raw headers (``with_http_info``, data, status and
    headers as a tuple: ``_return_http_data_only=False``): the client's ``ApiResponse``
    keeps one value per header name, and admission warnings may come as several
    ``Warning`` lines; the raw header dict keeps them all.
    """
    try:
        answer: Any = conn.custom.create_namespaced_custom_object_with_http_info(
            GROUP,
            VERSION,
            conn.namespace,
            RESERVATIONS,
            body,
            dry_run="All",
            _return_http_data_only=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
    except client.ApiException as error:
        if refused_at_create(error) is None:
            raise
        # Strict mode refuses a dry run as it would the create: the answer is still the
        # outlook, carried by the refusal's warnings.
        return {}, header_values(error.headers or {}, "Warning")
    data, _, headers = answer
    return cast(JSON, data), header_values(headers, "Warning")


def header_values(headers: Any, name: str) -> list[str]:
    """Every value of the header ``name`` (any case), repeated lines kept apart."""
    if headers is None:
        return []
    getlist = getattr(headers, "getlist", None)
    if getlist is not None:
        return [str(value) for value in getlist(name)]
    return [str(v) for k, v in dict(headers).items() if str(k).lower() == name.lower()]


def get(conn: Connection, name: str) -> JSON:
    obj = conn.custom.get_namespaced_custom_object(
        GROUP, VERSION, conn.namespace, RESERVATIONS, name, _request_timeout=REQUEST_TIMEOUT
    )
    return cast(JSON, obj)


def heartbeat(conn: Connection, name: str, uid: str | None = None) -> JSON:
    """Write a new heartbeat value (now, to the microsecond, so each one is new).

    With ``uid``, only on that very object: a merge patch that names another uid
    than the stored one is refused (422, ``metadata.uid`` is immutable), so a
    heartbeat never keeps alive another reservation that took the same name.
    """
    beat = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    metadata: JSON = {"annotations": {HEARTBEAT_ANNOTATION: beat}}
    if uid is not None:
        metadata["uid"] = uid
    obj = conn.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        conn.namespace,
        RESERVATIONS,
        name,
        {"metadata": metadata},
        _request_timeout=REQUEST_TIMEOUT,
    )
    return cast(JSON, obj)


def delete(conn: Connection, name: str, uid: str, resource_version: str | None = None) -> None:
    """Delete this very object: 409 Conflict if it was replaced by another of the same
    name (or, with ``resource_version``, changed since last seen), 404 if it is gone."""
    options = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=uid, resource_version=resource_version)
    )
    conn.custom.delete_namespaced_custom_object(
        GROUP,
        VERSION,
        conn.namespace,
        RESERVATIONS,
        name,
        body=options,
        _request_timeout=REQUEST_TIMEOUT,
    )


def node_headrooms(conn: Connection, selector: str | None = None) -> list[JSON]:
    """NodeHeadrooms (they carry their Node's labels: ``selector`` selects by those)."""
    listed = conn.custom.list_cluster_custom_object(
        GROUP,
        VERSION,
        NODEHEADROOMS,
        label_selector=selector or "",
        _request_timeout=REQUEST_TIMEOUT,
    )
    return sorted(cast(JSON, listed)["items"], key=lambda o: o["metadata"]["name"])


def node_headroom(conn: Connection, node: str) -> JSON:
    obj = conn.custom.get_cluster_custom_object(
        GROUP, VERSION, NODEHEADROOMS, node, _request_timeout=REQUEST_TIMEOUT
    )
    return cast(JSON, obj)
