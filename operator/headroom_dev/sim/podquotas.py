"""The quotas over gated pods, as the simulation's end-state checks read them.

Written again rather than taken from the operator (``headroom.ledger.quotas``), so
that a mistake there does not hide behind the same mistake here: which quotas govern
a namespace, whether two namespaces share one, whether a waiting reservation's quotas
have room for it now. Only what the simulation writes is read (``ramMB``,
``maxEntries``, ``maxWait`` in ``<n>s``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headroom.api.selectors import LabelSelector

JSON = dict[str, Any]
UNLIMITED = 1 << 62


def governing(
    namespace: str, quotas: Sequence[JSON], namespaces: dict[str, dict[str, str]]
) -> list[JSON]:
    labels = namespaces.get(namespace, {})
    return [
        q["spec"]
        for q in quotas
        if LabelSelector.model_validate(q["spec"]["namespaceSelector"]).matches(labels)
    ]


def share(
    namespace: str,
    other: str,
    quotas: Sequence[JSON],
    namespaces: dict[str, dict[str, str]],
) -> bool:
    """Whether two namespaces are one, or a quota governs both."""
    mine = governing(namespace, quotas, namespaces)
    return namespace == other or any(q in mine for q in governing(other, quotas, namespaces))


def quotas_allow(
    queued: JSON,
    reservations: list[JSON],
    quotas: Sequence[JSON],
    namespaces: dict[str, dict[str, str]],
) -> bool:
    """Whether every quota of the queued reservation's namespace has room for it now
    (RAM and entries over the namespaces each governs); one that waits for its quota
    is not stuck while the quota is full."""
    for spec in governing(queued["metadata"]["namespace"], quotas, namespaces):
        members = {n for n in namespaces if spec in governing(n, quotas, namespaces)}
        held = [
            int(r["spec"].get("ramMB", 0))
            for r in reservations
            if _phase(r) == "Admitted" and r["metadata"]["namespace"] in members
        ]
        ram = int(queued["spec"].get("ramMB", 0))
        if sum(held) + ram > spec.get("ramMB", UNLIMITED):
            return False
        if len(held) + 1 > spec.get("maxEntries", UNLIMITED):
            return False
    return True


def seconds(duration: str) -> float:
    """A duration as the simulation writes them (``<n>s``)."""
    return float(duration.removesuffix("s"))  # "inf": no bound


def _phase(obj: JSON) -> str | None:
    phase = (obj.get("status") or {}).get("phase")
    return str(phase) if phase is not None else None
