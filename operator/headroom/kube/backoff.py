"""Capped exponential backoff with jitter, for every retry against the API server.

Jitter matters when many things fail at once (an API server restart): without
it, every retry of every reservation lands on the server in the same instant.
The random source is injected so that the simulation replays exactly.
"""

from __future__ import annotations

import random


class Backoff:
    """Delays base, 2·base, 4·base … up to ``cap``, each drawn from [d/2, d]."""

    def __init__(self, base: float = 0.2, cap: float = 30.0, rng: random.Random | None = None):
        self._base, self._cap = base, cap
        self._rng = rng or random.Random()
        self._attempt = 0

    def next(self) -> float:
        ceiling = min(self._cap, self._base * 2.0 ** min(self._attempt, 32))
        self._attempt += 1
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    def reset(self) -> None:
        self._attempt = 0
