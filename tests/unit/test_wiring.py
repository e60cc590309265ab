"""The controller's wiring: named signals, each heard, and one declaration per watched kind."""

from __future__ import annotations

import dataclasses

import pytest

from headroom.api.config import OperatorConfig
from headroom.api.paths import NODES, PODS, RESERVATIONS
from headroom.control.controller import Controller
from headroom.control.feeds import WatchedFeed
from headroom.control.signals import Signal, Signals
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.loop import VirtualClock, run_virtual


def test_a_signal_calls_its_listeners_in_order_with_its_arguments() -> None:
    heard: list[tuple[str, str]] = []
    gone: Signal[[str]] = Signal("reservation gone")
    gone.connect(lambda uid: heard.append(("first", uid)))
    gone.connect(lambda uid: heard.append(("second", uid)))
    gone("u1")
    assert heard == [("first", "u1"), ("second", "u1")]


def test_a_listeners_failure_reaches_the_emitter_as_a_direct_call_would() -> None:
    def broken() -> None:
        raise RuntimeError("listener failed")

    changed: Signal[[]] = Signal("capacity changed")
    changed.connect(broken)
    with pytest.raises(RuntimeError, match="listener failed"):
        changed()


def _controller(config: OperatorConfig) -> Controller:
    server = FakeApiServer(seed=1)
    return Controller(config, server.client("operator"), clock=VirtualClock())


def test_every_signal_is_heard_by_some_part() -> None:
    """A signal nobody hears is a change nobody acts on: the wiring is complete."""

    async def scenario() -> None:
        controller = _controller(OperatorConfig())
        for field in dataclasses.fields(Signals):
            signal = getattr(controller.signals, field.name)
            assert signal.listener_count > 0, f"signal {signal.name!r} has no listener"

    run_virtual(scenario(), max_virtual_seconds=5)


def test_each_watched_kind_is_declared_once_and_the_rebuild_order_is_the_safety_order() -> None:
    async def scenario() -> None:
        config = OperatorConfig.model_validate({"podRequests": "subtract"})
        controller = _controller(config)
        names = [feed.name for feed in controller.feeds]
        assert len(names) == len(set(names)), names
        assert names == [
            "nodes",  # taken after the GPU inventory, which is taken as it is listed
            "resourceslices",
            "resourceclaims",
            "namespaces",  # their labels select the quotas
            "headroomquotas",
            "all-pods",  # what pods requested, before any admission is restored
            "pods",  # owner pods before the reservations they keep alive
            "reservations",
            "claims",  # claim pods last: their reservations are known
        ]
        paths = {f.name: f.path for f in controller.feeds if isinstance(f, WatchedFeed)}
        assert paths["nodes"] == NODES
        assert paths["reservations"] == RESERVATIONS
        assert paths["pods"] == paths["claims"] == paths["all-pods"] == PODS

    run_virtual(scenario(), max_virtual_seconds=5)


def test_the_resync_lists_every_feed_once_the_reservations_first() -> None:
    async def scenario() -> None:
        controller = _controller(OperatorConfig.model_validate({"podRequests": "subtract"}))
        order = [feed.name for feed in controller._resync_order()]
        assert sorted(order) == sorted(feed.name for feed in controller.feeds)
        assert order[0] == "reservations"
        assert order[-1] == "all-pods"

    run_virtual(scenario(), max_virtual_seconds=5)
