"""Gated pods' promises over time: ungated in time, no create/delete loop, the truth said.

Issue 29 asks that gated pods be trusted whatever tenants, admins and crashes do.
:mod:`headroom_dev.sim.podchecks` checks each change and the end state; this
module checks what needs a clock (the schedule's: virtual seconds), at every change:

- **ungated within a resync**: a pod whose own reservation (named as it, owned by
  it) is Admitted in the store while it is gated is ungated (or gone, or its
  reservation released) within ``RESYNC + SLACK`` of the later of the admission
  and the moment the operator was last steady (a leader running, nothing paused,
  no outage: a crash, a takeover, a pause or an outage starts the clock again);
- **no create/delete loop**: ``t`` seconds after a pod was created, at most
  ``2 + m + (1 + r) * log2(1 + t / RETRY_FIRST)`` reservations were made for it,
  where ``m`` counts what moved meanwhile (a node, a quota, an operator, an edit of
  the pod: each may rightly have it placed again, even seen late, all at once) and
  ``r`` the operator's restarts: the first, one per move, and one per refusal, each
  after a backoff that starts at ``RETRY_FIRST`` and doubles (from scratch in a new
  operator), +1 for a decision racing a move;
- **an Expired pod gets no other**: once a pod's reservation is reclaimed ``Expired``
  (its quota's lifetime) after the pod left the gate on it, nothing is made for that
  pod again. One that ran out while the pod was still behind the gate (its ungate not
  sent in time) let nothing run: the pod is placed again after its backoff, as after
  any refusal (``AlreadyExpired``, ``UngateRefused``), within the bound above;
- **the condition says the truth after a crash**: once the operator has been steady
  (since its start, a crash, a pause or an outage) for ``RESYNC + SLACK``, every pod
  that, with its reservation, has not changed for as long has the condition
  ``headroom.dev/Admitted`` its reservation calls for (:func:`condition_wrong`); at
  quiescence every pod has. (A pod changed more recently may not be known yet: a
  watch event lost is made up for by the next resync.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headroom.api.constants import NODE_ANNOTATION, RAM_ANNOTATION
from headroom_dev.sim.podfacts import claims, finished, gated, pinned_to

JSON = dict[str, Any]
Key = tuple[str, str]
RESYNC = 30.0  # the schedule's resyncPeriod
# The round trips that follow a resync's pass (a decision's status, the ungate patch,
# the condition) and their retries on a noisy network (throttles, 5xx, lost answers:
# each retried within a second or two) take a few seconds; 10 s is twice the most seen.
SLACK = 10.0
RETRY_FIRST = 10.0  # seconds: the first backoff after a refusal (control.gates)
CONDITION = "headroom.dev/Admitted"


def owner_pod_uid(reservation: JSON) -> str | None:
    for ref in reservation["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1":
            return str(ref.get("uid"))
    return None


def is_own(reservation: JSON) -> bool:
    """Named as its owner pod and owned by a pod: the operator's, or one forged as it."""
    named = ((reservation.get("spec") or {}).get("owner") or {}).get("pod")
    return owner_pod_uid(reservation) is not None and named == reservation["metadata"]["name"]


def claimed_mb(pod: JSON) -> int | None:
    """The RAM the pod's annotation claims, MiB (the forms the simulation writes), or
    None when it does not read."""
    value = str((pod["metadata"].get("annotations") or {}).get(RAM_ANNOTATION, ""))
    try:
        if value.endswith("Gi"):
            return math.ceil(float(value[:-2]) * 1024)
        number = int(value[:-2]) if value.endswith("Mi") else int(value)
    except ValueError:
        return None
    return number if number >= 0 else None


def condition(pod: JSON) -> tuple[str, str] | None:
    for item in (pod.get("status") or {}).get("conditions") or []:
        if item.get("type") == CONDITION:
            return str(item.get("status")), str(item.get("reason"))
    return None


