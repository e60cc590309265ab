"""What is checked of the answers at create (issue 32), in the simulation.

:mod:`headroom_dev.sim.reviews` sends tenants' Reservation creates through the
validating webhook's review first; each answer is told here (:meth:`ReviewChecker.answered`),
and so is every provisional hold given back (:meth:`ReviewChecker.gave_back`). Checked:

- **never over a limit, holds counted**: when a hold is taken, what is Admitted on
  its node in the store plus the answering leader's provisional holds there is within
  the node's limit, and within every quota governing its namespace; when a
  reservation becomes Admitted, the decider's holds count too (``Checker._admission``);
- **strict answers and statuses agree**: a strict create told "would be admitted" by
  a leader L, which holds its room (a namespace labelled strict), and stored, is first
  decided Admitted, unless the leadership changed
  between the answer and that decision (another replica decided it: holds are in
  L's memory only) or L's hold ran out (``webhook.provisionalHold``) before it, or the
  room went otherwise: its node was deleted or shrank, or a quota changed, since the
  answer; each exception is counted (``strict-exception-*``), never skipped silently. A create
  refused at create is never stored. A review of a uid that L already holds room for
  (a duplicate, as an API server retry) is told the same: admitted, not refused;
- **no hold outlives its lifetime**: every hold in a live replica's ledger (an entry
  ``<namespace>/~<uid>``) was taken by an answer of that replica at most
  ``provisionalHold`` ago, or its Reservation waits in that replica's decider queue
  (a promise kept until decided), and ``ProvisionalHolds`` and the ledger agree on
  them; a dry run takes none; so a refused, never-persisted or dry-run create holds
  nothing after ``provisionalHold``;
- **only a deciding replica answers**: a replica that does not decide (a standby, a
  leader rebuilding its ledger) says it has no outlook (Unknown, no refusal, no hold);
  a replica that gives an outlook holds the Lease in the store then.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headroom.api.outlook import Outlook, Verdict, parse_warning
from headroom.control.controller import Controller
from headroom.control.outlook import OutlookAnswer
from headroom_dev.sim.checks import Checker

JSON = dict[str, Any]
EPSILON = 1e-6


def verdict_of(answer: OutlookAnswer) -> Verdict:
    """The outlook an answer says (its first warning that is one)."""
    for warning in answer.warnings:
        found: Outlook | None = parse_warning(warning)
        if found is not None:
            return found.verdict
    return Verdict.UNKNOWN


@dataclass
class Answered:
    """One review's answer, as the checker keeps it."""

    uid: str
    key: tuple[str, str]
    node: str
    at: float
    run_id: str  # the replica that answered
    strict: bool
    dry_run: bool
    verdict: Verdict
    refused: bool
    held: bool  # the answering replica holds room for this uid after the answer
    held_before: bool = False  # ... and before it (the same create reviewed again)
    limit: int | None = None  # its node's limit then


