"""HeadroomQuota objects to the ledger's rules, and the ledger's usage to their status.

Reading is total: any object gives either rules, or the reason it cannot be used.
A quota whose spec fails the model (written before a bound tightened, or by a
client that skipped the schema) still governs the namespaces its selector picks,
with ``invalid`` set, so that those namespaces admit nothing new until it is
fixed; only a quota whose namespaceSelector itself cannot be read governs
nothing, since no one can say whose it is. Either way the problem is named,
field and value, for a Warning Event.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from headroom.api.parse import shown
from headroom.api.quotas import HeadroomQuotaSpec, HeadroomQuotaStatus, NamespaceUsage
from headroom.api.selectors import LabelSelector
from headroom.ledger import Ledger
from headroom.ledger.quotas import QuotaRules
from headroom.objects.status import timestamp

JSON = dict[str, Any]
#: Namespaces listed one by one in a quota's status; the figures above cover them all.
MAX_LISTED_NAMESPACES = 1000


def _problem(error: ValidationError, prefix: str) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    return f"{prefix}{'.' + where if where else ''}: {message} (got {shown(first.get('input'))})"


def quota_rules(obj: JSON) -> tuple[QuotaRules | None, str | None]:
    """The rules of a HeadroomQuota and what is wrong with it (None when nothing is).

    ``(None, problem)``: its namespaceSelector cannot be read, so it governs nothing.
    """
    name = str((obj.get("metadata") or {}).get("name") or "")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return None, f"spec: expected an object (got {shown(spec)})"
    try:
        parsed = HeadroomQuotaSpec.model_validate(spec)
    except ValidationError as error:
        problem = _problem(error, "spec")
        try:
            selector = LabelSelector.model_validate(spec.get("namespaceSelector"))
        except ValidationError as selector_error:
            return None, _problem(selector_error, "spec.namespaceSelector")
        return QuotaRules(name=name, namespaces=selector, invalid=problem), problem
    return (
        QuotaRules(
            name=name,
            namespaces=parsed.namespace_selector,
            ram_mb=parsed.ram_mb,
            vram_mb=parsed.vram_mb,
            max_entries=parsed.max_entries,
            nodes=parsed.node_selector,
            max_lifetime=parsed.max_lifetime,
            default_lifetime=parsed.default_lifetime,
            max_wait=parsed.max_wait,
        ),
        None,
    )


def _left(limit: int | None, used: int) -> int | None:
    return None if limit is None else max(limit - used, 0)


def quota_status(
    ledger: Ledger,
    name: str,
    waiting: Mapping[str, tuple[int, int]],
    *,
    generation: int | None,
    now: datetime,
) -> JSON:
    """The status of quota ``name`` as the ledger has it (``waiting``: namespace -> (queued
    reservations, their RAM)), validated by the model that generated the CRD."""
    quotas = ledger.quotas
    rules, used = quotas.rules(name), quotas.used(name)
    namespaces = quotas.namespaces_of(name)
    listed = []
    for namespace in namespaces[:MAX_LISTED_NAMESPACES]:
        held = quotas.used_by(namespace)
        queued, queued_mb = waiting.get(namespace, (0, 0))
        listed.append(
            NamespaceUsage(
                namespace=namespace,
                ram_mb=held.ram_mb,
                vram_mb=held.vram_mb,
                entries=held.entries,
                queued=queued,
                queued_ram_mb=queued_mb,
            )
        )
    status = HeadroomQuotaStatus(
        ram_mb=used.ram_mb,
        vram_mb=used.vram_mb,
        entries=used.entries,
        queued=sum(waiting.get(namespace, (0, 0))[0] for namespace in namespaces),
        remaining_ram_mb=_left(rules.ram_mb, used.ram_mb) if rules else None,
        remaining_vram_mb=_left(rules.vram_mb, used.vram_mb) if rules else None,
        remaining_entries=_left(rules.max_entries, used.entries) if rules else None,
        over=quotas.over(name),
        valid=rules is not None and rules.invalid is None,
        message=(rules.invalid if rules else None),
        namespace_count=len(namespaces),
        namespaces=listed,
        observed_generation=generation,
        updated_at=None,
    )
    body = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    body["updatedAt"] = timestamp(now)
    return body


def unusable_status(problem: str, generation: int | None, now: datetime) -> JSON:
    """The status of a quota that governs nothing: its selector cannot be read."""
    return {
        "ramMB": 0,
        "vramMB": 0,
        "entries": 0,
        "queued": 0,
        "valid": False,
        "message": problem[:4096],
        "namespaceCount": 0,
        "namespaces": [],
        **({"observedGeneration": generation} if generation is not None else {}),
        "updatedAt": timestamp(now),
    }