def condition_wrong(pod: JSON, reservation: JSON | None) -> str | None:
    """What is wrong with the pod's condition given its own reservation, or None.

    Gated: it says why, False (Waiting when its reservation waits, the refusal when it
    was refused, BadClaim when its claim does not read); ungated on its Admitted
    reservation: True, Admitted (or OverCommitted). Other states are not judged."""
    if finished(pod) or not claims(pod):
        return None
    said = condition(pod)
    status = (reservation or {}).get("status") or {}
    phase, reason = status.get("phase"), status.get("reason")
    if gated(pod):
        if said is None or said[0] != "False":
            return f"gated, but its condition is {said}"
        if claimed_mb(pod) is None:
            return None if said[1] == "BadClaim" else f"its claim is unreadable, it says {said}"
        if reservation is None or not _matches(pod, reservation):
            return None
        if phase == "Queued" and said[1] != "Waiting":
            return f"its reservation is Queued, it says {said}"
        if phase in ("Rejected", "Reclaimed") and reason != "OwnerPodFinished":
            return None if said[1] == reason else f"its reservation is {phase}/{reason}: {said}"
        return None
    node = (reservation or {}).get("spec", {}).get("node")
    if reservation is not None and phase == "Admitted" and pinned_to(pod, str(node)):
        want = "OverCommitted" if reason == "OverCommitted" else "Admitted"
        return None if said == ("True", want) else f"runs on its Admitted reservation: {said}"
    return None


def _matches(pod: JSON, reservation: JSON) -> bool:
    """Whether the reservation is what the operator makes for the pod's claim now."""
    spec = reservation.get("spec") or {}
    node = (pod["metadata"].get("annotations") or {}).get(NODE_ANNOTATION)
    return spec.get("ramMB") == claimed_mb(pod) and node in (None, spec.get("node"))


