"""The fake API server's state: objects, one resourceVersion counter, change history.

Every operation is synchronous and applies at once, as one etcd transaction
does: the asynchrony (latency, faults, pauses) lives in the client in front of
it (:mod:`headroom_dev.sim.fakeapi.client`). Stored objects are never mutated:
each write stores a new dict, so history, list snapshots and watch queues hold
plain references, and only what crosses the API boundary is copied.

Semantics follow kube-apiserver v1.36 as the contract tests observe it; see
:mod:`headroom_dev.sim.fakeapi.kinds` for how kinds differ and
:mod:`headroom_dev.sim.fakeapi.schema` for custom resource validation.
"""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from headroom.kube.transport import ApiError
from headroom_dev.sim.fakeapi.events import EventLog
from headroom_dev.sim.fakeapi.jsonvalue import PatchError, apply_json_patch, clone, merge_patch
from headroom_dev.sim.fakeapi.kinds import KINDS, NAMESPACES, Kind, Target
from headroom_dev.sim.fakeapi.podrules import BOUND, binding_errors, bound
from headroom_dev.sim.fakeapi.schema import invalid
from headroom_dev.sim.fakeapi.selectors import parse_selector
from headroom_dev.sim.fakeapi.strategy import (
    bad_request,
    check_name,
    check_new,
    create_body,
    deleted_status,
    initial_status,
    method_not_allowed,
    name_mismatch,
    not_found,
    updated,
)

JSON = dict[str, Any]
Listener = Callable[[str, JSON], None]

PATCH_REJECTED = "the server rejected our request due to an error in our request"
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the API server draws generateName from
INITIAL_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")


@dataclass(frozen=True, slots=True)
class Change:
    """One committed mutation, as the watch cache keeps it."""

    revision: int
    type: str  # ADDED, MODIFIED, DELETED
    obj: JSON  # the object after (DELETED: its last state, at the deletion's revision)
    prev: JSON | None  # the object before (None for ADDED)


class Subscriber(Protocol):
    """A watch registered with the store (see :mod:`headroom_dev.sim.fakeapi.watch`)."""

    def offer(self, change: Change) -> None: ...


@dataclass(slots=True)
class _Snapshot:
    """The rest of a paged LIST, as of the revision its first page was served at."""

    kind: Kind
    revision: int
    items: list[JSON]
    selected: bool


def _labels(obj: JSON) -> Any:
    return obj["metadata"].get("labels")


