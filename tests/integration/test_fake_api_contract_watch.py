"""The fake API server against kube-apiserver: WATCH and Events.

As ``test_fake_api_contract.py``: each scenario runs on both servers and must
give the same outcome. Watches end at a short ``timeoutSeconds`` so that the
real side reads everything a watch delivers; kube-apiserver sends bookmarks only
near the end of long watches (a 70 s watch got one at 68.8 s, 5-45 s ones none),
so these accept a bookmark but do not require one.
"""

from __future__ import annotations

import asyncio

import pytest

from headroom.kube.transport import JSON, Transport, list_all, resource_path
from tests.integration.fake_api_contract_support import (
    GROUP,
    VERSION,
    Backend,
    make_backend,
    refusal,
    reservation,
    rsv_path,
    unique,
    watch_until_end,
)


@pytest.fixture(params=["real", "fake"])
def backend(request: pytest.FixtureRequest) -> Backend:
    return make_backend(request)


# -- WATCH --------------------------------------------------------------------------------------


def test_watch_from_a_version_delivers_exactly_the_later_changes(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        await api.create(rsv_path(ns), reservation("a"))
        _, version = await list_all(api, rsv_path(ns))
        b = await api.create(rsv_path(ns), reservation("b"))
        a = await api.merge_patch(rsv_path(ns, "a") + "/status", {"status": {"phase": "Admitted"}})
        await api.merge_patch(rsv_path(ns, "a"), {"metadata": {"annotations": {"q": "1"}}})
        await api.delete(rsv_path(ns, "a"))
        events = await watch_until_end(api, rsv_path(ns), version)
        assert [(t, n) for t, n, _, _ in events] == [
            ("ADDED", "b"),
            ("MODIFIED", "a"),
            ("MODIFIED", "a"),
            ("DELETED", "a"),
        ]
        versions = [int(v) for _, _, v, _ in events]
        assert versions == sorted(versions)
        assert int(version) < versions[0]
        assert versions[0] == int(b["metadata"]["resourceVersion"])
        assert versions[1] == int(a["metadata"]["resourceVersion"])
        # the same, all namespaces, from the version after b: b is not repeated
        later = await watch_until_end(
            api, resource_path(GROUP, VERSION, "reservations"), str(versions[0]), seconds=1
        )
        assert [(t, n) for t, n, _, _ in later if n in ("a", "b")] == [
            ("MODIFIED", "a"),
            ("MODIFIED", "a"),
            ("DELETED", "a"),
        ]

    backend.run(scenario)


def test_label_selector_watch_reports_deleted_when_the_label_goes_and_added_when_back(
    backend: Backend,
) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        for name in ("p0", "p1", "p2"):
            await api.create(rsv_path(ns), reservation(name, grp="p"))
        _, version = await list_all(api, rsv_path(ns))
        await api.merge_patch(rsv_path(ns, "p0"), {"metadata": {"labels": {"grp": None}}})
        await api.merge_patch(rsv_path(ns, "p0"), {"metadata": {"labels": {"grp": "p"}}})
        await api.merge_patch(rsv_path(ns, "p1"), {"metadata": {"labels": {"grp": "q"}}})
        await api.merge_patch(rsv_path(ns, "p1"), {"metadata": {"annotations": {"x": "y"}}})
        await api.delete(rsv_path(ns, "p2"))
        events = await watch_until_end(api, rsv_path(ns), version, selector="grp=p")
        # the DELETED for a label change carries the object as it was (still labelled)
        assert [(t, n, labels) for t, n, _, labels in events] == [
            ("DELETED", "p0", {"grp": "p"}),
            ("ADDED", "p0", {"grp": "p"}),
            ("DELETED", "p1", {"grp": "p"}),
            ("DELETED", "p2", {"grp": "p"}),
        ]
        versions = [int(v) for _, _, v, _ in events]
        assert versions == sorted(versions)
        assert len(set(versions)) == 4

    backend.run(scenario)


def test_a_watch_from_a_version_the_server_no_longer_has_ends_with_410(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        events = [e async for e in api.watch(rsv_path(ns), resource_version="1", timeout_seconds=5)]
        assert len(events) == 1
        assert events[0]["type"] == "ERROR"
        status = events[0]["object"]
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
        assert status["message"].startswith("too old resource version: 1 (")

    backend.run(scenario)


def test_a_quiet_watch_ends_normally_at_its_timeout(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        _, version = await list_all(api, rsv_path(ns))
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await watch_until_end(api, rsv_path(ns), version, seconds=2) == []
        assert 2.0 <= loop.time() - started < 10.0

    backend.run(scenario)


# -- Events -------------------------------------------------------------------------------------


def test_events_are_created_with_a_generated_name(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        created = await api.create(rsv_path(ns), reservation("a"))
        involved = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Reservation",
            "name": "a",
            "uid": created["metadata"]["uid"],
            "namespace": ns,
        }
        body: JSON = {
            "metadata": {"generateName": "a.", "namespace": ns},
            "involvedObject": involved,
            "reason": "Admitted",
            "message": "fits",
            "type": "Normal",
            "source": {"component": "contract"},
            "firstTimestamp": "2030-01-01T00:00:00Z",
            "lastTimestamp": "2030-01-01T00:00:00Z",
            "count": 1,
        }
        event = await api.create(resource_path("", "v1", "events", ns), body)
        assert event["kind"] == "Event"
        assert event["metadata"]["name"].startswith("a.")
        assert len(event["metadata"]["name"]) == len("a.") + 5
        assert int(event["metadata"]["resourceVersion"]) > int(
            created["metadata"]["resourceVersion"]
        )
        body["involvedObject"] = {**involved, "namespace": "elsewhere"}
        assert await refusal(api.create(resource_path("", "v1", "events", ns), body)) == (
            422,
            "Invalid",
        )

    backend.run(scenario)


def test_owner_pod_and_node_watches(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        pods = resource_path("", "v1", "pods", ns)
        nodes = resource_path("", "v1", "nodes")
        node = unique("contract-node")
        _, version = await list_all(api, resource_path("", "v1", "pods"), limit=1)
        owner = {"headroom.dev/owner": "true"}
        spec = {"containers": [{"name": "c", "image": "x"}]}
        await api.create(pods, {"metadata": {"name": "p", "labels": owner}, "spec": spec})
        await api.create(pods, {"metadata": {"name": "q"}, "spec": spec})
        await api.merge_patch(f"{pods}/p", {"metadata": {"annotations": {"beat": "1"}}})
        await api.merge_patch(f"{pods}/p", {"metadata": {"labels": {"headroom.dev/owner": None}}})
        await api.merge_patch(f"{pods}/p", {"metadata": {"labels": owner}})
        deleted = await api.delete(f"{pods}/p")
        await api.create(
            nodes, {"metadata": {"name": node}, "status": {"capacity": {"memory": "1Gi"}}}
        )
        try:
            await api.merge_patch(
                f"{nodes}/{node}/status", {"status": {"capacity": {"memory": "2Gi"}}}
            )
        finally:
            await api.delete(f"{nodes}/{node}")
        pod_events = await watch_until_end(
            api, resource_path("", "v1", "pods"), version, selector="headroom.dev/owner=true"
        )
        assert [(t, n) for t, n, _, _ in pod_events if n in ("p", "q")] == [
            ("ADDED", "p"),
            ("MODIFIED", "p"),
            ("DELETED", "p"),  # the label went
            ("ADDED", "p"),  # and came back
            ("MODIFIED", "p"),  # marked for deletion
            ("DELETED", "p"),
        ]
        assert pod_events[-1][2] == deleted["metadata"]["resourceVersion"]
        assert int(pod_events[-2][2]) == int(deleted["metadata"]["resourceVersion"]) - 1
        assert deleted["metadata"]["generation"] == 2  # a pod's deletion is a spec change
        node_events = await watch_until_end(api, nodes, version, seconds=1)
        assert [(t, n) for t, n, _, _ in node_events if n == node] == [
            ("ADDED", node),
            ("MODIFIED", node),
            ("DELETED", node),
        ]

    backend.run(scenario)