@dataclass
class ReviewChecker:
    checker: Checker
    lifetime: float  # webhook.provisionalHold, seconds
    controllers: Callable[[], list[tuple[str, Controller]]]  # live replicas: (run id, controller)
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _taken: dict[tuple[str, str], float] = field(default_factory=dict)  # (run, uid) -> when
    _promised: dict[str, Answered] = field(default_factory=dict)  # uid -> strict "admitted"
    _refused: set[str] = field(default_factory=set)
    _stored: set[str] = field(default_factory=set)
    _first: set[str] = field(default_factory=set)  # uids whose first decision was seen
    _expired: set[tuple[str, str]] = field(default_factory=set)  # (run, uid): ran out
    _quota_changed_at: float = -1.0

    def __post_init__(self) -> None:
        self.checker.provisional = self.provisional

    def fail(self, what: str) -> None:
        self.checker.fail(what)

    # -- told by the reviews ---------------------------------------------------------------

    def not_deciding(self, run_id: str, uid: str, answer: OutlookAnswer, holds: Any) -> None:
        """A replica that does not decide was asked: it must have no outlook."""
        self.counts["review-not-deciding"] += 1
        verdict = verdict_of(answer)
        if verdict is not Verdict.UNKNOWN or answer.refusal is not None or uid in holds:
            self.fail(
                f"review {uid}: {run_id}, not deciding, answered {verdict} "
                f"(refusal {answer.refusal!r}, held {uid in holds})"
            )

    def answered(self, said: Answered, identity: str) -> None:
        self.counts["review-answered"] += 1
        self.counts[f"review-{'dry-' if said.dry_run else ''}{said.verdict.value.lower()}"] += 1
        uid, run = said.uid, said.run_id
        if said.verdict is not Verdict.UNKNOWN:
            lease = self.checker.lease()
            holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
            if lease is not None and holder != identity:
                self.fail(f"review {uid}: {run} answered {said.verdict} while {holder!r} led")
        if said.dry_run and said.held:
            self.fail(f"review {uid}: a dry run holds room in {run}'s ledger")
        if said.refused and not said.strict:
            self.fail(f"review {uid}: refused at create, but not in strict mode")
        if said.held_before:
            self.counts["review-duplicate-held"] += 1  # answered again while its room is held
            if said.refused or said.verdict is not Verdict.ADMITTED:
                self.fail(
                    f"review {uid} ({said.key}): its room held by {run} (told 'would be "
                    f"admitted' at {self._taken.get((run, uid), -1.0):.3f}), then told "
                    f"{said.verdict} (refused: {said.refused}) on a review of it again"
                )
        if said.held:
            self.counts["hold-taken" if (run, uid) not in self._taken else "hold-taken-again"] += 1
            self._taken[(run, uid)] = said.at  # its lifetime runs from its last answer
            self._within_limits(said)

    def concluded(self, uid: str, last: Answered | None, dry_run: bool) -> None:
        """The answer the API server follows (a review's last; None: no outlook)."""
        if dry_run:
            return
        earlier = self._promised.pop(uid, None)
        if last is None or not last.refused:
            self._refused.discard(uid)
        if last is None:
            return
        if last.refused:
            self._refused.add(uid)
        elif last.held and last.verdict is Verdict.ADMITTED:  # a promise: its room is held
            same = earlier is not None and earlier.run_id == last.run_id
            self._promised[uid] = earlier if same and earlier is not None else last

    def gave_back(self, run_id: str, uid: str, given: bool) -> None:
        """``ProvisionalHolds.give_back`` of replica ``run_id`` was called for ``uid``."""
        taken = self._taken.get((run_id, uid))
        if not given or taken is None:
            return
        now = self.checker.now()
        if now >= taken + self.lifetime - EPSILON:
            self._expired.add((run_id, uid))
            self.counts["hold-ran-out"] += 1
        else:
            self.counts["hold-given-back"] += 1

    # -- holds counted -----------------------------------------------------------------------

    def _holds_of(self, run_id: str) -> list[tuple[str, str, int]]:
        for run, controller in self.controllers():
            if run == run_id:
                return [
                    (entry.id.split("/", 1)[0], entry.node, entry.ram_mb)
                    for entry in controller.state.ledger
                    if "/~" in entry.id
                ]
        return []

    def provisional(self, decision: str) -> list[tuple[str, str, int]]:
        """The holds in the ledger of the replica that took ``decision``."""
        return self._holds_of(decision.split("-", 1)[0])

    def _within_limits(self, said: Answered) -> None:
        held = self._holds_of(said.run_id)
        limit = self.checker._limit(said.node)
        total = self.checker.committed_on(said.node) + sum(
            mb for _, n, mb in held if n == said.node
        )
        if limit is not None and total > limit:
            self.fail(
                f"review {said.uid} ({said.key}): its hold puts node {said.node} at {total} MiB "
                f"(Admitted and held) > limit {limit}"
            )
        self.checker.quotas.within(
            said.key, said.key[0], [(ns, mb) for ns, _, mb in held], "its hold pushed"
        )

    # -- every change ----------------------------------------------------------------------

    def on_change(self, event_type: str, obj: JSON) -> None:
        kind = obj.get("kind")
        if kind == "Reservation" and event_type != "DELETED":
            self._on_reservation(event_type, obj)
        elif kind == "HeadroomQuota":
            self._quota_changed_at = self.checker.now()
        self.holds_in_time()

    def _on_reservation(self, event_type: str, obj: JSON) -> None:
        meta = obj["metadata"]
        uid, key = meta["uid"], (meta["namespace"], meta["name"])
        if event_type == "ADDED":
            self._stored.add(uid)
            if uid in self._refused:
                self.fail(f"{key}: refused at create (uid {uid}), yet stored")
        promise = self._promised.get(uid)
        status = obj.get("status") or {}
        phase = status.get("phase")
        if promise is None or uid in self._first or phase not in ("Admitted", "Rejected", "Queued"):
            return
        self._first.add(uid)
        self._promised.pop(uid, None)
        self.counts["strict-answer-checked"] += 1
        decision = str(status.get("decisionID") or "")
        decider = decision.split("-", 1)[0] if decision else None
        if decider is None:  # (a Queued status names no decision: its decider still runs?)
            changed = promise.run_id not in {run for run, _ in self.controllers()}
        else:
            changed = decider != promise.run_id
        if changed:
            self.counts["strict-exception-leader-changed"] += 1
            return
        if (promise.run_id, uid) in self._expired:
            self.counts["strict-exception-hold-ran-out"] += 1
            return
        if phase == "Admitted":
            self.counts["strict-kept"] += 1
            return
        # The room went meanwhile, not to another reservation: the node was deleted or
        # shrank, or a quota changed, after the answer (counted, and said in the report).
        history = self.checker._limits.get(promise.node) or []
        since = [limit for at, limit in history if at > promise.at]
        if any(limit is None or promise.limit is None or limit < promise.limit for limit in since):
            self.counts["strict-exception-node-changed"] += 1
            return
        if self._quota_changed_at > promise.at:
            self.counts["strict-exception-quota-changed"] += 1
            return
        self.fail(
            f"{key}: strict create told 'would be admitted' by {promise.run_id} at "
            f"{promise.at:.3f} (held: {promise.held}), first decided {phase}/"
            f"{status.get('reason')} by {decider}: {status.get('message')}"
        )

    def holds_in_time(self) -> None:
        """Every hold in a live replica's ledger was taken by its answer, within its lifetime."""
        now = self.checker.now()
        for run, controller in self.controllers():
            holds = controller.holds
            entries = [e.id for e in controller.state.ledger if "/~" in e.id]
            if len(entries) != len(holds):
                self.fail(f"{run}: {len(holds)} provisional holds, {len(entries)} in its ledger")
            for entry_id in entries:
                uid = entry_id.split("/~", 1)[1]
                taken = self._taken.get((run, uid))
                if uid not in holds:
                    self.fail(f"{run}: ledger entry {entry_id}, but no hold of that uid")
                if taken is None:
                    self.fail(f"{run}: hold {entry_id} taken by no answer")
                elif now > taken + self.lifetime + EPSILON and uid not in controller.admission:
                    # Past its lifetime only while its Reservation waits to be decided.
                    self.fail(
                        f"{run}: hold {entry_id} outlived its lifetime ({now - taken:.3f}s "
                        f"> {self.lifetime:g}s)"
                    )

    def final(self) -> None:
        self.holds_in_time()
        self.counts["strict-unchecked-never-stored"] += sum(
            1 for uid in self._promised if uid not in self._stored
        )
        self.counts["strict-unchecked-undecided"] += sum(
            1 for uid in self._promised if uid in self._stored
        )
