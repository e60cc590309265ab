"""REST paths of the objects the operator reads and writes."""

from __future__ import annotations

from urllib.parse import quote

from headroom.api.constants import GROUP, VERSION


def resource_path(
    group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None
) -> str:
    """``/apis/group/version[/namespaces/ns]/plural[/name]`` (``/api/v1`` for the core group)."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace is not None:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{plural}"
    if name is not None:
        base += f"/{quote(name, safe='')}"
    return base


#: Collections, cluster-wide.
RESERVATIONS = resource_path(GROUP, VERSION, "reservations")
NODE_HEADROOMS = resource_path(GROUP, VERSION, "nodeheadrooms")
NODES = resource_path("", "v1", "nodes")
PODS = resource_path("", "v1", "pods")
#: DRA ResourceSlices (cluster-scoped): a node's GPU devices, when a DRA driver publishes them.
RESOURCE_SLICES = resource_path("resource.k8s.io", "v1", "resourceslices")
#: DRA ResourceClaims, in every namespace: GPUs allocated to pods outside Headroom.
RESOURCE_CLAIMS = resource_path("resource.k8s.io", "v1", "resourceclaims")
HEADROOM_QUOTAS = resource_path(GROUP, VERSION, "headroomquotas")
NAMESPACES = resource_path("", "v1", "namespaces")


def reservation_path(namespace: str, name: str, subresource: str = "") -> str:
    path = resource_path(GROUP, VERSION, "reservations", namespace, name)
    return f"{path}/{subresource}" if subresource else path


def node_headroom_path(node: str, subresource: str = "") -> str:
    path = resource_path(GROUP, VERSION, "nodeheadrooms", None, node)
    return f"{path}/{subresource}" if subresource else path


def node_path(name: str) -> str:
    return resource_path("", "v1", "nodes", None, name)


def pod_path(namespace: str, name: str) -> str:
    return resource_path("", "v1", "pods", namespace, name)


def events_path(namespace: str) -> str:
    return resource_path("", "v1", "events", namespace)


def headroom_quota_path(name: str, subresource: str = "") -> str:
    path = resource_path(GROUP, VERSION, "headroomquotas", None, name)
    return f"{path}/{subresource}" if subresource else path


def namespace_path(name: str) -> str:
    return resource_path("", "v1", "namespaces", None, name)
