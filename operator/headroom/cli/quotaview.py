"""HeadroomQuotas as the command line reads them: which govern a namespace, and whether
one, not a node, is what refuses a claim.

``fit`` and ``summary`` read the quotas with the caller's rights. A tenant may not read
Namespaces (their labels are what a quota's ``namespaceSelector`` selects), so a quota
governs a namespace when its status (written by the operator) lists the namespace;
before the operator wrote one, its selector is matched against the one label every
namespace has, its name. The room left is the spec's limit minus what the status says
is held (at most ``summaryInterval`` old), and a refusal is worded as the operator
words it: ``namespace ml (quota team-ml): holds 56 GiB of 64 GiB RAM; requested 16 GiB``.

Quotas are an addition: where they cannot be read (no ``headroom-quota-reader``
binding, or an operator without the CRD), the command says so once on stderr and
goes on without them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from headroom.api.quotas import HeadroomQuotaSpec
from headroom.cli import readers
from headroom.cli.exits import describe_api_error, is_forbidden, one_line
from headroom.client.placement import NodeRoom
from headroom.ledger.quotas import NAME_LABEL, mib

JSON = dict[str, Any]
#: What grants reading HeadroomQuotas; quoted wherever they are forbidden.
QUOTA_GRANT = (
    "HeadroomQuotas are cluster-scoped: the ClusterRole headroom-quota-reader grants "
    "reading them (chart value quotaReaders)"
)
_SPEC_FIELDS = {field.alias or name for name, field in HeadroomQuotaSpec.model_fields.items()}


@dataclass(frozen=True)
class Quota:
    """One HeadroomQuota: its spec (None when it cannot be read) and its status's figures."""

    name: str
    spec: HeadroomQuotaSpec | None
    #: Why the quota cannot be used (the operator's status.message, or the spec's error).
    problem: str | None = None
    ram_mb: int = 0
    vram_mb: int = 0
    entries: int = 0
    queued: int = 0
    over: bool = False
    #: status.namespaces[].namespace; None before the operator wrote them.
    namespaces: tuple[str, ...] | None = None
    namespace_count: int = 0

    def as_json(self) -> JSON:
        spec = self.spec
        return {
            "name": self.name,
            "ramMB": self.ram_mb,
            "ramLimitMB": None if spec is None else spec.ram_mb,
            "vramMB": self.vram_mb,
            "vramLimitMB": None if spec is None else spec.vram_mb,
            "entries": self.entries,
            "maxEntries": None if spec is None else spec.max_entries,
            "queued": self.queued,
            "over": self.over,
            "valid": self.problem is None,
            "problem": self.problem,
            "namespaces": None if self.namespaces is None else list(self.namespaces),
        }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse(obj: JSON) -> Quota:
    """A HeadroomQuota as listed; fields added by a newer operator are ignored."""
    name = str(obj["metadata"]["name"])
    raw = obj.get("spec")
    problem: str | None = None
    try:
        known = {k: v for k, v in raw.items() if k in _SPEC_FIELDS} if isinstance(raw, dict) else {}
        spec: HeadroomQuotaSpec | None = HeadroomQuotaSpec.model_validate(known)
    except ValidationError as error:
        spec = None
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        problem = one_line(f"spec{'.' + where if where else ''}: {first['msg']}")
    written = obj.get("status")
    status: JSON = written if isinstance(written, dict) else {}
    if status.get("valid") is False:
        problem = one_line(str(status.get("message") or "the operator cannot read its spec"))
    listed = status.get("namespaces")
    namespaces = None
    if isinstance(listed, list):
        namespaces = tuple(
            str(item["namespace"])
            for item in listed
            if isinstance(item, dict) and isinstance(item.get("namespace"), str)
        )
    return Quota(
        name,
        spec,
        problem,
        ram_mb=_count(status.get("ramMB")),
        vram_mb=_count(status.get("vramMB")),
        entries=_count(status.get("entries")),
        queued=_count(status.get("queued")),
        over=status.get("over") is True,
        namespaces=namespaces,
        namespace_count=_count(status.get("namespaceCount")),
    )


