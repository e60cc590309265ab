"""Fixtures of the chaos tests: a replayable seed and a watch that records every decision."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest
from kubernetes import client

from headroom_dev import invariants


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("HEADROOM_CHAOS_SEED", random.randrange(2**32)))
    print(f"chaos seed: {value} (replay with HEADROOM_CHAOS_SEED={value})")
    return value


@pytest.fixture
def history(custom: client.CustomObjectsApi) -> Iterator[invariants.History]:
    watcher = invariants.History(custom)
    watcher.start()
    yield watcher
    watcher.stop()
