"""The simulation's quota invariant: no namespace over its quota by a new decision.

When a reservation in a governed namespace becomes Admitted by a new decision,
what the namespaces of each of its quotas hold (Admitted RAM, Admitted entries)
is within that quota's limit. The limit is the largest the quota had in the last
``CHANGE_GRACE`` seconds, or none if it was absent meanwhile: a decision taken
before the operator could know the quota was lowered (or created) is not an
overrun of its making; the ledger's own arithmetic is proven by property tests.
Namespaces' labels do not change in the simulation, so which quota governs
which namespace is read from the objects as they are.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headroom.api.selectors import LabelSelector

JSON = dict[str, Any]
CHANGE_GRACE = 90.0  # seconds: as a node's shrink (a lost event is caught by a relist)
UNLIMITED = 1 << 62


@dataclass
class QuotaBook:
    fail: Callable[[str], None]
    count: Callable[[str], None]
    now: Callable[[], float]
    _namespaces: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> labels
    _selectors: dict[str, LabelSelector] = field(default_factory=dict)  # quota -> its selector
    #: quota -> (when, RAM limit, entries limit); (when, UNLIMITED, UNLIMITED) when deleted.
    _history: dict[str, list[tuple[float, int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    _held: dict[str, tuple[str, int]] = field(default_factory=dict)  # uid -> (namespace, MiB)

    def on_namespace(self, event_type: str, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        if event_type == "DELETED":
            self._namespaces.pop(meta.get("name", ""), None)
        else:
            self._namespaces[meta.get("name", "")] = dict(meta.get("labels") or {})

    def on_quota(self, event_type: str, obj: JSON) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if event_type == "DELETED":
            self._history[name].append((self.now(), UNLIMITED, UNLIMITED))
            return
        spec = obj.get("spec") or {}
        self._selectors[name] = LabelSelector.model_validate(spec["namespaceSelector"])
        limits = (spec.get("ramMB", UNLIMITED), spec.get("maxEntries", UNLIMITED))
        history = self._history[name]
        if not history or history[-1][1:] != limits:
            history.append((self.now(), *limits))

    def _limits(self, quota: str) -> tuple[int, int]:
        history = self._history.get(quota) or []
        recent = [h for h in history if h[0] >= self.now() - CHANGE_GRACE]
        if history:
            recent.append(history[-1])  # in force now, whenever it was set
        return max(h[1] for h in recent), max(h[2] for h in recent)

    def _governing(self, namespace: str) -> list[str]:
        labels = self._namespaces.get(namespace, {})
        return [
            quota
            for quota, selector in sorted(self._selectors.items())
            if self._history[quota] and selector.matches(labels)
        ]

    def admitted(
        self,
        uid: str,
        key: tuple[str, str],
        ram: int,
        forced: bool,
        provisional: list[tuple[str, int]] | None = None,
    ) -> None:
        """A new Admitted decision (``forced``: a running pod recorded as it is).
        ``provisional``: the deciding leader's provisional holds, (namespace, MiB) each
        (:mod:`headroom_dev.sim.reviewchecks`), counted with what is Admitted."""
        namespace = key[0]
        self._held[uid] = (namespace, ram)
        if forced:
            return
        if self.within(key, namespace, provisional or [], f"admitted {ram} MiB pushed"):
            self.count("admitted-under-quota")

    def within(
        self, key: tuple[str, str], namespace: str, provisional: list[tuple[str, int]], what: str
    ) -> bool:
        """Check every quota governing ``namespace``: what is Admitted there, with the
        ``provisional`` holds, within its limits. False if none governs it."""
        governing = self._governing(namespace)
        for quota in governing:
            ram_limit, entries_limit = self._limits(quota)
            members = {
                n for n in self._namespaces if self._selectors[quota].matches(self._namespaces[n])
            }
            held = [mb for ns, mb in [*self._held.values(), *provisional] if ns in members]
            if sum(held) > ram_limit:
                self.fail(f"{key}: {what} quota {quota} to {sum(held)} MiB > {ram_limit}")
            if len(held) > entries_limit:
                self.fail(f"{key}: quota {quota} holds {len(held)} entries > {entries_limit}")
        return bool(governing)

    def released(self, uid: str) -> None:
        self._held.pop(uid, None)
