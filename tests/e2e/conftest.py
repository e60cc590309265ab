"""Fixtures of the chaos tests: a replayable seed and a watch that records every decision."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from headroom_dev import invariants
from headroom_dev.apply import api_client as api_client_for
from headroom_dev.apply import install_crds
from headroom_dev.controlplane import ControlPlane

CRDS = Path(__file__).resolve().parents[2] / "crds"


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


@pytest.fixture(scope="module")
def controllers_api(controllers_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """An admin client of the plane with controllers, its CRDs installed."""
    api = api_client_for(controllers_plane.kubeconfig)
    install_crds(api, sorted(CRDS.glob("*.yaml")))
    yield api
    api.close()
