"""Quota arithmetic (HeadroomQuota): what each namespace holds, against what it may hold.

Pure and exact, like the rest of the ledger: no I/O, no clock (a check that needs
the time takes ``now``). The ledger calls :meth:`Quotas.add` and
:meth:`Quotas.remove` for every entry it gains or loses, so usage is never
recounted from objects; and it asks :meth:`Quotas.refusal` inside the same
synchronous decision as the node's room, so a namespace can never pass its quota
by two decisions racing.

Usage is kept per namespace (every namespace, governed or not), and per quota as
the sum over the namespaces it governs. Which quotas govern a namespace depends
on the namespace's labels and the quotas' selectors; when either changes, the
sums of the quotas concerned are recomputed from the per-namespace figures, so
a relabelled namespace carries exactly what it holds from one quota to another.

A lowered quota reclaims nothing: usage above a limit only stops new admissions
in its namespaces until enough is released (``over``). A quota that cannot be
read (``QuotaRules.invalid``) still governs the namespaces it selects, and
admits nothing new there until it is fixed: failing open would hand a tenant
the whole cluster because of a typo in its own quota.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol

from headroom.api.reasons import Reason
from headroom.api.selectors import LabelSelector
from headroom.ledger.entry import Entry

#: The label the API server puts on every namespace: its name.
NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True, slots=True)
class QuotaRules:
    """A HeadroomQuota as the ledger obeys it. None: no limit on that dimension."""

    name: str
    namespaces: LabelSelector
    ram_mb: int | None = None
    vram_mb: int | None = None
    max_entries: int | None = None
    nodes: LabelSelector | None = None
    max_lifetime: timedelta | None = None
    default_lifetime: timedelta | None = None
    max_wait: timedelta | None = None
    #: Why the spec cannot be obeyed (its namespaces admit nothing new); None: valid.
    invalid: str | None = None

    @property
    def lifetime_given(self) -> timedelta | None:
        """What a reservation without an expiry gets: the default, else the maximum."""
        return self.default_lifetime if self.default_lifetime is not None else self.max_lifetime


@dataclass(slots=True)
class Usage:
    ram_mb: int = 0
    vram_mb: int = 0
    entries: int = 0

    def add(self, other: Usage, sign: int = 1) -> None:
        self.ram_mb += sign * other.ram_mb
        self.vram_mb += sign * other.vram_mb
        self.entries += sign * other.entries

    @property
    def empty(self) -> bool:
        return not (self.ram_mb or self.vram_mb or self.entries)


@dataclass(slots=True)
class _Quota:
    rules: QuotaRules
    used: Usage = field(default_factory=Usage)
    namespaces: set[str] = field(default_factory=set)  # governed, known or holding


def namespace_of(entry_id: str) -> str:
    return entry_id.split("/", 1)[0]


def mib(value: int) -> str:
    """MiB as people read them: whole GiB when they are whole, else MiB."""
    return f"{value // 1024} GiB" if value and value % 1024 == 0 else f"{value} MiB"


class QuotaView(Protocol):
    """The quotas, read-only: the ledger alone changes them (``Ledger.set_quota``, ...)."""

    @property
    def deny_unselected(self) -> bool: ...
    def __len__(self) -> int: ...
    def knows_namespace(self, namespace: str) -> bool: ...
    def labels_of(self, namespace: str) -> Mapping[str, str]: ...
    def seen_namespaces(self) -> list[str]: ...
    def governing(self, namespace: str) -> list[QuotaRules]: ...
    def share(self, namespace: str, other: str) -> bool: ...
    def used(self, name: str) -> Usage: ...
    def used_by(self, namespace: str) -> Usage: ...
    def namespaces_of(self, name: str) -> list[str]: ...
    def rules(self, name: str) -> QuotaRules | None: ...
    def names(self) -> list[str]: ...
    def over(self, name: str) -> bool: ...
    def expiry(self, entry: Entry) -> datetime | None: ...
    def refusal(self, entry: Entry) -> tuple[Reason, str] | None: ...
    def final_refusal(self, entry: Entry) -> tuple[Reason, str] | None: ...
    def max_wait(self, namespace: str) -> timedelta | None: ...


class Quotas:
    def __init__(self, *, deny_unselected: bool = False) -> None:
        """``deny_unselected``: a namespace no quota selects may hold nothing (else: no limit)."""
        self.deny_unselected = deny_unselected
        self._quotas: dict[str, _Quota] = {}
        self._labels: dict[str, Mapping[str, str]] = {}  # namespace -> labels, as last seen
        self._use: dict[str, Usage] = {}  # namespace -> held, whatever governs it
        self._governing: dict[str, tuple[str, ...]] = {}  # namespace -> quota names, sorted
        self._worked_out: set[str] = set()  # namespaces whose quotas were worked out
        self._node_labels: dict[str, Mapping[str, str]] = {}
        #: Counts changes that may turn a quota's final refusals (a quota, a namespace's
        #: labels, a node's labels), so what waits is looked at again only after one.
        self.changes = 0

    # -- what governs what ---------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._quotas)

    def set_quota(self, rules: QuotaRules) -> None:
        """A quota created or changed: its namespaces and their sums are worked out again."""
        self.changes += 1
        self._quotas.pop(rules.name, None)
        self._quotas[rules.name] = _Quota(rules)
        for namespace in self._known_namespaces():
            self._govern(namespace)

    def remove_quota(self, name: str) -> bool:
        """A quota deleted: its namespaces fall to the others, or to the default."""
        quota = self._quotas.pop(name, None)
        if quota is None:
            return False
        for namespace in quota.namespaces:
            self._govern(namespace)
        return True

    def set_namespace(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """A namespace seen with these labels; whether what governs it changed."""
        labels = dict(labels)
        if self._labels.get(namespace) == labels:
            return False
        self.changes += 1
        before = self._names(namespace)  # for one never worked out: what its name gave
        self._labels[namespace] = labels
        self._govern(namespace)
        return self._names(namespace) != before

    def remove_namespace(self, namespace: str) -> None:
        """The Namespace is gone. What it still holds stays counted (under the quotas that
        select it by name) until released; one that holds nothing is forgotten."""
        self._labels.pop(namespace, None)
        if namespace in self._use:
            self._govern(namespace)
            return
        for name in self._governing.pop(namespace, ()):
            self._quotas[name].namespaces.discard(namespace)
        self._worked_out.discard(namespace)

    def knows_namespace(self, namespace: str) -> bool:
        return namespace in self._labels

    def labels_of(self, namespace: str) -> Mapping[str, str]:
        """The namespace's labels as last seen (none if it was never seen)."""
        return self._labels.get(namespace) or {}

    def seen_namespaces(self) -> list[str]:
        """The namespaces whose labels were given (:meth:`set_namespace`)."""
        return list(self._labels)

    def set_node_labels(self, node: str, labels: Mapping[str, str] | None) -> None:
        if self._node_labels.get(node) != (None if labels is None else dict(labels)):
            self.changes += 1
        if labels is None:
            self._node_labels.pop(node, None)
        else:
            self._node_labels[node] = dict(labels)

    def _known_namespaces(self) -> set[str]:
        return set(self._labels) | set(self._use) | self._worked_out

    def _labels_of(self, namespace: str) -> Mapping[str, str]:
        # Before its Namespace is seen, it has at least the label the API server gives all.
        return self._labels.get(namespace) or {NAME_LABEL: namespace}

    def _work_out(self, namespace: str) -> None:
        """A namespace never seen (its Namespace not read yet) is governed by what its
        name alone says, from its first claim on."""
        if namespace not in self._worked_out:
            self._govern(namespace)

    def _matching(self, namespace: str) -> tuple[str, ...]:
        labels = self._labels_of(namespace)
        return tuple(
            sorted(
                name
                for name, quota in self._quotas.items()
                if quota.rules.namespaces.matches(labels)
            )
        )

    def _govern(self, namespace: str) -> bool:
        """Work out which quotas govern ``namespace``; move its usage if that changed."""
        self._worked_out.add(namespace)
        governing = self._matching(namespace)
        before = self._governing.get(namespace, ())
        use = self._use.get(namespace)
        for name in before:
            quota = self._quotas.get(name)
            # A quota replaced by set_quota starts with no namespaces: it never counted
            # this one, so there is nothing to take back from it.
            if quota is not None and name not in governing and namespace in quota.namespaces:
                quota.namespaces.discard(namespace)
                if use is not None:
                    quota.used.add(use, -1)
        for name in governing:
            quota = self._quotas[name]
            if namespace not in quota.namespaces:
                quota.namespaces.add(namespace)
                if use is not None:
                    quota.used.add(use)
        if governing:
            self._governing[namespace] = governing
        else:
            self._governing.pop(namespace, None)
        return governing != before

    def _names(self, namespace: str) -> tuple[str, ...]:
        """The quotas governing ``namespace``. For one never worked out (not seen, never
        claimed, or forgotten when deleted) they are read from its name, changing nothing."""
        if namespace in self._worked_out:
            return self._governing.get(namespace, ())
        return self._matching(namespace)

    def governing(self, namespace: str) -> list[QuotaRules]:
        return [self._quotas[name].rules for name in self._names(namespace)]

    def share(self, namespace: str, other: str) -> bool:
        """Whether two namespaces are one, or share a quota (cost: their quotas, not the
        quotas' namespaces, which may be thousands)."""
        if namespace == other:
            return True
        mine = self._names(namespace)
        return bool(mine) and any(name in mine for name in self._names(other))

    # -- usage ---------------------------------------------------------------------------

    def add(self, entry: Entry, sign: int = 1) -> None:
        """An entry the ledger now holds (sign 1) or no longer holds (sign -1)."""
        namespace = namespace_of(entry.id)
        self._work_out(namespace)
        delta = Usage(entry.ram_mb, entry.vram_mb, 1)
        use = self._use.setdefault(namespace, Usage())
        use.add(delta, sign)
        for name in self._governing.get(namespace, ()):
            self._quotas[name].used.add(delta, sign)
        if use.empty:
            del self._use[namespace]

    def remove(self, entry: Entry) -> None:
        self.add(entry, -1)

    def used(self, name: str) -> Usage:
        quota = self._quotas.get(name)
        return replace(quota.used) if quota is not None else Usage()

    def used_by(self, namespace: str) -> Usage:
        use = self._use.get(namespace)
        return replace(use) if use is not None else Usage()

    def namespaces_of(self, name: str) -> list[str]:
        quota = self._quotas.get(name)
        return sorted(quota.namespaces) if quota is not None else []

    def rules(self, name: str) -> QuotaRules | None:
        quota = self._quotas.get(name)
        return quota.rules if quota is not None else None

    def names(self) -> list[str]:
        return sorted(self._quotas)

    def over(self, name: str) -> bool:
        """Whether the quota's namespaces hold more than it allows (it was lowered)."""
        quota = self._quotas.get(name)
        if quota is None:
            return False
        rules, used = quota.rules, quota.used
        return (
            (rules.ram_mb is not None and used.ram_mb > rules.ram_mb)
            or (rules.vram_mb is not None and used.vram_mb > rules.vram_mb)
            or (rules.max_entries is not None and used.entries > rules.max_entries)
        )

    # -- decisions -----------------------------------------------------------------------

    def expiry(self, entry: Entry) -> datetime | None:
        """The expiry ``entry`` lives under: its own, else the shortest its quotas give."""
        if entry.expires_at is not None:
            return entry.expires_at
        given = [
            rules.lifetime_given
            for rules in self.governing(namespace_of(entry.id))
            if rules.lifetime_given is not None and rules.invalid is None
        ]
        # Whole seconds: what status.expiresAt can say, so a restart restores it exactly.
        return (entry.created_at + min(given)).replace(microsecond=0) if given else None

    def refusal(self, entry: Entry) -> tuple[Reason, str] | None:
        """Why the namespace's quotas refuse ``entry`` now, or None (no change)."""
        namespace = namespace_of(entry.id)
        governing = self.governing(namespace)
        if not governing:
            if self.deny_unselected:
                return Reason.NO_QUOTA, (
                    f"namespace {namespace}: no HeadroomQuota selects it, and namespaces "
                    "without one may hold nothing (quotas.unselectedNamespaces Deny)"
                )
            return None
        # What no wait can change (the node, the lifetime, the wait asked for) first, from
        # every quota: a full quota must not queue a claim another one refuses for good.
        refusal = self.final_refusal(entry)
        if refusal is not None:
            return refusal
        for rules in governing:
            refusal = self._full(rules, entry, namespace)
            if refusal is not None:
                return refusal
        return None

    def node_independent(self, namespace: str) -> bool:
        """Whether :meth:`refusal` and :meth:`expiry` say the same on every node: no
        valid quota of the namespace has a nodeSelector."""
        return all(
            rules.nodes is None or rules.invalid is not None for rules in self.governing(namespace)
        )

    def final_refusal(self, entry: Entry) -> tuple[Reason, str] | None:
        """Why the namespace's quotas refuse ``entry`` for good, or None: its node is
        outside a nodeSelector, or it asks for a lifetime or a wait longer than allowed.
        No release and no wait changes that, so a placement asks it of each node before
        it creates anything, rather than create what is bound to be refused."""
        namespace = namespace_of(entry.id)
        for rules in self.governing(namespace):
            refusal = self._forbidden_by(rules, entry, namespace)
            if refusal is not None:
                return refusal
        return None

    def max_wait(self, namespace: str) -> timedelta | None:
        """The longest ``spec.wait`` the namespace's quotas allow (the smallest valid
        ``maxWait``); None: no quota bounds it."""
        waits = [
            rules.max_wait
            for rules in self.governing(namespace)
            if rules.max_wait is not None and rules.invalid is None
        ]
        return min(waits, default=None)

    def _forbidden_by(
        self, rules: QuotaRules, entry: Entry, namespace: str
    ) -> tuple[Reason, str] | None:
        """A final refusal by a valid quota (an invalid one's fields are not obeyed)."""
        where = f"namespace {namespace} (quota {rules.name})"
        if rules.invalid is not None:
            return None
        if rules.nodes is not None and not rules.nodes.matches(
            self._node_labels.get(entry.node, {})
        ):
            return Reason.NODE_NOT_ALLOWED, (
                f"{where}: node {entry.node} is outside spec.nodeSelector "
                f"({rules.nodes.describe()})"
            )
        if rules.max_lifetime is not None and entry.expires_at is not None:
            lifetime = entry.expires_at - entry.created_at
            if lifetime > rules.max_lifetime:
                return Reason.LIFETIME_TOO_LONG, (
                    f"{where}: spec.expiresAt {entry.expires_at.isoformat()} is "
                    f"{_duration(lifetime)} after creation; spec.maxLifetime is "
                    f"{_duration(rules.max_lifetime)}"
                )
        if rules.max_wait is not None and entry.wait_until is not None:
            wait = entry.wait_until - entry.created_at
            if wait > rules.max_wait:
                return Reason.WAIT_TOO_LONG, (
                    f"{where}: spec.wait {_duration(wait)} is longer than spec.maxWait "
                    f"{_duration(rules.max_wait)}"
                )
        return None

    def _full(self, rules: QuotaRules, entry: Entry, namespace: str) -> tuple[Reason, str] | None:
        """A refusal a wait may see lifted: the quota is invalid, or full."""
        where = f"namespace {namespace} (quota {rules.name})"
        if rules.invalid is not None:
            return Reason.QUOTA_INVALID, f"{where}: the quota cannot be used: {rules.invalid}"
        used = self._quotas[rules.name].used
        for limit, held, asked, what in (
            (rules.ram_mb, used.ram_mb, entry.ram_mb, "RAM"),
            (rules.vram_mb, used.vram_mb, entry.vram_mb, "VRAM"),
        ):
            # asked may be 0: a namespace over a lowered limit admits nothing new at all.
            if limit is not None and held + asked > limit:
                return Reason.QUOTA_EXCEEDED, (
                    f"{where}: holds {mib(held)} of {mib(limit)} {what}; requested {mib(asked)}"
                )
        if rules.max_entries is not None and used.entries + 1 > rules.max_entries:
            return Reason.QUOTA_EXCEEDED, (
                f"{where}: holds {used.entries} of {rules.max_entries} entries (spec.maxEntries)"
            )
        return None


def _duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return text + (f"{seconds}s" if seconds or not text else "")
