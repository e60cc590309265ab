"""ResourceClaims and device-plugin pods into the ledger: ordering against the watch, a
cluster without DRA, and the wake-up of waiting reservations when a holder goes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from headroom.api.paths import RESOURCE_CLAIMS
from headroom.control.podrequests import PodRequestsFeed
from headroom.control.resourceclaims import ResourceClaims
from headroom.kube.transport import JSON, ApiError, Transport
from tests.unit.test_inventory_control import NOW, World, a_node, a_slice

GIB = 1024


class Lister:
    """Lists ResourceClaims (None: not served, 404) and nothing else."""

    def __init__(self) -> None:
        self.claims: list[JSON] | None = None

    async def list_page(self, path: str, **_: Any) -> JSON:
        if path != RESOURCE_CLAIMS or self.claims is None:
            raise ApiError(404, "NotFound", f"the server could not find {path}")
        return {"metadata": {"resourceVersion": "9"}, "items": self.claims}


def allocated(name: str, device: str, pool: str = "s1") -> JSON:
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": device}
    return {
        "metadata": {"namespace": "ml", "name": name},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def bound(name: str, node: str, gpus: str) -> JSON:
    limits = {"nvidia.com/gpu": gpus}
    container = {"name": "main", "resources": {"limits": limits, "requests": {"memory": "1Gi"}}}
    return {
        "metadata": {"namespace": "ml", "name": name},
        "spec": {"nodeName": node, "containers": [container]},
    }


class Feeds:
    def __init__(self, config: str = "") -> None:
        self.world = World(config)
        self.world.nodes.on_event(None, a_node("n1"))
        self.world.slices.on_slice("ADDED", a_slice("s1", "n1", ["80Gi", "80Gi"]))
        self.lister = Lister()
        self.woken = 0
        self.claims = ResourceClaims(
            self.world.state,
            cast(Transport, self.lister),
            self.world.clock,
            drivers=self.world.config.gpus.dra_drivers,
            changed=self.wake,
        )
        self.pods = PodRequestsFeed(
            self.world.state,
            cast(Transport, self.lister),
            self.world.clock,
            changed=self.wake,
            memory=self.world.config.pod_requests == "subtract",
            gpu_resources=self.world.config.gpus.device_plugin_resources,
        )

    def wake(self) -> None:
        self.woken += 1

    def free(self) -> list[int | None]:
        devices = self.world.state.ledger.node_summary("n1", NOW).devices or ()
        return [room.free_mb for room in devices]


def test_a_claim_takes_its_device_and_a_stale_list_does_not_bring_it_back() -> None:
    feeds = Feeds()
    state = feeds.world.state
    state.take_room()  # none marked yet
    feeds.claims.on_claim("ADDED", allocated("c", "s1-0"))
    assert feeds.free() == [0, 80 * GIB]
    assert feeds.woken == 1
    listed_at = feeds.world.clock.at
    feeds.world.clock.at += 1
    feeds.claims.on_claim("DELETED", allocated("c", "s1-0"))
    assert feeds.free() == [80 * GIB, 80 * GIB]
    assert "n1" in state.take_room()  # a waiting reservation may fit now
    feeds.claims.on_claim(None, allocated("c", "s1-0"), listed_at=listed_at)  # older
    assert feeds.free() == [80 * GIB, 80 * GIB]
    # Another driver's claim, or one not allocated, holds nothing and wakes no one.
    woken = feeds.woken
    other = allocated("o", "s1-1")
    other["status"]["allocation"]["devices"]["results"][0]["driver"] = "example.com"
    feeds.claims.on_claim("ADDED", other)
    feeds.claims.on_claim("ADDED", {"metadata": {"namespace": "ml", "name": "u"}})
    assert (feeds.free(), feeds.woken) == ([80 * GIB, 80 * GIB], woken)


def test_without_dra_one_warning_then_a_resync_finds_the_claims(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        feeds = Feeds()
        with caplog.at_level(logging.WARNING):
            assert await feeds.claims.take_listed() is None
            await feeds.claims.resync()
        assert len([r for r in caplog.records if "does not serve" in r.message]) == 1
        follower = asyncio.create_task(feeds.claims.follow(None))
        await asyncio.sleep(0)
        assert not follower.done()  # waits for a list that succeeds
        follower.cancel()
        feeds.lister.claims = [allocated("c", "s1-1")]
        await feeds.claims.resync()
        assert feeds.free() == [80 * GIB, 0]
        feeds.lister.claims = []
        feeds.world.clock.at += 1
        await feeds.claims.resync()  # gone from the list, no watch event since: gone
        assert feeds.free() == [80 * GIB, 80 * GIB]

    asyncio.run(scenario())


def test_device_plugin_pods_count_with_pod_requests_ignored_and_free_when_they_end() -> None:
    feeds = Feeds("podRequests: ignore")
    feeds.pods.on_event("ADDED", bound("cuda", "n1", "1"))
    assert feeds.free() == [0, 80 * GIB]  # the emptiest, ties by id
    assert feeds.world.state.ledger.node_summary("n1", NOW).pod_requests_mb == 0
    done = bound("cuda", "n1", "1")
    done["status"] = {"phase": "Succeeded"}
    feeds.pods.on_event("MODIFIED", done)
    assert feeds.free() == [80 * GIB, 80 * GIB]
    feeds.pods.on_event("ADDED", bound("two", "n1", "2"))
    assert feeds.free() == [0, 0]
    feeds.pods.on_event("DELETED", bound("two", "n1", "2"))
    assert feeds.free() == [80 * GIB, 80 * GIB]


def test_no_resources_configured_no_gpus_counted() -> None:
    feeds = Feeds("gpus: {devicePluginResources: []}")
    feeds.pods.on_event("ADDED", bound("cuda", "n1", "1"))
    assert feeds.free() == [80 * GIB, 80 * GIB]
    assert feeds.world.state.ledger.node_summary("n1", NOW).pod_requests_mb == 1024


def test_a_list_asked_for_before_a_pods_deletion_does_not_bring_it_back() -> None:
    feeds = Feeds()
    listed_at = feeds.world.clock.at
    feeds.world.clock.at += 1
    feeds.pods.on_event("ADDED", bound("cuda", "n1", "1"))
    feeds.world.clock.at += 1
    feeds.pods.on_event("DELETED", bound("cuda", "n1", "1"))
    feeds.pods.on_event(None, bound("cuda", "n1", "1"), listed_at=listed_at)  # older page
    assert feeds.free() == [80 * GIB, 80 * GIB]


def test_a_pod_no_reader_expects_is_skipped_and_the_others_still_count() -> None:
    feeds = Feeds()
    odd = bound("odd", "n1", "²")  # str.isdigit() takes it; int() does not
    feeds.pods.on_event("ADDED", odd)
    feeds.pods.on_event(
        "ADDED", {**bound("odd2", "n1", "1"), "spec": {"nodeName": "n1", "containers": 5}}
    )
    assert feeds.free() == [80 * GIB, 80 * GIB]
    feeds.pods.on_event("ADDED", bound("cuda", "n1", "1"))
    assert feeds.free() == [0, 80 * GIB]