def read(
    cluster: readers.Cluster, going_on: str, warn: Callable[[str], None] | None = None
) -> list[Quota] | None:
    """Every readable quota, or None (said once through ``warn``, stderr by default,
    ending with ``going_on``) when the caller may not list them or they are not served."""
    say = warn or (lambda text: print(f"Warning: {text}", file=sys.stderr))
    try:
        return [parse(obj) for obj in readers.quotas(cluster)]
    except ApiException as error:
        if is_forbidden(error):
            problem = describe_api_error(error)
            say(f"HeadroomQuotas not readable ({problem}); {going_on}. {QUOTA_GRANT}")
        elif error.status == 404:
            say(f"HeadroomQuotas are not served here (their CRD is not installed); {going_on}")
        else:
            say(f"HeadroomQuotas not readable ({describe_api_error(error)}); {going_on}")
        return None


def governs(quota: Quota, namespace: str) -> bool:
    """Whether ``quota`` governs ``namespace``: its status lists it, or (no list yet, or a
    list cut short) its selector matches the namespace's name label."""
    if quota.namespaces:
        if namespace in quota.namespaces:
            return True
        if quota.namespace_count <= len(quota.namespaces):
            return False
    if quota.spec is None:
        return False
    return quota.spec.namespace_selector.matches({NAME_LABEL: namespace})


def governing(quotas: Iterable[Quota], namespace: str) -> list[Quota]:
    """The quotas that govern ``namespace``, by name (the order they are reported in)."""
    return sorted((q for q in quotas if governs(q, namespace)), key=lambda q: q.name)


def refusal(quota: Quota, namespace: str, ram_mb: int, vram_mb: int) -> str | None:
    """Why ``quota`` refuses a claim of this size in ``namespace`` on any node, in the
    operator's words; None when its room is enough."""
    where = f"namespace {namespace} (quota {quota.name})"
    if quota.spec is None or quota.problem is not None:
        return f"{where}: the quota cannot be used: {quota.problem}"
    spec = quota.spec
    for limit, held, asked, what in (
        (spec.ram_mb, quota.ram_mb, ram_mb, "RAM"),
        (spec.vram_mb, quota.vram_mb, vram_mb, "VRAM"),
    ):
        if limit is not None and asked and held + asked > limit:
            return f"{where}: holds {mib(held)} of {mib(limit)} {what}; requested {mib(asked)}"
    if spec.max_entries is not None and quota.entries + 1 > spec.max_entries:
        return f"{where}: holds {quota.entries} of {spec.max_entries} entries (spec.maxEntries)"
    return None


def node_refusal(quota: Quota, namespace: str, node: str, labels: Mapping[str, str]) -> str | None:
    """Why ``quota`` keeps ``namespace`` off ``node`` (its labels: the NodeHeadroom's)."""
    selector = None if quota.spec is None else quota.spec.node_selector
    if selector is None or selector.matches(labels):
        return None
    return (
        f"namespace {namespace} (quota {quota.name}): node {node} is outside "
        f"spec.nodeSelector ({selector.describe()})"
    )


def within(
    room: NodeRoom, quotas: Iterable[Quota], namespace: str, labels: Mapping[str, str]
) -> NodeRoom:
    """``room``, made not to fit when a quota keeps the namespace off its node."""
    for quota in quotas:
        why = node_refusal(quota, namespace, room.node, labels)
        if why is not None:
            return replace(room, fits=False, why_not=why, could_fit_later=False)
    return room


def _used_of(used: int, limit: int | None) -> str:
    return f"{used}/{'-' if limit is None else limit}"


def rows(quotas: Iterable[Quota]) -> list[list[Any]]:
    """One row per quota: RAM and VRAM MiB held/limit, entries held/limit, queued, over."""
    out = []
    for quota in quotas:
        spec = quota.spec
        out.append(
            [
                quota.name if quota.problem is None else f"{quota.name} (invalid)",
                _used_of(quota.ram_mb, None if spec is None else spec.ram_mb),
                _used_of(quota.vram_mb, None if spec is None else spec.vram_mb),
                _used_of(quota.entries, None if spec is None else spec.max_entries),
                quota.queued,
                str(quota.over).lower(),
            ]
        )
    return out


HEADERS = ["QUOTA", "RAM (MiB)", "VRAM (MiB)", "ENTRIES", "QUEUED", "OVER"]