class PodPromises:
    """The clocked promises above; fed every change by :class:`PodChecker`."""

    def __init__(
        self,
        fail: Callable[[str], None],
        count: Callable[[str], None],
        now: Callable[[], float],
        steady_since: Callable[[], float | None],
    ) -> None:
        self.fail, self.count, self.now, self.steady_since = fail, count, now, steady_since
        self._admitted_gated: dict[str, tuple[float, Key]] = {}  # pod uid -> since, its key
        self._moves = 0  # changes that may move any pod (a node, a quota, an operator)
        self._restarts = 0  # of them, the operator's (a new one backs off from scratch)
        #: pod uid -> when it came, moves and restarts then, made since, its edits
        self._made: dict[str, _Made] = {}
        self._expired: set[str] = set()  # pod uids whose reservation was reclaimed Expired
        self._touched: dict[Key, float] = {}  # pod key -> its or its reservation's last change
        self._checked: dict[Key, float] = {}  # pod key -> the last change judged settled
        self._looked_at = float("-inf")

    # -- what happens ------------------------------------------------------------------------

    def moved(self, *, restart: bool = False) -> None:
        """A node, a quota or an operator changed: any pod may rightly be placed again."""
        self._moves += 1
        self._restarts += restart

    def pod_changed(self, key: Key, before: JSON | None, pod: JSON | None) -> None:
        self._touched[key] = self.now()
        uid = (pod or before or {}).get("metadata", {}).get("uid")
        if pod is None or not gated(pod) or finished(pod):
            self._admitted_gated.pop(str(uid), None)
        if pod is not None and str(uid) not in self._made:  # moves count from its creation
            self._made[str(uid)] = _Made(self.now(), self._moves, self._restarts)
        made = self._made.get(str(uid))
        if made and before is not None and pod is not None and _placing(before) != _placing(pod):
            made.edits += 1

    def reservation_changed(self, event_type: str, obj: JSON, pod: JSON | None) -> None:
        """``pod``: the live pod of the reservation's name and owner, if any."""
        pod_uid = owner_pod_uid(obj)
        if pod_uid is None or not is_own(obj):
            return
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        self._touched[key] = self.now()
        status = obj.get("status") or {}
        if event_type == "ADDED":
            self._made_one(key, pod_uid)
        expired = status.get("phase") == "Reclaimed" and status.get("reason") == "Expired"
        if expired and (pod is None or not gated(pod)):  # it was let out on that lifetime
            self._expired.add(pod_uid)
        held = event_type != "DELETED" and status.get("phase") == "Admitted"
        if held and pod is not None and gated(pod):
            self._admitted_gated.setdefault(pod_uid, (self.now(), key))
        elif not held:
            self._admitted_gated.pop(pod_uid, None)

    def _made_one(self, key: Key, pod_uid: str) -> None:
        if pod_uid in self._expired:
            self.fail(f"pod {key}: a reservation made again after its quota's lifetime ran out")
        made = self._made.setdefault(pod_uid, _Made(self.now(), self._moves, self._restarts))
        made.count += 1
        if made.count > 1:
            self.count("pod-made-again")
        bound = made.bound(self.now(), self._moves, self._restarts)
        if made.count > bound:
            self.fail(
                f"pod {key}: {made.count} reservations made in {self.now() - made.since:.1f}s "
                f"(at most {bound} for what moved meanwhile): a create/delete loop"
            )

    # -- judged at every change ------------------------------------------------------------------

    def judge(self, pods: dict[Key, JSON], reservations: dict[Key, JSON]) -> None:
        steady = self.steady_since()
        if steady is None:
            return
        now = self.now()
        for pod_uid, (since, key) in list(self._admitted_gated.items()):
            late = now - max(since, steady)
            if late > RESYNC + SLACK:
                del self._admitted_gated[pod_uid]
                self.fail(
                    f"pod {key}: gated {late:.1f}s while its reservation is Admitted and "
                    f"the operator steady (more than a resync, {RESYNC:g}s, and {SLACK:g}s)"
                )
        settled = RESYNC + SLACK
        if now - steady < settled or now - self._looked_at < 1.0:
            return
        self._looked_at = now  # once a second at most: the pods do not change faster
        for key, pod in pods.items():
            touched = self._touched.get(key, 0.0)
            if now - touched >= settled and self._checked.get(key) != touched:
                self._checked[key] = touched
                self.count("pod-condition-checked")
                self.check_condition(pod, reservations.get(key), "settled")

    def ungated(self, pod_uid: str) -> None:
        """How long after its admission (and the operator's last steady start) it went."""
        since = self._admitted_gated.pop(pod_uid, None)
        steady = self.steady_since()
        if since is None or steady is None:
            return
        late = self.now() - max(since[0], steady)
        bucket = next((b for b in (1, 5, 15, 30) if late < b), None)
        self.count(f"pod-ungate-lag<{bucket}s" if bucket else "pod-ungate-lag>=30s")

    def expired(self, pod_uid: str) -> bool:
        """Whether the pod's reservation was reclaimed Expired (it gets no other)."""
        return pod_uid in self._expired

    def check_condition(self, pod: JSON, reservation: JSON | None, when: str) -> None:
        own = reservation if reservation is not None and _owned_by(reservation, pod) else None
        wrong = condition_wrong(pod, own)
        if wrong is not None:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            self.fail(f"pod {key} {when}: {wrong}")


@dataclass
class _Made:
    """Reservations made for one pod, and what may have caused them, since it came."""

    since: float
    moves: int  # the world's moves and restarts when it came
    restarts: int
    count: int = 0
    edits: int = 0  # of the pod's claim or constraints, since

    def bound(self, now: float, moves: int, restarts: int) -> int:
        """The first, one more for each move seen since (a node, a quota, an operator, an
        edit of the pod: each may rightly have it placed again, even seen late, all at
        once), and one per refusal backoff that fits in the time (10 s doubling: at most
        log2(1 + t/10) of them, from scratch after each restart), +1 for a decision
        racing a move."""
        retries = math.floor(math.log2(1 + (now - self.since) / RETRY_FIRST))
        changed = moves - self.moves + self.edits
        return 2 + changed + (1 + restarts - self.restarts) * retries


def _owned_by(reservation: JSON, pod: JSON) -> bool:
    return is_own(reservation) and owner_pod_uid(reservation) == pod["metadata"]["uid"]


def _placing(pod: JSON) -> tuple[Any, ...]:
    """What of a pod may rightly move its reservation: its claim and its constraints."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    return (
        claims(pod),
        annotations.get(RAM_ANNOTATION),
        annotations.get(NODE_ANNOTATION),
        repr(spec.get("nodeSelector")),
        repr(spec.get("affinity")),
    )
