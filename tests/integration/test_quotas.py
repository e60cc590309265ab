"""Quotas per tenant (issue 21), on the real control plane.

A HeadroomQuota caps what the namespaces it selects hold together; the operator
checks it in the same decision as the node. Every quota here selects only the
test's own namespaces (by a label unique to the test) and is deleted after it,
since quotas are cluster-scoped and the control plane is shared.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from headroom_dev import quotas as hq
from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.polling import eventually

Start = Callable[..., OperatorProcess]
QUEUED = ("Queued",)


@pytest.fixture
def tenants(core: client.CoreV1Api, custom: client.CustomObjectsApi) -> Iterator[Any]:
    """``make(count, labels)``: fresh namespaces with these labels; ``quota(...)``: a quota
    deleted after the test. Everything is removed after the test."""
    namespaces: list[str] = []
    quotas: list[str] = []

    class Tenants:
        tag = uuid.uuid4().hex[:8]

        def make(self, labels: dict[str, str]) -> str:
            name = f"tq-{uuid.uuid4().hex[:10]}"
            core.create_namespace({"metadata": {"name": name, "labels": labels}})
            namespaces.append(name)
            return name

        def quota(self, labels: dict[str, str], **spec: Any) -> str:
            name = f"q-{uuid.uuid4().hex[:8]}"
            hq.create(custom, name, labels, **spec)
            quotas.append(name)
            return name

    yield Tenants()
    for name in quotas:
        hq.delete(custom, name)
    for name in namespaces:
        custom.delete_collection_namespaced_custom_object(rsv.GROUP, rsv.VERSION, name, rsv.PLURAL)
        core.delete_namespace(name)


def decided(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    return dict(rsv.wait_for(custom, namespace, name)["status"])


def test_two_namespaces_share_a_quota_and_a_third_has_its_own(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    tenants: Any,
) -> None:
    node = make_node(memory="64Gi").metadata.name
    team = {"team": f"ml-{tenants.tag}"}
    other = {"team": f"web-{tenants.tag}"}
    shared = tenants.quota(team, ramMB=4096, maxEntries=3)
    own = tenants.quota(other, ramMB=2048)
    a, b, c = tenants.make(team), tenants.make(team), tenants.make(other)
    run_operator({"sweepPeriod": "200ms", "summaryInterval": "200ms"})

    rsv.create(custom, a, "first", node, 3072)
    assert decided(custom, a, "first")["phase"] == "Admitted"
    rsv.create(custom, b, "second", node, 2048)
    refused = decided(custom, b, "second")
    assert (refused["phase"], refused["reason"]) == ("Rejected", "QuotaExceeded"), refused
    assert refused["message"] == (
        f"namespace {b} (quota {shared}): holds 3 GiB of 4 GiB RAM; requested 2 GiB"
    )
    rsv.create(custom, c, "third", node, 2048)  # the other quota's room is its own
    assert decided(custom, c, "third")["phase"] == "Admitted"
    rsv.create(custom, c, "fourth", node, 1024)
    assert decided(custom, c, "fourth")["reason"] == "QuotaExceeded"
    rsv.create(custom, b, "fits", node, 1024)
    assert decided(custom, b, "fits")["phase"] == "Admitted"
    rsv.create(custom, a, "small", node, 1)  # RAM is full; and a third entry is the cap
    assert decided(custom, a, "small")["reason"] == "QuotaExceeded"

    # Queued on the quota, admitted when another namespace under it releases.
    rsv.create(custom, b, "waits", node, 2048, wait="2m")
    waiting = rsv.wait_for(custom, b, "waits", QUEUED)["status"]
    assert waiting["reason"] == "QuotaExceeded", waiting
    rsv.delete(custom, a, "first")
    assert decided(custom, b, "waits")["phase"] == "Admitted"

    def statuses() -> None:
        status = hq.get(custom, shared).get("status") or {}
        assert (status.get("ramMB"), status.get("entries")) == (3072, 2), status
        assert status["remainingRAMMB"] == 1024
        by_namespace = {n["namespace"]: n for n in status["namespaces"]}
        assert set(by_namespace) == {a, b}
        assert (by_namespace[b]["ramMB"], by_namespace[a]["ramMB"]) == (3072, 0)
        assert (hq.get(custom, own).get("status") or {}).get("ramMB") == 2048

    eventually(statuses, timeout=15)


def test_a_node_outside_the_quota_is_refused(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    tenants: Any,
) -> None:
    pool = f"gpu-{tenants.tag}"
    allowed = make_node(memory="16Gi", labels={"pool": pool}).metadata.name
    elsewhere = make_node(memory="16Gi").metadata.name
    labels = {"team": f"nn-{tenants.tag}"}
    quota = tenants.quota(labels, nodeSelector={"matchLabels": {"pool": pool}})
    namespace = tenants.make(labels)
    run_operator()
    rsv.create(custom, namespace, "out", elsewhere, 1024, wait="1m")
    status = decided(custom, namespace, "out")  # not waitable: no release brings it in
    assert (status["phase"], status["reason"]) == ("Rejected", "NodeNotAllowed"), status
    assert status["message"] == (
        f"namespace {namespace} (quota {quota}): node {elsewhere} is outside "
        f"spec.nodeSelector (pool={pool})"
    )
    rsv.create(custom, namespace, "in", allowed, 1024)
    assert decided(custom, namespace, "in")["phase"] == "Admitted"


def test_lifetime_default_and_maximum(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    tenants: Any,
) -> None:
    node = make_node(memory="16Gi").metadata.name
    labels = {"team": f"lt-{tenants.tag}"}
    tenants.quota(labels, maxLifetime="1h", defaultLifetime="3s", maxWait="1m")
    namespace = tenants.make(labels)
    run_operator({"sweepPeriod": "200ms"})

    rsv.create(custom, namespace, "given", node, 1024)
    admitted = rsv.get(custom, namespace, "given")
    status = decided(custom, namespace, "given")
    assert status["phase"] == "Admitted"
    created = datetime.fromisoformat(admitted["metadata"]["creationTimestamp"])
    assert datetime.fromisoformat(status["expiresAt"]) == created + timedelta(seconds=3)
    assert rsv.wait_for(custom, namespace, "given", ("Reclaimed",), timeout=15)["status"][
        "reason"
    ] == ("Expired")

    far = (datetime.now(UTC) + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    rsv.create(custom, namespace, "too-long", node, 1024, expiresAt=far)
    status = decided(custom, namespace, "too-long")
    assert (status["phase"], status["reason"]) == ("Rejected", "LifetimeTooLong"), status
    assert "spec.maxLifetime is 1h" in status["message"]
    rsv.create(custom, namespace, "waits-long", node, 1024, wait="2m")
    status = decided(custom, namespace, "waits-long")
    assert (status["reason"], status["message"].split(": ", 1)[1]) == (
        "WaitTooLong",
        "spec.wait 2m is longer than spec.maxWait 1m",
    ), status


def test_bad_quotas_are_refused_at_apply(custom: client.CustomObjectsApi, crds: list[str]) -> None:
    selector = {"team": "never"}
    for spec, words in (
        ({"ramMB": -1}, "spec.ramMB"),
        ({"maxLifetime": "1h", "defaultLifetime": "2h"}, "defaultLifetime must not be longer"),
        ({"maxLifetime": "forever"}, "spec.maxLifetime"),
        ({"maxWait": "48h"}, "must be at most 24h"),
    ):
        with pytest.raises(client.ApiException) as refused:
            hq.create(custom, f"bad-{uuid.uuid4().hex[:6]}", selector, **spec)
        assert refused.value.status == 422, spec
        assert words in str(refused.value.body), spec
    for selector_body, words in (
        ({"matchExpressions": [{"key": "team", "operator": "Bogus"}]}, "operator"),
        ({"matchExpressions": [{"key": "team", "operator": "In"}]}, "values must be non-empty"),
        ({"matchLabels": {"bad key!": "x"}}, "label keys must be qualified names"),
    ):
        body = hq.quota(f"bad-{uuid.uuid4().hex[:6]}", {})
        body["spec"]["namespaceSelector"] = selector_body
        with pytest.raises(client.ApiException) as refused:
            custom.create_cluster_custom_object(hq.GROUP, hq.VERSION, hq.PLURAL, body)
        assert refused.value.status == 422, selector_body
        assert words in str(refused.value.body), selector_body


def _admitted_mb(custom: client.CustomObjectsApi, namespace: str) -> int:
    return sum(
        o["spec"]["ramMB"]
        for o in rsv.list_all(custom, namespace)
        if (o.get("status") or {}).get("phase") == "Admitted"
    )


def test_a_quota_changed_and_deleted_under_load(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    tenants: Any,
) -> None:
    """Raised: more are admitted; lowered under what is held: nothing new, nothing
    reclaimed; deleted: its waiters fall to the default (unlimited)."""
    node = make_node(memory="64Gi").metadata.name
    labels = {"team": f"ld-{tenants.tag}"}
    quota = tenants.quota(labels, ramMB=2048)
    namespace = tenants.make(labels)
    run_operator({"sweepPeriod": "200ms"})
    for number in range(12):
        rsv.create(custom, namespace, f"r{number}", node, 512, wait="5m")

    def counted(admitted: int, queued: int) -> None:
        phases = [(o.get("status") or {}).get("phase") for o in rsv.list_all(custom, namespace)]
        assert (phases.count("Admitted"), phases.count("Queued")) == (admitted, queued), phases

    eventually(lambda: counted(4, 8), timeout=20)
    hq.patch_spec(custom, quota, ramMB=4096)
    eventually(lambda: counted(8, 4), timeout=20)
    assert _admitted_mb(custom, namespace) == 4096
    hq.patch_spec(custom, quota, ramMB=1024)  # under what is held: reclaims nothing
    rsv.create(custom, namespace, "late", node, 512)
    status = decided(custom, namespace, "late")
    assert status["message"].endswith("holds 4 GiB of 1 GiB RAM; requested 512 MiB"), status
    counted(8, 4)

    def over() -> None:
        assert (hq.get(custom, quota).get("status") or {}).get("over") is True

    eventually(over, timeout=15)
    hq.delete(custom, quota)
    eventually(lambda: counted(12, 0), timeout=20)


def test_a_restart_with_quotas_present_rebuilds_their_usage(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    tenants: Any,
) -> None:
    node = make_node(memory="64Gi").metadata.name
    labels = {"team": f"rs-{tenants.tag}"}
    quota = tenants.quota(labels, ramMB=4096, defaultLifetime="1h")
    namespace = tenants.make(labels)
    first = run_operator()
    rsv.create(custom, namespace, "held", node, 3072)
    before = decided(custom, namespace, "held")
    assert before["phase"] == "Admitted"
    assert before["expiresAt"]
    first.stop()
    rsv.create(custom, namespace, "while-down", node, 2048)
    run_operator()
    status = decided(custom, namespace, "while-down")
    assert status["message"] == (
        f"namespace {namespace} (quota {quota}): holds 3 GiB of 4 GiB RAM; requested 2 GiB"
    )
    after = rsv.get(custom, namespace, "held")["status"]
    assert (after["decisionID"], after["expiresAt"]) == (before["decisionID"], before["expiresAt"])


def test_a_namespace_no_quota_selects_is_denied_when_configured(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    tenants: Any,
) -> None:
    node = make_node(memory="16Gi").metadata.name
    labels = {"team": f"dn-{tenants.tag}"}
    namespace = tenants.make(labels)
    run_operator({"quotas": {"unselectedNamespaces": "Deny"}})
    rsv.create(custom, namespace, "denied", node, 1024)
    assert decided(custom, namespace, "denied")["reason"] == "NoQuota"
    rsv.create(custom, namespace, "waits", node, 1024, wait="2m")
    assert rsv.wait_for(custom, namespace, "waits", QUEUED)["status"]["reason"] == "NoQuota"
    tenants.quota(labels, ramMB=2048)  # a quota for it: the waiter goes
    assert decided(custom, namespace, "waits")["phase"] == "Admitted"


@pytest.fixture
def lax_quota_schema(api_client: client.ApiClient, crds: list[str]) -> Iterator[None]:
    """The HeadroomQuota CRD with a spec the API server does not check, as a quota written
    before a bound tightened would be; the generated CRD is put back after the test."""
    from pathlib import Path

    import yaml

    from headroom_dev.apply import install_crds

    path = Path(__file__).resolve().parents[2] / "crds" / "headroom.dev_headroomquotas.yaml"
    lax = yaml.safe_load(path.read_text())
    schema = lax["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    extensions = client.ApiextensionsV1Api(api_client)
    current = extensions.read_custom_resource_definition(lax["metadata"]["name"])
    lax["metadata"]["resourceVersion"] = current.metadata.resource_version
    extensions.replace_custom_resource_definition(lax["metadata"]["name"], lax)
    try:
        yield
    finally:
        install_crds(api_client, [path])


def test_a_poison_quota_is_isolated(
    run_operator: Start,
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    tenants: Any,
    lax_quota_schema: None,
) -> None:
    """One quota whose limits cannot be read: its namespace admits nothing new, with a
    Warning naming the field; one whose selector cannot be read governs nothing. Another
    tenant is decided as usual, the operator starts with both present, and fixing the
    quota lets its waiter in."""
    node = make_node(memory="16Gi").metadata.name
    poisoned_labels = {"team": f"px-{tenants.tag}"}
    healthy_labels = {"team": f"ok-{tenants.tag}"}
    bad_limits = tenants.quota(poisoned_labels, ramMB="lots")
    bad_selector = f"q-{uuid.uuid4().hex[:8]}"
    body = hq.quota(bad_selector, {})
    body["spec"]["namespaceSelector"] = {"matchExpressions": [{"key": "x", "operator": "Nope"}]}
    custom.create_cluster_custom_object(hq.GROUP, hq.VERSION, hq.PLURAL, body)
    try:
        tenants.quota(healthy_labels, ramMB=2048)
        poisoned, healthy = tenants.make(poisoned_labels), tenants.make(healthy_labels)
        run_operator({"summaryInterval": "200ms"})

        rsv.create(custom, poisoned, "blocked", node, 1024, wait="2m")
        status = rsv.wait_for(custom, poisoned, "blocked", QUEUED)["status"]
        assert status["reason"] == "QuotaInvalid", status
        assert "spec.ramMB" in status["message"], status
        assert "lots" in status["message"], status
        rsv.create(custom, healthy, "fine", node, 1024)
        assert decided(custom, healthy, "fine")["phase"] == "Admitted"
        rsv.create(custom, healthy, "over", node, 2048)
        assert decided(custom, healthy, "over")["reason"] == "QuotaExceeded"

        def warned() -> None:
            events = core.list_namespaced_event("default").items
            words = {
                (e.involved_object.name, e.reason): e.message
                for e in events
                if e.involved_object.kind == "HeadroomQuota"
            }
            assert "spec.ramMB" in words.get((bad_limits, "InvalidQuota"), ""), words
            assert "governs nothing" in words.get((bad_selector, "InvalidQuota"), ""), words
            status = hq.get(custom, bad_selector).get("status") or {}
            assert status.get("valid") is False, status
            assert "operator" in status.get("message", ""), status

        eventually(warned, timeout=15)
        hq.patch_spec(custom, bad_limits, ramMB=4096)
        assert decided(custom, poisoned, "blocked")["phase"] == "Admitted"
    finally:
        hq.delete(custom, bad_selector)


def test_a_quota_created_again_under_its_name_gets_its_status(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    tenants: Any,
) -> None:
    """Found by B10: the status last written was remembered by name, so the new object,
    whose figures were the same, was never written."""
    node = make_node(memory="16Gi").metadata.name
    labels = {"team": f"rc-{tenants.tag}"}
    quota = tenants.quota(labels, ramMB=4096)
    namespace = tenants.make(labels)
    run_operator({"summaryInterval": "200ms"})
    rsv.create(custom, namespace, "held", node, 1024)
    assert decided(custom, namespace, "held")["phase"] == "Admitted"

    def written() -> None:
        assert (hq.get(custom, quota).get("status") or {}).get("ramMB") == 1024

    eventually(written, timeout=15)
    hq.delete(custom, quota)
    hq.create(custom, quota, labels, ramMB=4096)
    eventually(written, timeout=15)
