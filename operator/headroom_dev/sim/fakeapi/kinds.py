"""The resource kinds the fake serves, how they differ, and REST paths to them.

Each difference below was observed on kube-apiserver v1.36 by the contract
tests and the exploration behind them, not assumed:

- custom resources (Reservation, NodeHeadroom) need ``apiVersion``/``kind`` in
  a create body (400 without), drop ``status`` on create, refuse a PUT without
  ``metadata.resourceVersion`` (422), answer DELETE with a ``Status``, keep
  ``kind`` on list items, and count ``metadata.generation``;
- Leases also refuse a PUT without resourceVersion; Pods, Nodes, Secrets,
  Namespaces allow it (unconditional update); a PUT to a missing Lease creates
  it (whatever resourceVersion it carries), elsewhere it is 404;
- a Node keeps the status it is created with (a kubelet registers that way); a
  Pod's status is reset to Pending; both ignore status on the main resource;
- Pods count generation too; deleting one (unscheduled, so no grace period) is
  two revisions, a MODIFIED that sets ``deletionTimestamp`` and bumps the
  generation, then the DELETED, and the answer is the object itself;
- core list items carry no ``kind``/``apiVersion``;
- ``pods/binding`` only accepts a create (405 otherwise); what it and other pod
  writes may do is in :mod:`headroom_dev.sim.fakeapi.podrules`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

from headroom.kube.transport import ApiError


@dataclass(frozen=True, slots=True)
class Kind:
    """One resource type as the API server treats it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = False
    binding_subresource: bool = False  # pods/binding: create only (kube-scheduler's bind)
    custom: bool = False
    generation: bool = False
    status_on_create: Literal["drop", "keep", "pending", "active"] = "keep"
    unconditional_update: bool = True
    graceful_deletion: bool = False
    create_on_update: bool = False
    stored: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """As messages name it: ``reservations.headroom.dev``, ``nodes``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """As validation messages name it: ``Reservation.headroom.dev``, ``Lease``."""
        return f"{self.kind}.{self.group}" if self.custom else self.kind


NODES = Kind("", "v1", "nodes", "Node", namespaced=False, status_subresource=True)
PODS = Kind(
    "",
    "v1",
    "pods",
    "Pod",
    namespaced=True,
    status_subresource=True,
    generation=True,
    status_on_create="pending",
    graceful_deletion=True,
    binding_subresource=True,
)
NAMESPACES = Kind("", "v1", "namespaces", "Namespace", namespaced=False, status_on_create="active")
SECRETS = Kind("", "v1", "secrets", "Secret", namespaced=True)
EVENTS = Kind("", "v1", "events", "Event", namespaced=True, stored=False)
LEASES = Kind(
    "coordination.k8s.io",
    "v1",
    "leases",
    "Lease",
    namespaced=True,
    unconditional_update=False,
    create_on_update=True,
)
RESERVATIONS = Kind(
    "headroom.dev",
    "v1alpha1",
    "reservations",
    "Reservation",
    namespaced=True,
    status_subresource=True,
    custom=True,
    generation=True,
    status_on_create="drop",
    unconditional_update=False,
)
NODEHEADROOMS = Kind(
    "headroom.dev",
    "v1alpha1",
    "nodeheadrooms",
    "NodeHeadroom",
    namespaced=False,
    status_subresource=True,
    custom=True,
    generation=True,
    status_on_create="drop",
    unconditional_update=False,
)
HEADROOMQUOTAS = Kind(
    "headroom.dev",
    "v1alpha1",
    "headroomquotas",
    "HeadroomQuota",
    namespaced=False,
    status_subresource=True,
    custom=True,
    generation=True,
    status_on_create="drop",
    unconditional_update=False,
)

KINDS: tuple[Kind, ...] = (
    NODES,
    PODS,
    NAMESPACES,
    SECRETS,
    EVENTS,
    LEASES,
    RESERVATIONS,
    NODEHEADROOMS,
    HEADROOMQUOTAS,
)
_BY_PLURAL = {(k.group, k.version, k.plural): k for k in KINDS}


@dataclass(frozen=True, slots=True)
class Target:
    """What a REST path names: a kind, a namespace (None: all or cluster-scoped), a name."""

    kind: Kind
    namespace: str | None
    name: str | None
    subresource: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace or "", self.name or "")


def not_found_path(path: str) -> ApiError:
    return ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")


_PARSED: dict[str, Target] = {}


def parse_path(path: str) -> Target:
    """``/api/v1/namespaces/ns/pods/x`` → Target(PODS, "ns", "x"); 404 for anything else."""
    cached = _PARSED.get(path)
    if cached is not None:
        return cached
    target = _parse(path)
    if len(_PARSED) < 4096:
        _PARSED[path] = target
    return target


def _parse(path: str) -> Target:
    segments = path.strip("/").split("/")
    if len(segments) >= 2 and segments[0] == "api":
        group, version, rest = "", segments[1], segments[2:]
    elif len(segments) >= 3 and segments[0] == "apis":
        group, version, rest = segments[1], segments[2], segments[3:]
    else:
        raise not_found_path(path)
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        inner = _BY_PLURAL.get((group, version, rest[2]))
        if inner is not None and inner.namespaced:
            namespace, rest = unquote(rest[1]), rest[2:]
    if not rest or len(rest) > 3:
        raise not_found_path(path)
    kind = _BY_PLURAL.get((group, version, rest[0]))
    if kind is None:
        raise not_found_path(path)
    name = unquote(rest[1]) if len(rest) >= 2 else None
    subresource = rest[2] if len(rest) == 3 else None
    allowed = (subresource == "status" and kind.status_subresource) or (
        subresource == "binding" and kind.binding_subresource
    )
    if subresource is not None and not allowed:
        raise not_found_path(path)
    if name is not None and kind.namespaced and namespace is None:
        raise not_found_path(path)
    if name == "" or (namespace is not None and not kind.namespaced):
        raise not_found_path(path)
    return Target(kind, namespace, name, subresource)
