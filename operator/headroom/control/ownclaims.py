"""The operator's own reservation of a running claim pod, told from what a tenant writes.

A claim pod that runs on a node without our gate (the webhook missed it, or it was
labelled later) gets its memory *recorded* there, past the node's limit and the
quotas if it must: the pod runs whatever the ledger says. Tenants can create
Reservations with any name, ownerReferences and spec, so only the exact reservation
the operator writes for that pod takes that path
(``headroom.objects.pods.is_own_reservation``); anything else naming the pod is
decided like any other claim.

The pod is read as the owner-pod watch last showed it (the operator labels a claim
pod as an owner before it writes the reservation, and a decision waits until its
owner pod is known). That watch can lag the one the reservation was written from:
a reservation that looks like the operator's own but does not match the pod as last
seen is decided only once the pod was read from the API after it was seen.
"""

from __future__ import annotations

from headroom.api.parse import InvalidValueError
from headroom.control.lookups import Lookups
from headroom.control.state import State
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON
from headroom.ledger import Entry
from headroom.objects.pods import is_own_reservation, owning_pod_uid
from headroom.objects.reservations import reservation_entry


class OwnClaims:
    def __init__(self, state: State, lookups: Lookups, clock: Clock) -> None:
        self._state, self._lookups, self._clock = state, lookups, clock

    def is_own(self, namespace: str, obj: JSON, entry: Entry) -> bool:
        """Whether ``entry`` (of ``obj``) is the operator's own for a pod running on its
        node, its claim capped at what the pod can use: recorded, fit or not."""
        pod = entry.owner.pod
        seen = self._state.owner_pods.get((namespace, pod)) if pod is not None else None
        if seen is None or seen.running is None:
            return False
        ram, vram = self._state.ledger.capacity(seen.running.node)
        return is_own_reservation(entry, owning_pod_uid(obj), seen.uid, seen.running, ram, vram)

    def ready(self, namespace: str, name: str, obj: JSON, pod: str, seen_at: float) -> bool:
        """Whether the reservation, first seen at ``seen_at``, may be decided now: False
        while the pod is read again because it looks like the operator's own for ``pod``
        (named as it, Pod liveness, owned by a pod) and the pod as last seen says not."""
        spec = obj.get("spec")
        owner_uid = owning_pod_uid(obj)
        if name != pod or not isinstance(spec, dict) or spec.get("liveness") != "Pod":
            return True
        if owner_uid is None:
            return True
        seen = self._state.owner_pods.get((namespace, pod))
        if seen is not None and seen.placed_by_operator and seen.uid == owner_uid:
            # A gated pod's, or one the operator's bind waits for: decided as a claim
            # (only the operator ungates it, or binds it), with no read of the pod.
            return True
        try:
            entry = reservation_entry(obj, self._clock.now())
        except InvalidValueError:
            return True  # refused as it is
        return self.is_own(namespace, obj, entry) or self._lookups.pod_read_since(
            namespace, pod, seen_at
        )
