"""Synchronous API calls for the command-line tool.

The CLI is a short-lived process that makes a handful of calls, so the official
client (which reads kubeconfig contexts and namespaces exactly as kubectl does)
is the right tool here; the operator's async client is for the long-running loop.
Every call has a timeout, so an unreachable or silent API server ends the command
instead of hanging it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from kubernetes import client, config

from headroom.api.constants import GROUP, HEARTBEAT_ANNOTATION, VERSION

JSON = dict[str, Any]
#: Seconds to connect, and to wait for an answer, per request.
REQUEST_TIMEOUT = (5.0, 30.0)


@dataclass
class Cluster:
    """A connection plus the namespace kubectl would use."""

    api: client.ApiClient
    namespace: str

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
    """Load the kubeconfig (current context unless named), as kubectl does."""
    contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    chosen = next((c for c in contexts if c["name"] == context), current) if context else current
    api = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context
    )
    default = (chosen or {}).get("context", {}).get("namespace") or "default"
    return Cluster(cast(client.ApiClient, api), namespace or default)


def node_headrooms(cluster: Cluster) -> list[JSON]:
    listed = cluster.custom.list_cluster_custom_object(
        GROUP, VERSION, "nodeheadrooms", _request_timeout=REQUEST_TIMEOUT
    )
    return sorted(cast(JSON, listed)["items"], key=lambda o: o["metadata"]["name"])


def reservations(cluster: Cluster, namespace: str | None) -> list[JSON]:
    """Reservations in ``namespace``, or in every namespace when it is None."""
    if namespace is None:
        listed = cluster.custom.list_cluster_custom_object(
            GROUP, VERSION, "reservations", _request_timeout=REQUEST_TIMEOUT
        )
    else:
        listed = cluster.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "reservations", _request_timeout=REQUEST_TIMEOUT
        )
    return cast(list[JSON], cast(JSON, listed)["items"])


def reservation(cluster: Cluster, name: str) -> JSON:
    obj = cluster.custom.get_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, "reservations", name, _request_timeout=REQUEST_TIMEOUT
    )
    return cast(JSON, obj)


def create_reservation(cluster: Cluster, body: JSON) -> JSON:
    obj = cluster.custom.create_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, "reservations", body, _request_timeout=REQUEST_TIMEOUT
    )
    return cast(JSON, obj)


def delete_reservation(cluster: Cluster, name: str, uid: str, resource_version: str) -> None:
    """Delete this very object as last seen: 409 Conflict if it changed since (a decision
    was written) or was replaced by another of the same name, 404 if it is gone."""
    options = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=uid, resource_version=resource_version)
    )
    cluster.custom.delete_namespaced_custom_object(
        GROUP,
        VERSION,
        cluster.namespace,
        "reservations",
        name,
        body=options,
        _request_timeout=REQUEST_TIMEOUT,
    )


def heartbeat(cluster: Cluster, name: str, at: datetime) -> JSON:
    patch = {
        "metadata": {"annotations": {HEARTBEAT_ANNOTATION: at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
    }
    obj = cluster.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        cluster.namespace,
        "reservations",
        name,
        patch,
        _request_timeout=REQUEST_TIMEOUT,
    )
    return cast(JSON, obj)


def events_about(cluster: Cluster, uid: str) -> list[JSON]:
    """Events about the object with this uid, oldest first.

    By uid, not name: a name is reused after delete and re-create, and the Events
    of the earlier objects outlive them (an hour by default).
    """
    listed = cluster.core.list_namespaced_event(
        cluster.namespace,
        field_selector=f"involvedObject.uid={uid}",
        _request_timeout=REQUEST_TIMEOUT,
    )
    events = [
        {
            "type": e.type,
            "reason": e.reason,
            "message": e.message,
            "time": (e.last_timestamp or e.event_time or e.metadata.creation_timestamp),
        }
        for e in listed.items
    ]
    return sorted(events, key=lambda e: str(e["time"]))
