"""The fake API server against kube-apiserver: the same calls, the same outcomes.

Every test here runs twice, once on the real control plane (through
``KubeClient``, the admin certificate and the installed CRDs) and once on
``headroom_dev.sim.fakeapi`` on the virtual loop, and asserts the same literal
outcomes on both. A fake that passes its own unit tests but answers differently
from the real server would make the simulation prove the wrong thing; this file
and ``test_fake_api_contract_watch.py`` keep it honest. When kube-apiserver
changes behaviour, these fail on the ``real`` side first.

This file: objects, patches, the status subresource, schema, DELETE, PUT, LIST.
"""

from __future__ import annotations

import contextlib

import pytest

from headroom.kube.transport import JSON, ApiError, Transport, list_all, resource_path
from tests.integration.fake_api_contract_support import (
    GROUP,
    JSON_PATCH_REJECTED,
    VERSION,
    Backend,
    make_backend,
    refusal,
    reservation,
    rsv_path,
    unique,
)


@pytest.fixture(params=["real", "fake"])
def backend(request: pytest.FixtureRequest) -> Backend:
    return make_backend(request)


# -- create, get, 404, 409 ------------------------------------------------------------------


def test_create_get_conflict_and_not_found(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        body = reservation("a")
        body["status"] = {"phase": "Admitted"}  # dropped: status is a subresource
        body["spec"]["bogus"] = 1  # pruned: not in the schema
        created = await api.create(rsv_path(ns), body)
        metadata = created["metadata"]
        assert metadata["name"] == "a"
        assert metadata["namespace"] == ns
        assert metadata["generation"] == 1
        assert int(metadata["resourceVersion"]) > 0
        assert len(metadata["creationTimestamp"]) == 20  # 2030-01-01T00:00:00Z
        assert created["spec"] == {"node": "node-1", "ramMB": 10, "vramMB": 0}  # defaulted
        assert "status" not in created
        fetched = await api.get(rsv_path(ns, "a"))
        assert {k: fetched[k] for k in ("spec", "kind", "apiVersion")} == {
            "spec": created["spec"],
            "kind": "Reservation",
            "apiVersion": f"{GROUP}/{VERSION}",
        }
        assert fetched["metadata"]["uid"] == metadata["uid"]
        assert fetched["metadata"]["resourceVersion"] == metadata["resourceVersion"]
        assert await refusal(api.create(rsv_path(ns), reservation("a"))) == (409, "AlreadyExists")
        assert await refusal(api.get(rsv_path(ns, "zz"))) == (404, "NotFound")
        assert await refusal(api.create(rsv_path("no-such-ns"), reservation("a"))) == (
            404,
            "NotFound",
        )
        nameless = reservation("x")
        del nameless["metadata"]["name"]
        assert await refusal(api.create(rsv_path(ns), nameless)) == (422, "Invalid")
        upper = reservation("Upper")
        assert await refusal(api.create(rsv_path(ns), upper)) == (422, "Invalid")
        versioned = reservation("v")
        versioned["metadata"]["resourceVersion"] = "5"
        assert await refusal(api.create(rsv_path(ns), versioned)) == (500, "")
        kindless = reservation("y")
        del kindless["kind"]
        assert await refusal(api.create(rsv_path(ns), kindless)) == (400, "BadRequest")
        nameless["metadata"]["generateName"] = "g-"
        generated = await api.create(rsv_path(ns), nameless)
        name = generated["metadata"]["name"]
        assert name.startswith("g-")
        assert len(name) == len("g-") + 5
        assert generated["metadata"]["generateName"] == "g-"
        other = ns + "-other"
        mismatched = reservation("z")
        mismatched["metadata"]["namespace"] = other
        assert await refusal(api.create(rsv_path(ns), mismatched)) == (400, "BadRequest")

    backend.run(scenario)


def test_schema_validation_refuses_what_the_crd_refuses(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        assert await refusal(api.create(rsv_path(ns), reservation("neg", ram_mb=-1))) == (
            422,
            "Invalid",
        )
        # CEL: at least one of ramMB and vramMB above 0
        assert await refusal(api.create(rsv_path(ns), reservation("zero", ram_mb=0))) == (
            422,
            "Invalid",
        )
        bad_node = reservation("bad-node")
        bad_node["spec"]["node"] = "Not_A_Node"
        assert await refusal(api.create(rsv_path(ns), bad_node)) == (422, "Invalid")
        await api.create(rsv_path(ns), reservation("ok"))
        status = rsv_path(ns, "ok") + "/status"
        assert await refusal(api.merge_patch(status, {"status": {"message": "no phase"}})) == (
            422,
            "Invalid",
        )
        assert await refusal(api.merge_patch(status, {"status": {"phase": "Bogus"}})) == (
            422,
            "Invalid",
        )
        written = await api.merge_patch(status, {"status": {"phase": "Pending", "extra": 1}})
        assert written["status"] == {"phase": "Pending"}  # pruned

    backend.run(scenario)


# -- patches and the status subresource ------------------------------------------------------


def test_failed_json_patch_test_is_422_invalid(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        created = await api.create(rsv_path(ns), reservation("a"))
        uid = created["metadata"]["uid"]
        status_path = rsv_path(ns, "a") + "/status"
        decision = {"op": "add", "path": "/status", "value": {"phase": "Admitted"}}
        wrong = [{"op": "test", "path": "/metadata/uid", "value": "another-uid"}, decision]
        assert await refusal(api.json_patch(status_path, wrong)) == JSON_PATCH_REJECTED
        missing = [{"op": "test", "path": "/status/phase", "value": "Admitted"}]
        assert await refusal(api.json_patch(status_path, missing)) == JSON_PATCH_REJECTED
        remove = [{"op": "remove", "path": "/metadata/labels/nope"}]
        assert await refusal(api.json_patch(rsv_path(ns, "a"), remove)) == JSON_PATCH_REJECTED
        no_parent = [{"op": "add", "path": "/status/phase", "value": "Admitted"}]
        assert await refusal(api.json_patch(status_path, no_parent)) == JSON_PATCH_REJECTED
        unknown_op = [{"op": "frobnicate", "path": "/status"}]
        assert await refusal(api.json_patch(status_path, unknown_op)) == JSON_PATCH_REJECTED
        test_ok = [{"op": "test", "path": "/metadata/uid", "value": uid}]
        gone = rsv_path(ns, "zz") + "/status"
        assert await refusal(api.json_patch(gone, test_ok)) == (404, "NotFound")
        # nothing above was applied
        unchanged = await api.get(rsv_path(ns, "a"))
        assert unchanged["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]

        written = await api.json_patch(status_path, [*test_ok, decision])
        assert written["status"] == {"phase": "Admitted"}
        test_phase = [{"op": "test", "path": "/status/phase", "value": "Admitted"}]
        await api.json_patch(status_path, test_phase)
        # JSON pointer escaping: "/" in a key is ~1
        escaped = [
            {"op": "add", "path": "/metadata/annotations", "value": {}},
            {"op": "add", "path": "/metadata/annotations/headroom.dev~1heartbeat", "value": "1"},
            # replace of a missing member adds it, on kube-apiserver
            {"op": "replace", "path": "/metadata/annotations/new", "value": "3"},
        ]
        annotated = await api.json_patch(rsv_path(ns, "a"), escaped)
        assert annotated["metadata"]["annotations"] == {"headroom.dev/heartbeat": "1", "new": "3"}
        # keys are validated: "~" is no annotation key
        tilde = [{"op": "add", "path": "/metadata/annotations/tilde~0key", "value": "2"}]
        assert await refusal(api.json_patch(rsv_path(ns, "a"), tilde)) == (422, "Invalid")
        bad_label = {"metadata": {"labels": {"ok": "not ok!"}}}
        assert await refusal(api.merge_patch(rsv_path(ns, "a"), bad_label)) == (422, "Invalid")
        not_a_string = {"metadata": {"labels": {"ok": 1}}}
        assert await refusal(api.merge_patch(rsv_path(ns, "a"), not_a_string)) == (
            422,
            "Invalid",
        )
        labelled = reservation("b")
        labelled["metadata"]["labels"] = {"ok": 1}
        assert await refusal(api.create(rsv_path(ns), labelled)) == (400, "BadRequest")

    backend.run(scenario)


def test_status_subresource_and_main_resource_each_change_only_their_part(
    backend: Backend,
) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        created = await api.create(rsv_path(ns), reservation("a", app="x"))
        path = rsv_path(ns, "a")
        via_status = await api.merge_patch(
            path + "/status",
            {"status": {"phase": "Admitted"}, "metadata": {"labels": {"via": "status"}}},
        )
        assert via_status["status"] == {"phase": "Admitted"}
        assert via_status["metadata"]["labels"] == {"app": "x"}  # ignored on /status
        assert via_status["metadata"]["generation"] == 1
        assert int(via_status["metadata"]["resourceVersion"]) > int(
            created["metadata"]["resourceVersion"]
        )
        via_main = await api.merge_patch(
            path, {"status": {"phase": "Rejected"}, "metadata": {"annotations": {"q": "1"}}}
        )
        assert via_main["status"] == {"phase": "Admitted"}  # ignored on the main resource
        assert via_main["metadata"]["annotations"] == {"q": "1"}
        assert via_main["metadata"]["generation"] == 1
        again = await api.merge_patch(path, {"metadata": {"annotations": {"q": "1"}}})
        same = via_main["metadata"]["resourceVersion"]
        assert again["metadata"]["resourceVersion"] == same  # a no-op writes nothing
        status_only = await api.merge_patch(path, {"status": {"phase": "Rejected"}})
        assert status_only["metadata"]["resourceVersion"] == same
        stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}}
        assert await refusal(api.merge_patch(path, {**stale, "x": 1})) == (409, "Conflict")

    backend.run(scenario)


def test_a_null_where_the_schema_has_no_nullable_is_dropped(backend: Backend) -> None:
    """kube-apiserver prunes a null the schema does not allow instead of refusing it (a
    NodeHeadroom device without a model is written so); the fake once refused it."""

    async def scenario(api: Transport, ns: str) -> None:
        await api.create(rsv_path(ns), reservation("a"))
        path = rsv_path(ns, "a") + "/status"
        written = await api.json_patch(
            path,
            [{"op": "add", "path": "/status", "value": {"phase": "Admitted", "message": None}}],
        )
        assert written["status"] == {"phase": "Admitted"}

    backend.run(scenario)


def test_reservation_spec_is_immutable(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        await api.create(rsv_path(ns), reservation("a"))
        path = rsv_path(ns, "a")
        assert await refusal(api.merge_patch(path, {"spec": {"ramMB": 20}})) == (422, "Invalid")
        replace_spec = [{"op": "replace", "path": "/spec/ramMB", "value": 20}]
        assert await refusal(api.json_patch(path, replace_spec)) == (422, "Invalid")
        ignored = await api.merge_patch(path + "/status", {"spec": {"ramMB": 20}})
        assert ignored["spec"]["ramMB"] == 10  # /status ignores spec

    backend.run(scenario)


def test_nodes_keep_their_status_on_create_and_pods_start_pending(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        name = unique("contract-node")
        nodes = resource_path("", "v1", "nodes")
        status = {"capacity": {"memory": "1Gi"}, "allocatable": {"memory": "1Gi"}}
        try:
            node = await api.create(nodes, {"metadata": {"name": name}, "status": status})
            assert node["status"]["allocatable"] == {"memory": "1Gi"}
            assert "generation" not in node["metadata"]
            ignored = await api.merge_patch(
                f"{nodes}/{name}", {"status": {"allocatable": {"memory": "2Gi"}}}
            )
            assert ignored["status"]["allocatable"] == {"memory": "1Gi"}
            resized = await api.merge_patch(
                f"{nodes}/{name}/status", {"status": {"allocatable": {"memory": "2Gi"}}}
            )
            assert resized["status"]["allocatable"] == {"memory": "2Gi"}
            gone = await api.delete(f"{nodes}/{name}")
            assert (gone["kind"], gone["status"]) == ("Status", "Success")
        finally:
            with contextlib.suppress(ApiError):  # already gone unless an assertion failed
                await api.delete(f"{nodes}/{name}")
        pods = resource_path("", "v1", "pods", ns)
        pod = await api.create(
            pods,
            {
                "metadata": {"name": "p", "labels": {"headroom.dev/owner": "true"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Running"},
            },
        )
        assert pod["status"]["phase"] == "Pending"
        assert pod["metadata"]["generation"] == 1
        deleted = await api.delete(f"{pods}/p", uid=pod["metadata"]["uid"])
        assert deleted["kind"] == "Pod"  # pods answer DELETE with the object

    backend.run(scenario)


# -- delete, PUT -------------------------------------------------------------------------------


def test_delete_with_a_uid_precondition(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        created = await api.create(rsv_path(ns), reservation("a"))
        path = rsv_path(ns, "a")
        assert await refusal(api.delete(path, uid="another-uid")) == (409, "Conflict")
        gone = await api.delete(path, uid=created["metadata"]["uid"])
        assert (gone["kind"], gone["status"]) == ("Status", "Success")
        assert gone["details"]["uid"] == created["metadata"]["uid"]
        assert await refusal(api.get(path)) == (404, "NotFound")
        assert await refusal(api.delete(path)) == (404, "NotFound")
        again = await api.create(rsv_path(ns), reservation("a"))  # a new incarnation
        assert again["metadata"]["uid"] != created["metadata"]["uid"]
        assert await refusal(api.delete(path, uid=created["metadata"]["uid"])) == (
            409,
            "Conflict",
        )

    backend.run(scenario)


def test_put_with_a_stale_resource_version_is_409(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        leases = resource_path("coordination.k8s.io", "v1", "leases", ns)
        lease: JSON = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "leader"},
            "spec": {"holderIdentity": "a"},
        }
        first = await api.create(leases, lease)
        version = first["metadata"]["resourceVersion"]
        lease["metadata"]["resourceVersion"] = version
        lease["spec"]["holderIdentity"] = "b"
        second = await api.replace(f"{leases}/leader", lease)
        assert second["spec"]["holderIdentity"] == "b"
        assert int(second["metadata"]["resourceVersion"]) > int(version)
        lease["spec"]["holderIdentity"] = "c"  # still carries the first version
        assert await refusal(api.replace(f"{leases}/leader", lease)) == (409, "Conflict")
        del lease["metadata"]["resourceVersion"]
        assert await refusal(api.replace(f"{leases}/leader", lease)) == (422, "Invalid")
        # a PUT to a missing Lease creates it, whatever version it carries...
        missing = {**lease, "metadata": {"name": "new", "resourceVersion": "1"}}
        assert (await api.replace(f"{leases}/new", missing))["metadata"]["name"] == "new"
        # ...but not a missing Secret or Reservation
        secrets = resource_path("", "v1", "secrets", ns)
        assert await refusal(api.replace(f"{secrets}/nope", {"metadata": {"name": "nope"}})) == (
            404,
            "NotFound",
        )
        nope = reservation("nope")
        nope["metadata"]["resourceVersion"] = "1"
        assert await refusal(api.replace(rsv_path(ns, "nope"), nope)) == (404, "NotFound")
        renamed = {**lease, "metadata": {"name": "other", "resourceVersion": "1"}}
        assert await refusal(api.replace(f"{leases}/leader", renamed)) == (400, "BadRequest")
        await api.create(secrets, {"metadata": {"name": "s"}, "data": {"k": "YQ=="}})
        # core kinds other than Lease allow an unconditional update
        put = await api.replace(f"{secrets}/s", {"metadata": {"name": "s"}, "data": {"k": "Yg=="}})
        assert put["data"] == {"k": "Yg=="}
        rsv = await api.create(rsv_path(ns), reservation("r"))
        del rsv["metadata"]["resourceVersion"]
        assert await refusal(api.replace(rsv_path(ns, "r"), rsv)) == (422, "Invalid")

    backend.run(scenario)


# -- LIST ----------------------------------------------------------------------------------------


def test_list_pages_are_one_consistent_snapshot(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        for i in range(5):
            await api.create(rsv_path(ns), reservation(f"p{i}", grp="p"))
        await api.create(rsv_path(ns), reservation("other", grp="q"))
        first = await api.list_page(rsv_path(ns), limit=2, label_selector="grp=p")
        assert first["kind"] == "ReservationList"
        assert [i["metadata"]["name"] for i in first["items"]] == ["p0", "p1"]
        assert all(i["kind"] == "Reservation" for i in first["items"])
        version = first["metadata"]["resourceVersion"]
        token = first["metadata"]["continue"]
        assert token
        assert "remainingItemCount" not in first["metadata"]
        await api.delete(rsv_path(ns, "p3"))
        await api.create(rsv_path(ns), reservation("p9", grp="p"))
        second = await api.list_page(
            rsv_path(ns), limit=2, label_selector="grp=p", continue_token=token
        )
        assert [i["metadata"]["name"] for i in second["items"]] == ["p2", "p3"]  # as of page 1
        assert second["metadata"]["resourceVersion"] == version
        third = await api.list_page(
            rsv_path(ns),
            limit=2,
            label_selector="grp=p",
            continue_token=second["metadata"]["continue"],
        )
        assert [i["metadata"]["name"] for i in third["items"]] == ["p4"]
        assert not third["metadata"].get("continue")
        unfiltered = await api.list_page(rsv_path(ns), limit=2)
        assert unfiltered["metadata"]["remainingItemCount"] == 4
        assert int(unfiltered["metadata"]["resourceVersion"]) > int(version)
        items, current = await list_all(api, rsv_path(ns), limit=2)
        assert [i["metadata"]["name"] for i in items] == ["other", "p0", "p1", "p2", "p4", "p9"]
        assert current == unfiltered["metadata"]["resourceVersion"]

        async def names(selector: str) -> list[str]:
            page = await api.list_page(rsv_path(ns), label_selector=selector)
            return [i["metadata"]["name"] for i in page["items"]]

        assert await names("grp!=p") == ["other"]
        assert await names("grp in (q, r)") == ["other"]
        assert await names("grp notin (p)") == ["other"]
        assert await names("!grp") == []
        assert await names("grp") == ["other", "p0", "p1", "p2", "p4", "p9"]
        assert await names("grp=p,grp!=p") == []
        assert await refusal(api.list_page(rsv_path(ns), label_selector="a=(b")) == (
            400,
            "BadRequest",
        )
        assert await refusal(api.list_page(rsv_path(ns), continue_token="garbage")) == (
            400,
            "BadRequest",
        )
        nowhere = await api.list_page(rsv_path("no-such-ns"))
        assert nowhere["items"] == []  # a LIST in a missing namespace is empty, not 404
        assert await refusal(api.get(rsv_path("no-such-ns", "a"))) == (404, "NotFound")
        namespaces = await api.list_page(resource_path("", "v1", "namespaces"), limit=500)
        assert namespaces["kind"] == "NamespaceList"
        assert all("kind" not in item for item in namespaces["items"])  # core list items: no kind

    backend.run(scenario)
