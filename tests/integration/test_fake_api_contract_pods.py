"""The fake API server against kube-apiserver: Pods behind scheduling gates.

As ``test_fake_api_contract.py``: each scenario runs on both servers and must give
the same outcome. These pin what ``headroom_dev.sim.fakeapi.podrules`` enforces, so
that the simulation's gated pods meet the rules the real server has: a gate is set
only at create and only ever removed; a gated pod's placement accepts additions
only; nothing else in a spec moves; a pod with a gate gets no node, neither at
create nor by a Binding; the operator's own ungate and condition patches apply.
No scheduler runs on this plane, so an ungated pod stays unbound until the test
binds it, as kube-scheduler would.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from headroom.kube.transport import JSON, Transport, resource_path
from headroom.objects.pods import condition_patch, ungate_patch
from tests.integration.fake_api_contract_support import (
    JSON_PATCH_REJECTED,
    Backend,
    make_backend,
    refusal,
    unique,
)

GATE = "headroom.dev/admission"
OTHER_GATE = "example.com/quota"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
TERMS = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"


@pytest.fixture(params=["real", "fake"])
def backend(request: pytest.FixtureRequest) -> Backend:
    return make_backend(request)


def pods_path(namespace: str, name: str | None = None) -> str:
    return resource_path("", "v1", "pods", namespace, name)


def gated_pod(name: str, *gates: str, **spec: Any) -> JSON:
    return {
        # No claim label: no operator or webhook another test left on this plane acts on it.
        "metadata": {"name": name, "annotations": {"headroom.dev/ram": "64Mi"}},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "schedulingGates": [{"name": gate} for gate in gates],
            **spec,
        },
    }


def gate_names(pod: JSON) -> list[str]:
    return [gate["name"] for gate in pod["spec"].get("schedulingGates") or []]


def test_a_gate_is_set_at_create_and_then_only_removed(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        pod = await api.create(pods_path(ns), gated_pod("p", GATE, OTHER_GATE))
        assert pod["status"]["phase"] == "Pending"
        [condition] = pod["status"]["conditions"]
        assert {k: condition[k] for k in ("type", "status", "reason", "message")} == {
            "type": "PodScheduled",
            "status": "False",
            "reason": "SchedulingGated",
            "message": "Scheduling is blocked due to non-empty scheduling gates",
        }
        assert condition["lastProbeTime"] is None
        named = gated_pod("named", GATE, nodeName=unique("nowhere"))
        assert await refusal(api.create(pods_path(ns), named)) == (422, "Invalid")
        twice = gated_pod("twice", GATE, GATE)
        assert await refusal(api.create(pods_path(ns), twice)) == (422, "Invalid")
        empty = await api.create(pods_path(ns), gated_pod("empty"))
        assert "schedulingGates" not in empty["spec"]
        assert "conditions" not in empty["status"]

        path = pods_path(ns, "p")
        added = [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "x"}}]
        assert await refusal(api.json_patch(path, added)) == (422, "Invalid")
        merged = {"spec": {"schedulingGates": [{"name": GATE}, {"name": "x"}]}}
        assert await refusal(api.merge_patch(path, merged)) == (422, "Invalid")
        late = [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
        assert await refusal(api.json_patch(pods_path(ns, "empty"), late)) == (422, "Invalid")

        one = await api.json_patch(path, [{"op": "remove", "path": "/spec/schedulingGates/1"}])
        assert gate_names(one) == [GATE]
        assert one["metadata"]["generation"] == 2
        none = await api.json_patch(path, [{"op": "remove", "path": "/spec/schedulingGates/0"}])
        assert "schedulingGates" not in none["spec"]  # an empty list is not stored
        assert none["status"]["conditions"][0]["reason"] == "SchedulingGated"  # until bound

    backend.run(scenario)


def test_a_gated_pods_placement_accepts_additions_only(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        mine = {"key": "mine", "operator": "Exists", "effect": "NoSchedule"}
        terms = [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
        ]
        body = gated_pod(
            "p",
            GATE,
            nodeSelector={"pool": "a"},
            tolerations=[mine],
            affinity={"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}},
        )
        created = await api.create(pods_path(ns), body)
        path = pods_path(ns, "p")
        more = await api.merge_patch(path, {"spec": {"nodeSelector": {"disk": "ssd"}}})
        assert more["spec"]["nodeSelector"] == {"pool": "a", "disk": "ssd"}
        for changed in ({"pool": "b"}, {"pool": None}):
            patch = {"spec": {"nodeSelector": changed}}
            assert await refusal(api.merge_patch(path, patch)) == (422, "Invalid")
        requirement = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
        pinned = await api.json_patch(path, [_add(f"{TERMS}/0/matchFields", [requirement])])
        assert pinned["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"][0][
            "matchFields"
        ] == [requirement]
        term = {"matchExpressions": [{"key": "x", "operator": "Exists"}]}
        assert await refusal(api.json_patch(path, [_add(f"{TERMS}/-", term)])) == (422, "Invalid")
        mutated = [{"op": "replace", "path": f"{TERMS}/1/matchExpressions/0/key", "value": "z"}]
        assert await refusal(api.json_patch(path, mutated)) == (422, "Invalid")
        removed = [{"op": "remove", "path": f"{TERMS}/0/matchExpressions/0"}]
        assert await refusal(api.json_patch(path, removed)) == (422, "Invalid")
        tolerated = {"key": "more", "operator": "Exists", "effect": "NoSchedule"}
        assert (
            len(
                (await api.json_patch(path, [_add("/spec/tolerations/-", tolerated)]))["spec"][
                    "tolerations"
                ]
            )
            == len(created["spec"]["tolerations"]) + 1
        )
        dropped = [
            {"op": "test", "path": "/spec/tolerations/0/key", "value": "mine"},
            {"op": "remove", "path": "/spec/tolerations/0"},
        ]
        assert await refusal(api.json_patch(path, dropped)) == (422, "Invalid")
        restart = {"spec": {"restartPolicy": "Never"}}
        assert await refusal(api.merge_patch(path, restart)) == (422, "Invalid")
        image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "busybox:1"}]
        assert (await api.json_patch(path, image))["spec"]["containers"][0]["image"] == "busybox:1"

        # A nil node affinity may be set; an empty term stays empty.
        await api.create(pods_path(ns), gated_pod("bare", GATE))
        affinity = {
            "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchFields": [requirement]}]}}
        }
        bare = await api.json_patch(pods_path(ns, "bare"), [_add("/spec/affinity", affinity)])
        assert bare["spec"]["affinity"] == affinity
        empty_term = [{}, {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]
        odd = gated_pod(
            "odd", GATE, affinity={"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": empty_term}}}
        )
        await api.create(pods_path(ns), odd)
        into_empty = [_add(f"{TERMS}/0/matchFields", [requirement])]
        assert await refusal(api.json_patch(pods_path(ns, "odd"), into_empty)) == (422, "Invalid")

        # Ungated, the placement is fixed too, and spec.nodeName never moves by a patch.
        ungated = await api.json_patch(path, [{"op": "remove", "path": "/spec/schedulingGates"}])
        assert "schedulingGates" not in ungated["spec"]
        later = {"spec": {"nodeSelector": {"late": "x"}}}
        assert await refusal(api.merge_patch(path, later)) == (422, "Invalid")
        node = {"spec": {"nodeName": unique("nowhere")}}
        assert await refusal(api.merge_patch(path, node)) == (422, "Invalid")

    backend.run(scenario)


def _add(path: str, value: Any) -> JSON:
    return {"op": "add", "path": path, "value": value}


def test_the_operators_ungate_and_condition_patches(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        terms = [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]},
        ]
        affinity = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}
        pod = await api.create(pods_path(ns), gated_pod("p", OTHER_GATE, GATE, affinity=affinity))
        path = pods_path(ns, "p")
        status = condition_patch(pod, "False", "Waiting", "waits", "2030-01-01T00:00:00Z")
        waiting = await api.json_patch(path + "/status", status)
        assert [c["type"] for c in waiting["status"]["conditions"]] == [
            "PodScheduled",
            "headroom.dev/Admitted",
        ]
        assert waiting["metadata"]["generation"] == 1  # the status subresource
        again = condition_patch(waiting, "False", "Waiting", "still", "2030-01-01T00:00:01Z")
        assert again[0]["op"] == "test"  # guarded by the type at its index
        await api.json_patch(path + "/status", again)
        elsewhere = [
            {"op": "test", "path": "/status/conditions/0/type", "value": "headroom.dev/Admitted"}
        ]
        assert await refusal(api.json_patch(path + "/status", elsewhere)) == JSON_PATCH_REJECTED
        other = [{"op": "test", "path": "/metadata/uid", "value": "another-uid"}]
        assert await refusal(api.json_patch(path + "/status", other)) == JSON_PATCH_REJECTED

        operations = ungate_patch(pod, "n1", "p")
        assert operations is not None
        stale = [{"op": "test", "path": "/metadata/uid", "value": "another-uid"}, *operations[1:]]
        assert await refusal(api.json_patch(path, stale)) == JSON_PATCH_REJECTED
        ungated = await api.json_patch(path, operations)
        assert gate_names(ungated) == [OTHER_GATE]
        pinned = ungated["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
        pin = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
        assert all(term["matchFields"][-1] == pin for term in pinned)
        assert ungated["metadata"]["annotations"]["headroom.dev/reservation"] == "p"
        # the same patch again: our gate is gone, so its test fails (nothing applied twice)
        assert await refusal(api.json_patch(path, operations)) == JSON_PATCH_REJECTED

    backend.run(scenario)


def test_the_ungate_patch_sets_or_lowers_a_deadline_never_raises_it(backend: Backend) -> None:
    """A quota's lifetime ends a pod through spec.activeDeadlineSeconds, set in the one
    ungate patch: the API server lets it be set on a pod, or lowered, never raised or
    removed; and not to 0."""

    async def scenario(api: Transport, ns: str) -> None:
        left = timedelta(seconds=30, milliseconds=900)
        for name, own, kept in (("p", None, 30), ("near", 10, 10), ("far", 100, 30)):
            spec = {} if own is None else {"activeDeadlineSeconds": own}
            pod = await api.create(pods_path(ns), gated_pod(name, GATE, **spec))
            operations = ungate_patch(pod, "n1", name, time_left=left)
            assert operations is not None
            ungated = await api.json_patch(pods_path(ns, name), operations)
            assert gate_names(ungated) == []
            assert ungated["spec"]["activeDeadlineSeconds"] == kept

        path = pods_path(ns, "p")
        for value in (31, 0):
            patch = {"spec": {"activeDeadlineSeconds": value}}
            assert await refusal(api.merge_patch(path, patch)) == (422, "Invalid")
        removed = [{"op": "remove", "path": "/spec/activeDeadlineSeconds"}]
        assert await refusal(api.json_patch(path, removed)) == (422, "Invalid")
        lower = await api.merge_patch(path, {"spec": {"activeDeadlineSeconds": 20}})
        assert lower["spec"]["activeDeadlineSeconds"] == 20

    backend.run(scenario)


def test_a_binding_places_only_a_pod_without_gates(backend: Backend) -> None:
    async def scenario(api: Transport, ns: str) -> None:
        pod = await api.create(pods_path(ns), gated_pod("p", GATE))
        uid = pod["metadata"]["uid"]
        node = unique("nowhere")
        binding = pods_path(ns, "p") + "/binding"

        def body(name: str = "p", target: str = node, **meta: str) -> JSON:
            return {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, **meta},
                "target": {"apiVersion": "v1", "kind": "Node", "name": target},
            }

        assert await refusal(api.create(binding, body(uid=uid))) == (409, "Conflict")
        assert await refusal(api.get(binding)) == (405, "MethodNotAllowed")
        assert await refusal(api.create(binding, body(name="q"))) == (400, "BadRequest")
        assert await refusal(api.create(binding, body(target=""))) == (500, "")
        missing = pods_path(ns, "zz") + "/binding"
        assert await refusal(api.create(missing, body(name="zz"))) == (404, "NotFound")
        gone = await api.json_patch(
            pods_path(ns, "p"), [{"op": "remove", "path": "/spec/schedulingGates"}]
        )
        assert await refusal(api.create(binding, body(uid="another-uid"))) == (409, "Conflict")
        stale = body(resourceVersion=pod["metadata"]["resourceVersion"])
        assert await refusal(api.create(binding, stale)) == (409, "Conflict")
        answer = await api.create(binding, body(uid=uid))
        assert {k: answer.get(k) for k in ("kind", "status", "code")} == {
            "kind": "Status",
            "status": "Success",
            "code": 201,
        }
        bound = await api.get(pods_path(ns, "p"))
        assert bound["spec"]["nodeName"] == node
        assert bound["metadata"]["generation"] == gone["metadata"]["generation"]  # not the spec
        [scheduled] = [c for c in bound["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert (scheduled["status"], scheduled.get("reason")) == ("True", None)
        assert await refusal(api.create(binding, body(uid=uid))) == (409, "Conflict")  # once

    backend.run(scenario)
