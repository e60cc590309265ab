"""The in-memory API server: clients for operator processes, controls for the driver.

Operator processes talk to it through :meth:`FakeApiServer.client` (a Transport
with its own faults, pause and kill). The simulation driver plays everyone else
through synchronous, un-faulted controls that apply at once: a kubelet putting
and resizing Nodes, tenants creating and deleting Reservations and writing
heartbeats, pods coming and going. A checker follows every mutation as it
happens with :meth:`FakeApiServer.subscribe`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, Protocol

from headroom.api.constants import HEARTBEAT_ANNOTATION
from headroom.kube.transport import ApiError, ApiUnavailableError, resource_path
from headroom.ledger.quotas import NAME_LABEL
from headroom_dev.sim.fakeapi.client import FakeClient
from headroom_dev.sim.fakeapi.events import EventLog
from headroom_dev.sim.fakeapi.faults import FaultPlan
from headroom_dev.sim.fakeapi.jsonvalue import clone
from headroom_dev.sim.fakeapi.kinds import NAMESPACES, NODES, PODS, RESERVATIONS, parse_path
from headroom_dev.sim.fakeapi.store import Listener, Store
from headroom_dev.sim.loop import VirtualClock

JSON = dict[str, Any]
RESERVATIONS_API = "headroom.dev/v1alpha1"


class Clock(Protocol):
    def now(self) -> datetime: ...


def _memory(value: str | int) -> str:
    """A quantity: ``"32Gi"`` as is, an int as MiB."""
    return f"{value}Mi" if isinstance(value, int) else value


class FakeApiServer:
    """One simulated API server (and etcd). Create one per simulation.

    ``history_limit``: changes kept per kind for watches to resume from (older:
    410). ``bookmark_interval``: virtual seconds between BOOKMARKs (0: only the
    one 2 s before a watch's timeout). ``expired_watch``: how a watch from a
    version older than the history is refused: ``"event"`` (an ERROR event, as
    kube-apiserver does) or ``"api_error"`` (ApiError 410 from the first read).
    """

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        seed: int = 0,
        history_limit: int = 1000,
        bookmark_interval: float = 60.0,
        expired_watch: Literal["event", "api_error"] = "event",
        continue_tokens_kept: int = 64,
        events_kept: int = 8,
    ) -> None:
        self.clock: Clock = clock or VirtualClock()
        self.bookmark_interval = bookmark_interval
        self.expired_watch = expired_watch
        self.store = Store(
            self.clock.now,
            seed=seed,
            history_limit=history_limit,
            continue_tokens_kept=continue_tokens_kept,
            events_kept=events_kept,
        )
        self.clients: dict[str, FakeClient] = {}  # the latest client by name
        self._every_client: list[FakeClient] = []

    def client(
        self, name: str, faults: FaultPlan | None = None, *, timeout: float | None = None
    ) -> FakeClient:
        """A Transport for one process; a name reused means a new process with that name.

        ``faults`` stays the client's: its probabilities may be changed mid-run (an
        outage: ``client.faults.refuse = 1.0``, later back to 0).
        """
        client = FakeClient(self, name, faults, timeout=timeout)
        self.clients[name] = client
        self._every_client.append(client)
        return client

    # -- observing ----------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self.store.revision

    @property
    def events(self) -> EventLog:
        """Events posted (count, by reason, the last few per object)."""
        return self.store.events

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event_type, obj)`` synchronously after every mutation.

        ``obj`` is the stored object itself: read it, never mutate it. An exception
        in a listener is kept in :attr:`listener_errors` (never raised into the
        operator, which might swallow it); assert that list is empty.
        Returns a function that unsubscribes.
        """
        self.store.listeners.append(listener)
        return lambda: self.store.listeners.remove(listener)

    @property
    def listener_errors(self) -> list[BaseException]:
        return self.store.listener_errors

    def break_watches(self) -> None:
        """Every open watch of every client fails with ApiUnavailableError, as when the
        API server restarts or a load balancer drops its connections."""
        for client in self._every_client:
            for stream in list(client.streams.values()):
                stream.fail(ApiUnavailableError(f"{client.name}: watch connection reset"))

    def compact(self) -> None:
        """Forget all history (etcd compaction): older watches and continue tokens get 410."""
        self.store.compact()

    def get(self, path: str) -> JSON | None:
        """A copy of the object at ``path``, or None."""
        try:
            return clone(self.store.get(parse_path(path)))
        except ApiError as error:
            if error.not_found:
                return None
            raise

    def objects(self, path: str) -> list[JSON]:
        """Copies of every object under a collection path, in key order."""
        target = parse_path(path)
        return [clone(obj) for obj in self.store.all(target.kind, target.namespace)]

    def reservations(self, namespace: str | None = None) -> list[JSON]:
        return [clone(o) for o in self.store.all(RESERVATIONS, namespace)]

    def nodes(self) -> list[JSON]:
        return [clone(o) for o in self.store.all(NODES)]

    # -- generic un-faulted writes ----------------------------------------------------------------

    def create(
        self,
        path: str,
        body: JSON,
        *,
        review: Callable[[JSON], None] | None = None,
        dry_run: bool = False,
    ) -> JSON:
        """``review``: an admission webhook's review before storage (:meth:`Store.create`)."""
        return clone(self.store.create(parse_path(path), body, review=review, dry_run=dry_run))

    def merge_patch(self, path: str, body: JSON) -> JSON:
        return clone(self.store.merge_patch(parse_path(path), body))

    def delete(self, path: str, *, uid: str | None = None) -> JSON:
        return clone(self.store.delete(parse_path(path), uid))

    def annotate(self, path: str, annotations: dict[str, str | None]) -> JSON:
        """Set (or with None, remove) annotations on the object at ``path``."""
        return self.merge_patch(path, {"metadata": {"annotations": annotations}})

    # -- a kubelet -----------------------------------------------------------------------------

    def put_node(
        self,
        name: str,
        memory: str | int = "32Gi",
        *,
        allocatable: str | int | None = None,
        labels: dict[str, str | None] | None = None,
        annotations: dict[str, str | None] | None = None,
    ) -> JSON:
        """Create a Node or resize it: ``status.capacity``/``allocatable.memory``
        (an int is MiB), labels and annotations merged (None removes one)."""
        status = {
            "capacity": {"memory": _memory(memory), "cpu": "8", "pods": "110"},
            "allocatable": {"memory": _memory(allocatable or memory), "cpu": "8", "pods": "110"},
        }
        path = resource_path("", "v1", "nodes", None, name)
        if self.store.peek(NODES, None, name) is None:
            metadata: JSON = {"name": name}
            if labels:
                metadata["labels"] = {k: v for k, v in labels.items() if v is not None}
            if annotations:
                metadata["annotations"] = {k: v for k, v in annotations.items() if v is not None}
            return self.create(
                resource_path("", "v1", "nodes"), {"metadata": metadata, "status": status}
            )
        if labels or annotations:
            metadata = {}
            if labels:
                metadata["labels"] = labels
            if annotations:
                metadata["annotations"] = annotations
            self.merge_patch(path, {"metadata": metadata})
        return self.merge_patch(f"{path}/status", {"status": status})

    def delete_node(self, name: str) -> None:
        self.delete(resource_path("", "v1", "nodes", None, name))

    # -- tenants ---------------------------------------------------------------------------------

    def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A namespace, with the label kube-apiserver gives every one (its name)."""
        if self.store.peek(NAMESPACES, None, name) is None:
            metadata = {"name": name, "labels": {**(labels or {}), NAME_LABEL: name}}
            self.create(resource_path("", "v1", "namespaces"), {"metadata": metadata})

    def create_pod(
        self,
        namespace: str,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> JSON:
        """A pod (say, an owner: ``labels={"headroom.dev/owner": "true"}``)."""
        self.ensure_namespace(namespace)
        metadata: JSON = {"name": name}
        if labels:
            metadata["labels"] = labels
        if annotations:
            metadata["annotations"] = annotations
        body = {"metadata": metadata, "spec": {"containers": [{"name": "main", "image": "sim"}]}}
        return self.create(resource_path("", "v1", "pods", namespace), body)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.delete(resource_path("", "v1", "pods", namespace, name))

    def create_reservation(
        self,
        namespace: str,
        name: str,
        node: str,
        ram_mb: int,
        vram_mb: int = 0,
        *,
        annotations: dict[str, str] | None = None,
        review: Callable[[JSON], None] | None = None,
        dry_run: bool = False,
        **spec: Any,
    ) -> JSON:
        """As ``kubectl apply`` would; extra ``spec`` fields by their API names (``owner=...``).
        ``review``: the validating webhook's review of the create (:meth:`Store.create`)."""
        self.ensure_namespace(namespace)
        body_spec: JSON = {"node": node, "ramMB": ram_mb, **spec}
        if vram_mb:
            body_spec["vramMB"] = vram_mb
        metadata: JSON = {"name": name}
        if annotations:
            metadata["annotations"] = annotations
        body = {
            "apiVersion": RESERVATIONS_API,
            "kind": "Reservation",
            "metadata": metadata,
            "spec": body_spec,
        }
        return self.create(
            resource_path("headroom.dev", "v1alpha1", "reservations", namespace),
            body,
            review=review,
            dry_run=dry_run,
        )

    def delete_reservation(self, namespace: str, name: str, *, uid: str | None = None) -> None:
        self.delete(
            resource_path("headroom.dev", "v1alpha1", "reservations", namespace, name), uid=uid
        )

    def heartbeat(self, namespace: str, name: str, at: datetime | None = None) -> JSON:
        """Write the heartbeat annotation on a Reservation (default: the clock's now)."""
        path = resource_path("headroom.dev", "v1alpha1", "reservations", namespace, name)
        return self.annotate(path, {HEARTBEAT_ANNOTATION: self._stamp(at)})

    def heartbeat_pod(self, namespace: str, name: str, at: datetime | None = None) -> JSON:
        """Write the heartbeat annotation on an owner pod."""
        path = resource_path("", "v1", "pods", namespace, name)
        return self.annotate(path, {HEARTBEAT_ANNOTATION: self._stamp(at)})

    def _stamp(self, at: datetime | None) -> str:
        return (at or self.clock.now()).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def pods(self, namespace: str | None = None) -> list[JSON]:
        return [clone(o) for o in self.store.all(PODS, namespace)]
