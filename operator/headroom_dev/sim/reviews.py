"""Reservation creates reviewed by the validating webhook first (issue 32), in the simulation.

In some schedules every tenant's Reservation create goes through the webhook's review
before it is stored, as kube-apiserver calls it: with the object as it would be
stored, its uid given already (the stored object keeps it), after validation and
before storage (:meth:`headroom_dev.sim.fakeapi.store.Store.create`). What is played:

- the review reaches one live replica, as the Service picks one. A paused one is cut
  off: no outlook. One that does not decide (a standby, a leader rebuilding its
  ledger) is asked too (it must say it has none) and forwards the review to the
  leader: the replica that decides now, if another one does and is not paused, else
  no outlook. The answer is ``controller.outlook.answer`` (what the HTTPS server calls);
- strict mode on some creates (the ``headroom.dev/outlook: strict`` annotation) and on
  some namespaces (the label, set before any replica starts);
- refused: never stored (403); allowed: stored, but for some never-persisted ones:
  the create fails after the review (lost: a 504 after admission), or its name is
  taken (AlreadyExists, found at storage, after an allowed review);
- duplicated reviews of the same uid (an API server retrying the webhook call: the
  second answer is the one followed);
- server-side dry runs before some creates (a uid of their own, never stored, never
  holding room).

:mod:`headroom_dev.sim.reviewchecks` says what is checked.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from headroom.api.constants import OUTLOOK_MODE, STRICT
from headroom.control.controller import Controller
from headroom.control.outlook import OutlookAnswer
from headroom.kube.transport import ApiError, resource_path
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.reviewchecks import Answered, ReviewChecker, verdict_of

JSON = dict[str, Any]
REVIEW_SHARE = 0.4  # of schedules whose tenants' creates are reviewed first
HOLDS = (1.0, 5.0, 30.0)  # webhook.provisionalHold: the default, and short ones that run out
STRICT_CREATES = 0.5  # of reviewed creates annotated strict
STRICT_NAMESPACE = 0.3  # of the tenants' namespaces labelled strict
DRY_RUN = 0.15  # of creates preceded by a server-side dry run
DUPLICATE = 0.15  # of reviews sent twice (the same uid)
LOST = 0.06  # of allowed creates that fail after the review
NAMESAKE = 0.06  # of creates that name an existing reservation (AlreadyExists at storage)
WEBHOOK = "reservations.headroom.dev"


class Replica(Protocol):
    name: str
    run_id: str
    alive: bool
    controller: Controller

    @property
    def deciding(self) -> bool: ...

    @property
    def paused(self) -> bool: ...


class Reviews:
    """The webhook's reviews of the tenants' creates, answered by the replicas."""

    def __init__(
        self,
        server: FakeApiServer,
        replicas: Callable[[], Sequence[Replica]],
        checker: ReviewChecker,
        count: Callable[[str], None],
        now: Callable[[], float],
        seed: float,
    ) -> None:
        self.server, self.replicas, self.checker = server, replicas, checker
        self.count, self.now = count, now
        self.rng = random.Random(seed)
        self.strict_namespaces: set[str] = set()

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        """The labels to create a tenants' namespace with: strict mode, sometimes."""
        if self.rng.random() < STRICT_NAMESPACE:
            self.strict_namespaces.add(namespace)
            return {OUTLOOK_MODE: STRICT}
        return {}

    def annotations(self) -> dict[str, str] | None:
        return {OUTLOOK_MODE: STRICT} if self.rng.random() < STRICT_CREATES else None

    def dry_run_first(self) -> bool:
        return self.rng.random() < DRY_RUN

    def namesake(self, names: list[str]) -> str | None:
        """An existing reservation's name to create again (AlreadyExists), sometimes."""
        return self.rng.choice(names) if names and self.rng.random() < NAMESAKE else None

    def review(self, *, dry_run: bool = False) -> Callable[[JSON], None]:
        """The webhook's review of one create, for ``Store.create``: raises to refuse."""
        lost = not dry_run and self.rng.random() < LOST
        times = 2 if self.rng.random() < DUPLICATE else 1

        def review(obj: JSON) -> None:
            answer: OutlookAnswer | None = None
            said: Answered | None = None
            for _ in range(times):
                answer, said = self._answer(obj, dry_run)
            self.checker.concluded(obj["metadata"]["uid"], said, dry_run)
            self.count("review-dry-run" if dry_run else "review-create")
            if times > 1:
                self.count("review-duplicate")
            if answer is not None and answer.refusal is not None:
                self.count("review-refused")
                raise ApiError(
                    403,
                    "Forbidden",
                    f'admission webhook "{WEBHOOK}" denied the request: {answer.refusal}',
                )
            if lost:
                self.count("review-never-persisted")
                raise ApiError(504, "Timeout", "the create was allowed, then never stored")

        return review

    def _answer(self, obj: JSON, dry_run: bool) -> tuple[OutlookAnswer | None, Answered | None]:
        """The answer of the replica the review reaches (or of the leader it forwards
        to), and what the checker is told of it; None: no outlook (no replica reached,
        or none decides)."""
        living = [r for r in self.replicas() if r.alive]
        if not living:
            self.count("review-no-replica")
            return None, None
        reached = self.rng.choice(living)
        if reached.paused:
            self.count("review-unreachable")
            return None, None
        uid = obj["metadata"]["uid"]
        answering = reached
        if not reached.deciding:
            controller = reached.controller
            own = controller.outlook.answer(obj, dry_run=dry_run)
            self.checker.not_deciding(reached.run_id, uid, own, controller.holds)
            leaders = [r for r in living if r is not reached and r.deciding]
            if not leaders:
                self.count("review-no-outlook")
                return None, None
            answering = leaders[0]
            self.count("review-forwarded")
        held_before = uid in answering.controller.holds
        answer = answering.controller.outlook.answer(obj, dry_run=dry_run)
        said = Answered(
            uid=uid,
            key=(obj["metadata"]["namespace"], obj["metadata"]["name"]),
            node=str(obj["spec"]["node"]),
            at=self.now(),
            run_id=answering.run_id,
            strict=self._strict(obj),
            dry_run=dry_run,
            verdict=verdict_of(answer),
            refused=answer.refusal is not None,
            held=uid in answering.controller.holds,
            held_before=held_before,
            limit=self.checker.checker.limit_now(str(obj["spec"]["node"])),
        )
        self.checker.answered(said, answering.name)
        return answer, said

    def _strict(self, obj: JSON) -> bool:
        """Strict mode, as the API server's objects say (not as the operator sees them)."""
        metadata = obj["metadata"]
        if (metadata.get("annotations") or {}).get(OUTLOOK_MODE) == STRICT:
            return True
        path = resource_path("", "v1", "namespaces", None, metadata["namespace"])
        namespace = self.server.get(path) or {}
        return ((namespace.get("metadata") or {}).get("labels") or {}).get(OUTLOOK_MODE) == STRICT