class Store:
    """Objects by kind and key, the global revision, and per-kind change history."""

    def __init__(
        self,
        now: Callable[[], datetime],
        *,
        seed: int = 0,
        history_limit: int = 1000,
        continue_tokens_kept: int = 64,
        events_kept: int = 8,
    ) -> None:
        self._now = now
        self.revision = 1
        self._objects: dict[Kind, dict[tuple[str, str], JSON]] = {k: {} for k in KINDS}
        self._sorted: dict[Kind, list[tuple[str, str]] | None] = {k: None for k in KINDS}
        self._history: dict[Kind, deque[Change]] = {k: deque(maxlen=history_limit) for k in KINDS}
        self.compacted: dict[Kind, int] = {k: 0 for k in KINDS}
        self.watchers: dict[Kind, dict[int, Subscriber]] = {k: {} for k in KINDS}
        self.listeners: list[Listener] = []
        self.listener_errors: list[BaseException] = []
        self._rng = random.Random(seed)
        self._uid_prefix = f"{seed & 0xFFFFFFFF:08x}"
        self._uids = itertools.count(1)
        self._snapshots: OrderedDict[int, _Snapshot] = OrderedDict()
        self._snapshot_ids = itertools.count(1)
        self._snapshots_kept = continue_tokens_kept
        self.events = EventLog(events_kept)
        for name in INITIAL_NAMESPACES:
            self.create(Target(NAMESPACES, None, None), {"metadata": {"name": name}})
        # A watch from before the server started is too old, as with a fresh watch cache.
        self.compact()

    # -- reads ---------------------------------------------------------------------------

    def get(self, target: Target) -> JSON:
        """The stored object (do not mutate it); 404 if absent."""
        if target.subresource == "binding":
            raise method_not_allowed()
        obj = self._objects[target.kind].get(target.key)
        if obj is None:
            raise not_found(target.kind, target.name or "")
        return obj

    def peek(self, kind: Kind, namespace: str | None, name: str) -> JSON | None:
        return self._objects[kind].get((namespace or "", name))

    def all(self, kind: Kind, namespace: str | None = None) -> list[JSON]:
        """Stored objects of a kind in key order (do not mutate them)."""
        objects = self._objects[kind]
        return [
            objects[key] for key in self._keys(kind) if namespace is None or key[0] == namespace
        ]

    def _keys(self, kind: Kind) -> list[tuple[str, str]]:
        keys = self._sorted[kind]
        if keys is None:
            keys = self._sorted[kind] = sorted(self._objects[kind])
        return keys

    def list_page(
        self,
        target: Target,
        *,
        limit: int = 500,
        continue_token: str | None = None,
        label_selector: str | None = None,
    ) -> JSON:
        """One page of a LIST, consistent with the first page's revision (a fresh copy)."""
        kind = target.kind
        if continue_token:
            snapshot = self._resume(kind, continue_token)
            revision, items, selected = snapshot.revision, snapshot.items, snapshot.selected
        else:
            matches = parse_selector(label_selector)
            revision, selected = self.revision, matches is not None
            items = [
                obj
                for obj in self.all(kind, target.namespace)
                if matches is None or matches(_labels(obj))
            ]
        page, rest = (items[:limit], items[limit:]) if limit > 0 else (items, [])
        metadata: JSON = {"resourceVersion": str(revision)}
        if rest:
            snapshot_id = next(self._snapshot_ids)
            self._snapshots[snapshot_id] = _Snapshot(kind, revision, rest, selected)
            while len(self._snapshots) > self._snapshots_kept:
                self._snapshots.popitem(last=False)
            metadata["continue"] = f"fake-continue-{snapshot_id}"
            if not selected:
                metadata["remainingItemCount"] = len(rest)
        elif kind.custom:
            metadata["continue"] = ""
        if kind.custom:
            rendered = [clone(obj) for obj in page]
        else:
            rendered = [
                {k: clone(v) for k, v in obj.items() if k not in ("apiVersion", "kind")}
                for obj in page
            ]
        return {
            "apiVersion": kind.api_version,
            "kind": f"{kind.kind}List",
            "metadata": metadata,
            "items": rendered,
        }

    def _resume(self, kind: Kind, token: str) -> _Snapshot:
        prefix = "fake-continue-"
        if not token.startswith(prefix) or not token[len(prefix) :].isdigit():
            raise bad_request(f"invalid continue token: {token!r}")
        snapshot = self._snapshots.get(int(token[len(prefix) :]))
        if snapshot is None or snapshot.kind != kind or snapshot.revision < self.compacted[kind]:
            raise ApiError(
                410,
                "Expired",
                "The provided continue parameter is too old to display a consistent list "
                "result. You can start a new list without the continue parameter.",
            )
        return snapshot

    def changes_since(self, kind: Kind, revision: int) -> list[Change] | None:
        """Changes of ``kind`` after ``revision`` in order; None if history no longer has them."""
        if revision < self.compacted[kind]:
            return None
        newer: list[Change] = []
        for change in reversed(self._history[kind]):
            if change.revision <= revision:
                break
            newer.append(change)
        newer.reverse()
        return newer

    def compact(self) -> None:
        """Forget all history, as etcd compaction does: older watches and tokens get 410."""
        for kind in KINDS:
            self._history[kind].clear()
            self.compacted[kind] = self.revision

    # -- writes ----------------------------------------------------------------------------

    def create(
        self,
        target: Target,
        body: Any,
        *,
        review: Callable[[JSON], None] | None = None,
        dry_run: bool = False,
    ) -> JSON:
        """POST: the stored object (do not mutate it).

        ``review``: a validating admission webhook, as kube-apiserver calls one: with
        the object as it would be stored (its uid and creationTimestamp set), after
        validation and before storage; it refuses by raising. A name taken is then
        found only at storage (AlreadyExists after an allowed review, as etcd's
        create-if-absent). ``dry_run``: everything but storage (the uid is given too)."""
        kind = target.kind
        if target.subresource == "binding":
            return self._bind(target, body)
        if target.name is not None:
            raise method_not_allowed()
        obj = create_body(kind, body)
        metadata = obj["metadata"]
        namespace = self._namespace_of(target, metadata)
        name = metadata.get("name") or ""
        if not name:
            if not metadata.get("generateName"):
                raise invalid(
                    kind.qualified_kind,
                    "",
                    ["metadata.name: Required value: name or generateName is required"],
                )
            name = self._generate_name(kind, namespace, str(metadata["generateName"]))
        check_name(kind, name)
        key = (namespace or "", name)
        exists = ApiError(409, "AlreadyExists", f'{kind.resource} "{name}" already exists')
        admitted = review is not None or dry_run
        if not admitted and key in self._objects[kind]:
            raise exists
        metadata["name"] = name
        if namespace is not None:
            metadata["namespace"] = namespace
        initial_status(kind, obj, self._stamp())
        check_new(kind, obj)
        metadata["uid"] = f"{self._uid_prefix}-0000-4000-8000-{next(self._uids):012x}"
        metadata["creationTimestamp"] = self._stamp()
        if kind.generation:
            metadata["generation"] = 1
        if review is not None:
            review(clone(obj))
        if admitted and key in self._objects[kind]:
            raise exists
        if dry_run:
            return obj
        if not kind.stored:  # an Event: counted and summarized, not kept
            self.events.record(obj)
            self.revision += 1
            metadata["resourceVersion"] = str(self.revision)
            self._tell_listeners("ADDED", obj)
            return obj
        self._sorted[kind] = None
        self._commit(kind, key, "ADDED", obj, None)
        return obj

    def _stamp(self) -> str:
        return self._now().strftime("%Y-%m-%dT%H:%M:%SZ")

    def _bind(self, target: Target, body: Any) -> JSON:
        """POST pods/NAME/binding, as kube-scheduler binds (the rules: podrules.bound)."""
        binding_errors(target.name or "", body)
        old = self.get(Target(target.kind, target.namespace, target.name))
        self._commit(target.kind, target.key, "MODIFIED", bound(old, body, self._stamp()), old)
        return BOUND

    def _namespace_of(self, target: Target, metadata: JSON) -> str | None:
        if not target.kind.namespaced:
            metadata.pop("namespace", None)
            return None
        namespace = target.namespace or ""
        if metadata.get("namespace") not in (None, "", namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        if ("", namespace) not in self._objects[NAMESPACES]:
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found')
        return namespace

    def _generate_name(self, kind: Kind, namespace: str | None, prefix: str) -> str:
        for _ in range(8):  # the API server retries a clash, as since v1.30
            suffix = "".join(self._rng.choice(_SUFFIX_ALPHABET) for _ in range(5))
            if (namespace or "", prefix + suffix) not in self._objects[kind]:
                return prefix + suffix
        raise ApiError(409, "AlreadyExists", f'{kind.resource} "{prefix}" already exists')

    def replace(self, target: Target, body: Any) -> JSON:
        """PUT: with ``metadata.resourceVersion`` 409 if it moved; without, as the kind allows."""
        kind = target.kind
        if kind.create_on_update and target.name and target.key not in self._objects[kind]:
            return self._create_by_put(target, body)
        old = self._existing(target)
        if type(body) is not dict:
            raise bad_request("the body of the request is not a JSON object")
        candidate: JSON = clone(body)
        if type(candidate.get("metadata")) is not dict:
            candidate["metadata"] = {}
        unconditional = not candidate["metadata"].get("resourceVersion")
        if unconditional and not target.kind.unconditional_update:
            raise ApiError(
                422,
                "Invalid",
                f'{target.kind.resource} "{target.name}" is invalid: metadata.resourceVersion: '
                "Invalid value: 0: must be specified for an update",
            )
        if candidate["metadata"].get("name") != target.name:
            raise name_mismatch(candidate["metadata"].get("name"), target.name or "")
        return self._update(target, old, candidate, patched=False)

    def _create_by_put(self, target: Target, body: Any) -> JSON:
        """A PUT to a missing object of a kind that allows it (Lease): a create."""
        fresh = dict(body) if type(body) is dict else body
        if type(fresh) is dict and type(fresh.get("metadata")) is dict:
            metadata = {k: v for k, v in fresh["metadata"].items() if k != "resourceVersion"}
            if metadata.get("name") != target.name:
                raise name_mismatch(metadata.get("name"), target.name or "")
            fresh["metadata"] = metadata
        return self.create(Target(target.kind, target.namespace, None), fresh)

    def merge_patch(self, target: Target, patch: Any) -> JSON:
        old = self._existing(target)
        if type(patch) is not dict:
            raise bad_request("a merge patch must be a JSON object")
        return self._update(target, old, merge_patch(old, patch), patched=True)

    def json_patch(self, target: Target, operations: Any) -> JSON:
        old = self._existing(target)
        try:
            candidate = apply_json_patch(clone(old), operations)
        except PatchError as error:
            raise ApiError(422, "Invalid", PATCH_REJECTED) from error
        if type(candidate) is not dict:
            raise ApiError(422, "Invalid", PATCH_REJECTED)
        return self._update(target, old, candidate, patched=True)

    def _existing(self, target: Target) -> JSON:
        if target.name is None or target.subresource == "binding":
            raise method_not_allowed()
        return self.get(target)

    def _update(self, target: Target, old: JSON, candidate: JSON, *, patched: bool) -> JSON:
        result = updated(target, old, candidate, patched=patched)
        if result is not old:
            self._commit(target.kind, target.key, "MODIFIED", result, old)
        return result

    def delete(self, target: Target, uid: str | None = None) -> JSON:
        """DELETE at once (no finalizers); 409 if ``uid`` names another incarnation."""
        kind = target.kind
        old = self._existing(target)
        if kind is NAMESPACES:
            raise method_not_allowed()  # no namespace controller to finalize it, as here
        current_uid = old["metadata"]["uid"]
        if uid is not None and uid != current_uid:  # the precondition
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind.qualified_kind} "{target.name}": the '
                f"UID in the precondition ({uid}) does not match the UID in record "
                f"({current_uid}). The object might have been deleted and then recreated",
            )
        if kind.graceful_deletion:
            # Marked for deletion first (a revision of its own), then gone: with no
            # kubelet to wait for, the grace period is 0.
            marked = dict(old)
            marked["metadata"] = dict(old["metadata"], deletionTimestamp=self._stamp())
            marked["metadata"]["deletionGracePeriodSeconds"] = 0
            marked["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            self._commit(kind, target.key, "MODIFIED", marked, old)
            old = marked
        final = dict(old)
        final["metadata"] = dict(old["metadata"])
        self._sorted[kind] = None
        self._commit(kind, target.key, "DELETED", final, old)
        return final if kind.graceful_deletion else deleted_status(kind, target.name, current_uid)

    def _commit(
        self, kind: Kind, key: tuple[str, str], type_: str, obj: JSON, prev: JSON | None
    ) -> None:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        if type_ == "DELETED":
            del self._objects[kind][key]
        else:
            self._objects[kind][key] = obj
        change = Change(self.revision, type_, obj, prev)
        history = self._history[kind]
        if history.maxlen is not None and len(history) == history.maxlen:
            self.compacted[kind] = history[0].revision
        history.append(change)
        for watcher in list(self.watchers[kind].values()):
            watcher.offer(change)
        self._tell_listeners(type_, obj)

    def _tell_listeners(self, type_: str, obj: JSON) -> None:
        for listener in list(self.listeners):
            try:
                listener(type_, obj)
            except Exception as error:  # a checker's failure must not land in the operator
                self.listener_errors.append(error)
