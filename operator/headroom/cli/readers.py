"""Synchronous API calls for the command-line tool.

The CLI is a short-lived process that makes a handful of calls, so the official
client (which reads kubeconfig contexts and namespaces exactly as kubectl does)
is the right tool here; the operator's async client is for the long-running loop.
Every call has a timeout, so an unreachable or silent API server ends the command
instead of hanging it.
"""

from __future__ import annotations

from typing import Any, cast

from headroom.api.constants import GROUP, VERSION
from headroom.client import calls
from headroom.client.calls import REQUEST_TIMEOUT
from headroom.client.connection import Connection
from headroom.client.connection import connect as client_connect

JSON = dict[str, Any]
#: A connection plus the namespace kubectl would use (the claim library's).
Cluster = Connection
QUOTAS = "headroomquotas"


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
    """As kubectl: the kubeconfig (current context unless named), else in a pod its
    service account (the claim library's rule, so that ``hold`` and the rest agree)."""
    return client_connect(kubeconfig, context, namespace)


def node_headrooms(cluster: Cluster) -> list[JSON]:
    return calls.node_headrooms(cluster)


def quotas(cluster: Cluster) -> list[JSON]:
    """Every HeadroomQuota (cluster-scoped), by name."""
    listed = cluster.custom.list_cluster_custom_object(
        GROUP, VERSION, QUOTAS, _request_timeout=REQUEST_TIMEOUT
    )
    return sorted(cast(JSON, listed)["items"], key=lambda o: str(o["metadata"]["name"]))


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


def pod(cluster: Cluster, name: str) -> Any:
    """A pod in the cluster's namespace (a V1Pod)."""
    return cluster.core.read_namespaced_pod(
        name, cluster.namespace, _request_timeout=REQUEST_TIMEOUT
    )


def reservation(cluster: Cluster, name: str) -> JSON:
    return calls.get(cluster, name)


def create_reservation(cluster: Cluster, body: JSON) -> JSON:
    return calls.create(cluster, body)


def delete_reservation(cluster: Cluster, name: str, uid: str, resource_version: str) -> None:
    """Delete this very object as last seen: 409 Conflict if it changed since (a decision
    was written) or was replaced by another of the same name, 404 if it is gone."""
    calls.delete(cluster, name, uid, resource_version)


def heartbeat(cluster: Cluster, name: str) -> JSON:
    """A new heartbeat value on the named reservation: now, to the microsecond."""
    return calls.heartbeat(cluster, name)


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
