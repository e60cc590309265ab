"""ResourceSlices and Nodes into the ledger: ordering against the watch, a cluster without
DRA, pending pools, and Warnings once per distinct set."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from headroom.api.config import OperatorConfig, parse_config
from headroom.api.gpus import GpuPolicy
from headroom.api.limits import Limits
from headroom.api.paths import NODES, RESERVATIONS, RESOURCE_SLICES
from headroom.api.refs import ObjectRef
from headroom.control.controller import Controller
from headroom.control.nodes import Nodes
from headroom.control.slices import Slices
from headroom.control.state import State
from headroom.kube.events import EventRecorder
from headroom.kube.transport import JSON, ApiError, Transport
from headroom.ledger import Entry, Owner
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.loop import VirtualClock, run_virtual

DRIVER = "gpu.nvidia.com"
NOW = datetime(2026, 12, 5, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.at = 100.0

    def now(self) -> datetime:
        return NOW

    def monotonic(self) -> float:
        return self.at


class Lister:
    """A Transport that only lists ResourceSlices: a page, or 404."""

    def __init__(self) -> None:
        self.items: list[JSON] | None = None  # None: not served

    async def list_page(self, path: str, **_: Any) -> JSON:
        if self.items is None:
            raise ApiError(404, "NotFound", f"the server could not find {path}")
        return {"metadata": {"resourceVersion": "7"}, "items": self.items}


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def record(self, ref: ObjectRef, reason: str, message: str, type_: str = "Normal") -> None:
        self.posted.append((ref.name, reason, message))


def a_slice(
    name: str,
    node: str | None,
    memories: list[str],
    *,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    driver: str = DRIVER,
) -> JSON:
    spec: JSON = {
        "driver": driver,
        "pool": {"name": pool or name, "generation": generation, "resourceSliceCount": count},
        "devices": [
            {
                "name": f"{name}-{i}",
                "attributes": {"uuid": {"string": f"GPU-{name}-{i}"}, "type": {"string": "gpu"}},
                "capacity": {"memory": {"value": memory}},
            }
            for i, memory in enumerate(memories)
        ],
    }
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


def a_node(name: str, **annotations: str) -> JSON:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "annotations": annotations},
        "status": {"allocatable": {"memory": "64Gi"}},
    }


class World:
    def __init__(self, config: str = "") -> None:
        self.config = parse_config(config)
        self.state = State(self.config.limits.to_limits())
        self.clock, self.lister, self.events = Clock(), Lister(), Events()
        self.refreshed: list[set[str]] = []

        async def no_summary(_: str) -> None:
            return None

        self.nodes = Nodes(
            self.state,
            cast(Transport, self.lister),
            cast(EventRecorder, self.events),
            self.clock,
            self.config,
            delete_summary=no_summary,
            changed=lambda: None,
        )

        def refresh(names: set[str]) -> None:
            self.refreshed.append(set(names))
            self.nodes.refresh(names)

        self.slices = Slices(
            self.state,
            cast(Transport, self.lister),
            self.clock,
            drivers=self.config.gpus.dra_drivers,
            refresh=refresh,
        )

    def vram(self, node: str) -> int | None:
        summary = self.state.ledger.node_summary(node, NOW)
        return summary.vram_capacity_mb

    def warnings(self, reason: str) -> list[tuple[str, str, str]]:
        return [posted for posted in self.events.posted if posted[1] == reason]


def test_a_list_older_than_a_watch_event_does_not_undo_it() -> None:
    world = World()
    world.nodes.on_event(None, a_node("n1"))
    world.slices.on_slice("ADDED", a_slice("s1", "n1", ["80Gi"]))
    assert world.vram("n1") == 80 * 1024
    listed_at = world.clock.at
    world.clock.at += 1
    world.slices.on_slice("DELETED", a_slice("s1", "n1", ["80Gi"]))
    world.slices.on_slice("ADDED", a_slice("s2", "n1", ["40Gi"]))
    # A list asked for before those events still shows s1 and not s2.
    world.slices.on_slice(None, a_slice("s1", "n1", ["80Gi"]), listed_at=listed_at)
    assert world.vram("n1") == 40 * 1024
    assert set(world.state.slices) == {"s2"}


def test_a_slice_moving_node_and_ignored_slices() -> None:
    world = World()
    for name in ("n1", "n2"):
        world.nodes.on_event(None, a_node(name))
    world.slices.on_slice("ADDED", a_slice("s", "n1", ["80Gi"]))
    world.slices.on_slice("MODIFIED", a_slice("s", "n2", ["80Gi", "80Gi"]))
    assert world.refreshed[-1] == {"n1", "n2"}
    assert (world.vram("n1"), world.vram("n2")) == (None, 160 * 1024)
    world.slices.on_slice("ADDED", a_slice("everywhere", None, ["80Gi"]))  # allNodes
    world.slices.on_slice("ADDED", a_slice("other", "n1", ["80Gi"], driver="example.com"))
    assert set(world.state.slices) == {"s"}
    assert world.vram("n1") is None


def test_without_dra_one_warning_then_a_resync_finds_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        world = World()
        world.nodes.on_event(None, a_node("n1"))
        with caplog.at_level(logging.WARNING):
            assert await world.slices.take_listed() is None
            await world.slices.resync()
            await world.slices.resync()
        assert len([r for r in caplog.records if "does not serve" in r.message]) == 1
        follower = asyncio.create_task(world.slices.follow(None))
        await asyncio.sleep(0)
        assert not follower.done()  # waits for a list that succeeds
        follower.cancel()
        world.lister.items = [a_slice("s1", "n1", ["80Gi"])]
        await world.slices.resync()
        assert world.vram("n1") == 80 * 1024
        world.lister.items = []
        world.clock.at += 1
        await world.slices.resync()  # gone from the list, no watch event since: gone
        assert world.vram("n1") is None

    asyncio.run(scenario())


def test_no_drivers_no_list() -> None:
    async def scenario() -> None:
        world = World("gpus: {draDrivers: []}")
        world.lister.items = [a_slice("s1", "n1", ["80Gi"])]
        assert await world.slices.take_listed() is None
        assert world.state.slices == {}

    asyncio.run(scenario())


def test_a_pool_mid_update_keeps_the_last_inventory_without_a_warning() -> None:
    world = World()
    world.nodes.on_event(None, a_node("n1"))
    world.slices.on_slice("ADDED", a_slice("g1", "n1", ["40Gi"], pool="p"))
    assert world.vram("n1") == 40 * 1024
    world.slices.on_slice("ADDED", a_slice("g2a", "n1", ["80Gi"], pool="p", generation=2, count=2))
    assert world.vram("n1") == 40 * 1024
    world.nodes.on_event("MODIFIED", a_node("n1"))  # a Node event meanwhile changes nothing
    assert world.vram("n1") == 40 * 1024
    world.slices.on_slice("ADDED", a_slice("g2b", "n1", ["80Gi"], pool="p", generation=2, count=2))
    assert world.vram("n1") == 160 * 1024
    assert world.warnings("BadGpuInventory") == []


def test_bad_inventory_warns_once_per_distinct_set_and_enforces_nothing() -> None:
    world = World()
    world.nodes.on_event(None, a_node("n1"))
    bad = a_slice("s1", "n1", ["80Gi"], count=1)
    twin = a_slice("s2", "n1", ["80Gi"], pool="s1", count=1)  # 2 slices, count 1
    world.slices.on_slice("ADDED", bad)
    world.slices.on_slice("ADDED", twin)
    world.nodes.on_event("MODIFIED", a_node("n1"))
    [(node, _, message)] = world.warnings("BadGpuInventory")
    assert node == "n1"
    assert "resourceSliceCount is 1" in message
    assert message.endswith("VRAM not enforced")
    assert world.vram("n1") is None
    world.slices.on_slice("DELETED", twin)
    assert world.vram("n1") == 80 * 1024
    world.slices.on_slice("ADDED", twin)
    assert len(world.warnings("BadGpuInventory")) == 2  # it came back: warned again


def test_devices_gone_under_a_claim_warn_overcommitted_once() -> None:
    world = World()
    world.nodes.on_event(None, a_node("n1"))
    world.slices.on_slice("ADDED", a_slice("s1", "n1", ["80Gi"]))
    world.slices.on_slice("ADDED", a_slice("s2", "n1", ["80Gi"]))
    entry = Entry("ns/a", "n1", 16, NOW, NOW, vram_mb=60 * 1024, owner=Owner(pod="p"))
    assert world.state.ledger.reserve(entry, NOW).admitted
    assert entry.devices == {"GPU-s1-0": 60 * 1024}  # binpack, ties to the smaller id
    world.slices.on_slice("DELETED", a_slice("s1", "n1", ["80Gi"]))
    world.nodes.on_event("MODIFIED", a_node("n1"))
    [(node, _, message)] = world.warnings("OverCommitted")
    assert node == "n1"
    assert "no longer in the inventory" in message
    assert world.state.ledger.get("ns/a") is not None  # nothing reclaimed


def test_node_annotations_set_the_policy_the_ledger_uses() -> None:
    world = World("limits: {gpuPolicy: binpack}")
    world.nodes.on_event(None, a_node("n1", **{"headroom.dev/gpu-policy": "spread"}))
    assert world.state.ledger.limits_for("n1").gpu_policy == GpuPolicy.SPREAD
    assert world.state.ledger.limits_for("n1") != Limits()


class Recording:
    """A transport that notes the paths listed, in order, and passes everything on."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.listed = inner, []

    async def list_page(self, path: str, **kwargs: Any) -> JSON:
        self.listed.append(path)
        result: JSON = await self.inner.list_page(path, **kwargs)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_the_rebuild_reads_slices_after_nodes_and_before_reservations() -> None:
    """No reservation is restored or decided before its node's devices are known; an API
    server without resource.k8s.io/v1 (the fake: 404) does not stop the rebuild."""

    async def scenario() -> None:
        server = FakeApiServer(seed=3)
        server.put_node("n1", memory=8192)
        server.create_reservation("ns", "r", "n1", 1024)
        transport = Recording(server.client("operator"))
        controller = Controller(
            OperatorConfig(), cast(Transport, transport), clock=VirtualClock(), follow_watches=False
        )
        versions = await controller.rebuild()
        assert versions["resourceslices"] is None  # not served: the watch waits for a resync
        order = [p for p in transport.listed if p in (NODES, RESOURCE_SLICES, RESERVATIONS)]
        assert order == [NODES, RESOURCE_SLICES, RESERVATIONS]
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=60)
