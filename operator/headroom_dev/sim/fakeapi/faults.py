"""What can go wrong between one operator process and the API server, decided by a seed.

A :class:`FaultPlan` belongs to one client (one process). Each request draws
its fate from the plan's own ``random.Random``, in the order requests are made,
so a schedule replays exactly. The fates are the ones the control code must
survive, and they differ in whether the server *applied* the request:

==========================  ========  =========================================
fate                        applied   the caller sees
==========================  ========  =========================================
throttled                   no        ApiError 429 TooManyRequests
server error                no        ApiError 500 / 503 / 504
refused                     no        ApiUnavailableError (connection refused)
answer lost                 **yes**   ApiUnavailableError (timeout after the
                                      server acted: the write happened)
==========================  ========  =========================================

plus a virtual latency on the way in and on the way out. Per watch event: the
stream breaks, the event is lost, it comes twice, or the stream ends with a
410 ``ERROR`` event; delivery can lag.
"""

from __future__ import annotations

import enum
import random
from collections import Counter
from dataclasses import dataclass, field

from headroom.kube.transport import ApiError

READ_VERBS = frozenset({"get", "list", "watch"})
WRITE_VERBS = frozenset({"create", "replace", "patch", "delete"})
ALL_VERBS = READ_VERBS | WRITE_VERBS


class Fate(enum.Enum):
    """What happens to one request."""

    OK = "ok"
    THROTTLED = "throttled"
    INTERNAL_ERROR = "500"
    UNAVAILABLE = "503"
    GATEWAY_TIMEOUT = "504"
    REFUSED = "refused"
    ANSWER_LOST = "answer-lost"

    def error(self) -> ApiError | None:
        """The ApiError this fate answers with, if it is an answer."""
        answers = {
            Fate.THROTTLED: (429, "TooManyRequests", "too many requests, please try again later"),
            Fate.INTERNAL_ERROR: (
                500,
                "InternalError",
                "an error on the server has prevented the request from succeeding",
            ),
            Fate.UNAVAILABLE: (
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            Fate.GATEWAY_TIMEOUT: (
                504,
                "Timeout",
                "the server was unable to return a response "
                "in the time allotted, but may still be processing the request",
            ),
        }
        answer = answers.get(self)
        return None if answer is None else ApiError(*answer)


class EventFate(enum.Enum):
    """What happens to one watch event."""

    DELIVER = "deliver"
    DROP = "drop"
    DUPLICATE = "duplicate"


@dataclass
class FaultPlan:
    """Probabilities of each fault for one client; all zero is a perfect network.

    Request faults apply only to ``verbs`` (``"get"``, ``"list"``, ``"watch"``,
    ``"create"``, ``"replace"``, ``"patch"``, ``"delete"``); latency applies to all.
    """

    seed: int = 0
    throttle: float = 0.0
    server_error: float = 0.0
    refuse: float = 0.0
    lose_answer: float = 0.0
    latency: float = 0.0
    """Each way, uniform in [0, latency] virtual seconds."""
    verbs: frozenset[str] = ALL_VERBS
    watch_break: float = 0.0
    """Per event about to be delivered: the stream fails with ApiUnavailableError instead."""
    watch_drop: float = 0.0
    watch_duplicate: float = 0.0
    watch_expire: float = 0.0
    """Per event about to be delivered: an ERROR 410 event instead, then the stream ends."""
    watch_delay: float = 0.0
    """Before each event is delivered, uniform in [0, watch_delay] virtual seconds."""
    counts: Counter[str] = field(default_factory=Counter, init=False, repr=False)
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        unknown = self.verbs - ALL_VERBS
        if unknown:
            raise ValueError(f"unknown verbs {sorted(unknown)}; known: {sorted(ALL_VERBS)}")

    def fate(self, verb: str) -> Fate:
        """Draw the fate of one request."""
        total = self.throttle + self.server_error + self.refuse + self.lose_answer
        if total <= 0 or verb not in self.verbs:
            return Fate.OK
        draw = self.rng.random()
        fate = Fate.OK
        for probability, outcome in (
            (self.throttle, Fate.THROTTLED),
            (self.server_error, Fate.INTERNAL_ERROR),
            (self.refuse, Fate.REFUSED),
            (self.lose_answer, Fate.ANSWER_LOST),
        ):
            if draw < probability:
                fate = outcome
                break
            draw -= probability
        if fate is Fate.INTERNAL_ERROR:
            fate = self.rng.choice((Fate.INTERNAL_ERROR, Fate.UNAVAILABLE, Fate.GATEWAY_TIMEOUT))
        if fate is not Fate.OK:
            self.counts[fate.value] += 1
        return fate

    def delay(self) -> float:
        """One way's latency."""
        return self.rng.uniform(0.0, self.latency) if self.latency > 0 else 0.0

    def event_fate(self) -> EventFate:
        """Whether a watch event the server sends is lost, doubled or delivered."""
        if self.watch_drop <= 0 and self.watch_duplicate <= 0:
            return EventFate.DELIVER
        draw = self.rng.random()
        if draw < self.watch_drop:
            self.counts["watch-drop"] += 1
            return EventFate.DROP
        if draw < self.watch_drop + self.watch_duplicate:
            self.counts["watch-duplicate"] += 1
            return EventFate.DUPLICATE
        return EventFate.DELIVER

    def breaks_stream(self) -> bool:
        if self.watch_break <= 0:
            return False
        broken = self.rng.random() < self.watch_break
        if broken:
            self.counts["watch-break"] += 1
        return broken

    def expires_stream(self) -> bool:
        if self.watch_expire <= 0:
            return False
        expired = self.rng.random() < self.watch_expire
        if expired:
            self.counts["watch-expire"] += 1
        return expired

    def event_delay(self) -> float:
        return self.rng.uniform(0.0, self.watch_delay) if self.watch_delay > 0 else 0.0
