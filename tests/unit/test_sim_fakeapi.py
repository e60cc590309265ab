"""The fake API server's own semantics, on the virtual loop.

What the real server does is pinned by ``tests/integration/test_fake_api_contract.py``
(same scenarios, both servers); these are the fake's details the real server
cannot be asked about cheaply: history windows, bookmark timing, copies,
resourceVersion bookkeeping, the driver's controls. JSON patches and selectors
are in ``test_sim_fakeapi_json.py``, faults, pauses and kills in
``test_sim_fakeapi_faults.py``, a toy controller in a seeded storm in
``test_sim_storm.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, list_all, resource_path
from headroom_dev.sim.fakeapi import FakeApiServer, FakeClient
from headroom_dev.sim.fakeapi.kinds import RESERVATIONS
from headroom_dev.sim.loop import DEFAULT_EPOCH, run_virtual

T = TypeVar("T")
NS = "ml"
RSV = resource_path("headroom.dev", "v1alpha1", "reservations", NS)
ALL_RSV = resource_path("headroom.dev", "v1alpha1", "reservations")
NODES = resource_path("", "v1", "nodes")


def simulate(
    scenario: Callable[[FakeApiServer, FakeClient], Awaitable[T]], **server_options: Any
) -> T:
    async def main() -> T:
        server = FakeApiServer(seed=3, **server_options)
        server.ensure_namespace(NS)
        return await scenario(server, server.client("operator"))

    return run_virtual(main(), max_virtual_seconds=3600)


def body(name: str, ram_mb: int = 10, **labels: str) -> JSON:
    return {
        "apiVersion": "headroom.dev/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name, "labels": labels},
        "spec": {"node": "n1", "ramMB": ram_mb},
    }


def now() -> float:
    return asyncio.get_running_loop().time()


# -- objects -------------------------------------------------------------------------------


def test_versions_uids_and_timestamps() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        start = server.resource_version
        a = await api.create(RSV, body("a"))
        await asyncio.sleep(1.5)
        node = server.put_node("n1", 1024)
        b = await api.create(RSV, body("b"))
        assert a["metadata"]["creationTimestamp"] == "2030-01-01T00:00:00Z"
        assert b["metadata"]["creationTimestamp"] == "2030-01-01T00:00:01Z"  # seconds, truncated
        versions = [int(o["metadata"]["resourceVersion"]) for o in (a, node, b)]
        assert versions == [start + 1, start + 2, start + 3]  # one counter for every kind
        assert a["metadata"]["uid"] != b["metadata"]["uid"]
        assert len(a["metadata"]["uid"]) == 36
        await api.create(
            resource_path("", "v1", "events", NS),
            {"metadata": {"generateName": "a."}, "involvedObject": {"kind": "Reservation"}},
        )
        assert server.resource_version == start + 4  # Events take a revision too

    simulate(scenario)


def test_the_same_seed_gives_the_same_uids_and_generated_names() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> list[str]:
        named = body("")
        del named["metadata"]["name"]
        named["metadata"]["generateName"] = "g-"
        created = [await api.create(RSV, named) for _ in range(3)]
        return [c["metadata"]["name"] + c["metadata"]["uid"] for c in created]

    assert simulate(scenario) == simulate(scenario)


def test_returned_objects_never_alias_the_store() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        sent = body("a", app="x")
        created = await api.create(RSV, sent)
        sent["spec"]["ramMB"] = 999
        created["spec"]["ramMB"] = 998
        fetched = await api.get(f"{RSV}/a")
        fetched["metadata"]["labels"]["app"] = "y"
        listed = (await api.list_page(RSV))["items"][0]
        listed["spec"]["node"] = "elsewhere"
        watch = api.watch(RSV, resource_version="0", timeout_seconds=1)
        event = await anext(watch)
        event["object"]["spec"]["ramMB"] = 997
        await watch.aclose()
        stored = server.get(f"{RSV}/a")
        assert stored is not None
        assert stored["spec"] == {"node": "n1", "ramMB": 10, "vramMB": 0}
        assert stored["metadata"]["labels"] == {"app": "x"}

    simulate(scenario)


def test_a_write_that_changes_nothing_takes_no_revision_and_tells_no_one() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        seen: list[str] = []
        server.subscribe(lambda type_, obj: seen.append(type_))
        created = await api.create(RSV, body("a", app="x"))
        version = created["metadata"]["resourceVersion"]
        watch = api.watch(RSV, resource_version=version, timeout_seconds=5)
        for change in ({"metadata": {"labels": {"app": "x"}}}, {"status": {"phase": "Admitted"}}):
            same = await api.merge_patch(f"{RSV}/a", change)
            assert same["metadata"]["resourceVersion"] == version
        assert [e async for e in watch] == []
        assert seen == ["ADDED"]

    simulate(scenario)


def test_generation_counts_spec_changes_only() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        pod = server.create_pod(NS, "p", labels={"headroom.dev/owner": "true"})
        assert pod["metadata"]["generation"] == 1
        pods = resource_path("", "v1", "pods", NS)
        labelled = await api.merge_patch(f"{pods}/p", {"metadata": {"labels": {"a": "b"}}})
        assert labelled["metadata"]["generation"] == 1
        status = await api.merge_patch(f"{pods}/p/status", {"status": {"phase": "Running"}})
        assert status["metadata"]["generation"] == 1
        # (spec.nodeName cannot be patched: a pod's spec changes only where the API
        # server allows it, as podrules has it; a container image may change)
        image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "sim:2"}]
        respec = await api.json_patch(f"{pods}/p", image)
        assert respec["metadata"]["generation"] == 2
        rsv = await api.create(RSV, body("a"))
        decided = await api.merge_patch(f"{RSV}/a/status", {"status": {"phase": "Admitted"}})
        assert rsv["metadata"]["generation"] == decided["metadata"]["generation"] == 1

    simulate(scenario)


def test_subscribers_see_every_mutation_as_it_happens_and_their_errors_are_kept() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        seen: list[tuple[str, str, str | None]] = []

        def checker(type_: str, obj: JSON) -> None:
            seen.append((type_, obj["metadata"]["name"], (obj.get("status") or {}).get("phase")))
            if obj["metadata"]["name"] == "bad":
                raise AssertionError("an invariant broke")

        unsubscribe = server.subscribe(checker)
        await api.create(RSV, body("a"))
        assert seen == [("ADDED", "a", None)]  # synchronous: before the answer returns
        await api.merge_patch(f"{RSV}/a/status", {"status": {"phase": "Admitted"}})
        await api.create(RSV, body("bad"))  # the operator never sees the checker's failure
        await api.delete(f"{RSV}/a")
        unsubscribe()
        await api.delete(f"{RSV}/bad")
        assert seen == [
            ("ADDED", "a", None),
            ("MODIFIED", "a", "Admitted"),
            ("ADDED", "bad", None),
            ("DELETED", "a", "Admitted"),
        ]
        assert [str(e) for e in server.listener_errors] == ["an invariant broke"]

    simulate(scenario)


def test_events_are_counted_and_only_the_last_few_kept() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        events = resource_path("", "v1", "events", NS)
        for i in range(5):
            await api.create(
                events,
                {
                    "metadata": {"generateName": "a."},
                    "involvedObject": {"kind": "Reservation", "name": "a", "namespace": NS},
                    "reason": "Admitted" if i < 4 else "Reclaimed",
                    "message": f"event {i}",
                    "type": "Normal",
                },
            )
        assert server.events.count == 5
        assert server.events.by_reason == {"Admitted": 4, "Reclaimed": 1}
        kept = server.events.about("Reservation", NS, "a")
        assert [e.message for e in kept] == ["event 2", "event 3", "event 4"]
        assert server.events.about("Reservation", NS, "b") == []
        with pytest.raises(ApiError) as refused:
            await api.get(f"{events}/a.xxxxx")  # not stored
        assert refused.value.status == 404

    simulate(scenario, events_kept=3)


def test_the_drivers_controls() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        gpu = {"nvidia.com/gpu.memory": "16000", "nvidia.com/gpu.count": "2"}
        created = server.put_node("n1", 32768, labels=gpu)
        assert created["status"]["allocatable"]["memory"] == "32768Mi"
        assert created["metadata"]["labels"] == gpu
        resized = server.put_node("n1", "16Gi", allocatable="15Gi", labels={"extra": "1"})
        assert resized["status"]["capacity"]["memory"] == "16Gi"
        assert resized["status"]["allocatable"]["memory"] == "15Gi"
        assert resized["metadata"]["labels"] == {**gpu, "extra": "1"}
        assert [n["metadata"]["name"] for n in server.nodes()] == ["n1"]
        server.delete_node("n1")
        assert server.nodes() == []

        rsv = server.create_reservation("team-b", "r", "n1", 4096, vram_mb=100, owner={"pod": "p"})
        assert rsv["spec"] == {"node": "n1", "ramMB": 4096, "vramMB": 100, "owner": {"pod": "p"}}
        await asyncio.sleep(2.25)
        beat = server.heartbeat("team-b", "r")
        assert beat["metadata"]["annotations"] == {
            "headroom.dev/heartbeat": "2030-01-01T00:00:02.250000Z"
        }
        server.create_pod("team-b", "p", labels={"headroom.dev/owner": "true"})
        server.heartbeat_pod("team-b", "p", at=DEFAULT_EPOCH)
        assert server.pods("team-b")[0]["metadata"]["annotations"] == {
            "headroom.dev/heartbeat": "2030-01-01T00:00:00.000000Z"
        }
        server.delete_reservation("team-b", "r", uid=rsv["metadata"]["uid"])
        server.delete_pod("team-b", "p")
        assert server.reservations() == []
        assert server.get(f"{RSV}/nope") is None
        with pytest.raises(ApiError):  # the driver's controls are not faulted, but checked
            server.create_reservation(NS, "bad", "n1", 0)

    simulate(scenario)


# -- LIST ------------------------------------------------------------------------------------


def test_continue_tokens_expire_with_compaction_and_eviction() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        for i in range(6):
            await api.create(RSV, body(f"r{i}"))
        first = await api.list_page(RSV, limit=2)
        assert first["metadata"]["remainingItemCount"] == 4
        tokens = [(await api.list_page(RSV, limit=1))["metadata"]["continue"] for _ in range(2)]
        with pytest.raises(ApiError) as evicted:  # only 2 tokens are kept
            await api.list_page(RSV, limit=2, continue_token=first["metadata"]["continue"])
        assert (evicted.value.status, evicted.value.reason) == (410, "Expired")
        await api.list_page(RSV, continue_token=tokens[1])
        server.create_reservation(NS, "later", "n1", 1)
        server.compact()  # etcd compaction at a revision after the token's
        with pytest.raises(ApiError) as compacted:
            await api.list_page(RSV, continue_token=tokens[1])
        assert compacted.value.status == 410
        items, version = await list_all(api, ALL_RSV, limit=4)
        assert len(items) == 7
        assert int(version) == server.resource_version

    simulate(scenario, continue_tokens_kept=2)


# -- WATCH ------------------------------------------------------------------------------------


async def drain(api: FakeClient, path: str, version: str, **options: Any) -> list[tuple[Any, ...]]:
    """(virtual time, type, name, resourceVersion) of every event until the watch ends."""
    return [
        (
            now(),
            event["type"],
            event["object"]["metadata"].get("name"),
            event["object"]["metadata"].get("resourceVersion"),
        )
        async for event in api.watch(path, resource_version=version, **options)
    ]


def test_a_watch_from_zero_starts_with_what_exists() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        await api.create(RSV, body("b"))
        await api.create(RSV, body("a"))
        asyncio.get_running_loop().call_later(1, server.delete_reservation, NS, "a")
        events = await drain(api, RSV, "0", timeout_seconds=2)
        assert [(t, n) for _, t, n, _ in events] == [
            ("ADDED", "a"),
            ("ADDED", "b"),
            ("DELETED", "a"),
        ]
        assert events[-1][0] == 1.0

    simulate(scenario)


def test_a_watch_from_beyond_the_history_window_gets_410() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        first = await api.create(RSV, body("a"))
        for i in range(3):
            await api.merge_patch(f"{RSV}/a", {"metadata": {"labels": {"i": str(i)}}})
        # 4 changes, 3 kept: the create is gone, so a watch that needs it is too old...
        too_old = str(int(first["metadata"]["resourceVersion"]) - 1)
        events = [e async for e in api.watch(RSV, resource_version=too_old, timeout_seconds=9)]
        assert [(e["type"], e["object"]["code"], e["object"]["reason"]) for e in events] == [
            ("ERROR", 410, "Expired")
        ]
        # ...and one from the create on needs only what is kept
        kept = first["metadata"]["resourceVersion"]
        assert len(await drain(api, RSV, kept, timeout_seconds=1)) == 3
        server.compact()
        events = [e async for e in api.watch(RSV, resource_version=kept, timeout_seconds=9)]
        assert events[0]["type"] == "ERROR"
        current = str(server.resource_version)
        assert await drain(api, RSV, current, timeout_seconds=1) == []

    simulate(scenario, history_limit=3)


def test_expired_watch_as_api_error_raises_on_the_first_read() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        with pytest.raises(ApiError) as expired:
            await anext(api.watch(RSV, resource_version="1"))
        assert (expired.value.status, expired.value.reason) == (410, "Expired")
        assert expired.value.gone

    simulate(scenario, expired_watch="api_error")


def test_a_namespaced_watch_sees_only_its_namespace() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        version = str(server.resource_version)
        server.create_reservation(NS, "mine", "n1", 1)
        server.create_reservation("other", "theirs", "n1", 1)
        mine = await drain(api, RSV, version, timeout_seconds=1)
        everyone = await drain(api, ALL_RSV, version, timeout_seconds=1)
        assert [n for _, _, n, _ in mine] == ["mine"]
        assert [n for _, _, n, _ in everyone] == ["mine", "theirs"]

    simulate(scenario)


def test_bookmarks_come_every_interval_and_before_the_timeout_when_the_version_moved() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        loop = asyncio.get_running_loop()
        version = str(server.resource_version)
        loop.call_later(5, server.create_reservation, NS, "a", "n1", 1)
        loop.call_later(12, server.put_node, "n1")  # another kind: only the version moves
        loop.call_later(31, server.put_node, "n2")
        events = await drain(api, RSV, version, timeout_seconds=35)
        after_a = str(int(version) + 1)
        assert events == [
            (5.0, "ADDED", "a", after_a),
            # t=10: nothing newer than "a" was sent, so no bookmark
            (20.0, "BOOKMARK", None, str(int(version) + 2)),
            # t=30: nothing new; t=33 (2 s before the timeout): n2
            (33.0, "BOOKMARK", None, str(int(version) + 3)),
        ]
        assert loop.time() == 35.0
        assert server.store.watchers[RESERVATIONS] == {}  # the stream ended: unregistered

    simulate(scenario, bookmark_interval=10)


def test_a_closed_or_abandoned_watch_stops_being_fed() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        watchers = server.store.watchers[RESERVATIONS]
        watch = api.watch(RSV, resource_version=str(server.resource_version))
        reader = asyncio.create_task(anext(watch))
        await asyncio.sleep(1)
        assert len(watchers) == 1
        server.create_reservation(NS, "a", "n1", 1)
        assert (await reader)["type"] == "ADDED"
        await watch.aclose()
        assert watchers == {}
        assert [e async for e in watch] == []

        cancelled = api.watch(RSV, resource_version=str(server.resource_version))
        reader = asyncio.create_task(anext(cancelled))
        await asyncio.sleep(1)
        reader.cancel()
        await asyncio.sleep(0)
        assert watchers == {}  # a reader cancelled mid-read hangs up, as aiohttp does

    simulate(scenario)


def test_a_watch_from_a_version_not_reached_yet_gets_only_what_comes_after_it() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        future = str(server.resource_version + 2)
        loop = asyncio.get_running_loop()
        for delay, name in ((1, "a"), (2, "b"), (3, "c")):
            loop.call_later(delay, server.create_reservation, NS, name, "n1", 1)
        events = await drain(api, RSV, future, timeout_seconds=5)
        assert [n for _, _, n, _ in events] == ["c"]

    simulate(scenario)


def test_breaking_every_watch_as_an_api_server_restart_does() -> None:
    async def scenario(server: FakeApiServer, api: FakeClient) -> None:
        other = server.client("other")
        version = str(server.resource_version)
        readers = [
            asyncio.create_task(anext(client.watch(RSV, resource_version=version)))
            for client in (api, other)
        ]
        await asyncio.sleep(1)
        server.break_watches()
        for reader in readers:
            with pytest.raises(ApiUnavailableError):
                await reader
        assert server.store.watchers[RESERVATIONS] == {}

    simulate(scenario)


def test_a_create_reviewed_as_kube_apiserver_calls_a_validating_webhook() -> None:
    """The review sees the object as it would be stored (its uid given, kept once
    stored); a refusal stores nothing; a name taken is found only after an allowed
    review; a dry run is reviewed, given a uid of its own, and stores nothing."""

    async def scenario(server: FakeApiServer, client: FakeClient) -> None:
        seen: list[JSON] = []

        def allow(obj: JSON) -> None:
            seen.append(obj)

        def refuse(obj: JSON) -> None:
            seen.append(obj)
            raise ApiError(403, "Forbidden", "denied")

        stored = server.create_reservation(NS, "r", "n1", 512, review=allow)
        assert seen[-1]["metadata"]["uid"] == stored["metadata"]["uid"]
        assert seen[-1]["metadata"]["creationTimestamp"] == stored["metadata"]["creationTimestamp"]
        with pytest.raises(ApiError) as refused:
            server.create_reservation(NS, "s", "n1", 512, review=refuse)
        assert refused.value.status == 403
        with pytest.raises(ApiError) as taken:
            server.create_reservation(NS, "r", "n1", 512, review=allow)
        assert taken.value.status == 409
        assert seen[-1]["metadata"]["uid"] != stored["metadata"]["uid"]  # reviewed, then 409
        dry = server.create_reservation(NS, "t", "n1", 512, review=allow, dry_run=True)
        assert dry["metadata"]["uid"] == seen[-1]["metadata"]["uid"]
        assert [o["metadata"]["name"] for o in server.reservations(NS)] == ["r"]

    simulate(scenario)
