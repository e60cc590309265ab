"""The operator's own reservation of a running pod, told from what a tenant writes
(``headroom.objects.pods.is_own_reservation``), and the cap on a running pod's claim
(``headroom.objects.podmemory``): issue 29, items 1 and 2."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.api.claims import PodClaim, pod_claim
from headroom.objects.podmemory import capped_claim, memory_limit_mb, memory_request_mb
from headroom.objects.pods import (
    RunningClaim,
    is_own_reservation,
    owning_pod_uid,
    pod_reservation,
    running_claim,
)
from headroom.objects.reservations import reservation_entry

NOW = datetime(2026, 12, 6, tzinfo=UTC)
JSON = dict[str, Any]


def box(limit: str | None = None, request: str | None = None, **more: object) -> JSON:
    resources: JSON = {}
    if limit is not None:
        resources["limits"] = {"memory": limit}
    if request is not None:
        resources["requests"] = {"memory": request}
    return {"name": "c", "resources": resources, **more}


def pod(
    ram: str = "1Gi",
    *,
    node: str | None = "n1",
    containers: list[JSON] | None = None,
    vram: str | None = None,
    **spec: object,
) -> JSON:
    annotations = {"headroom.dev/ram": ram}
    if vram is not None:
        annotations["headroom.dev/vram"] = vram
    body: JSON = {
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "uid": "uid-p",
            "labels": {"headroom.dev/claim": "true", "headroom.dev/owner": "true"},
            "annotations": annotations,
        },
        "spec": {"containers": containers or [box(limit="2Gi")], **spec},
    }
    if node is not None:
        body["spec"]["nodeName"] = node
    return body


def own(
    body: JSON, reservation: JSON, node_ram: int | None = 8192, vram: int | None = None
) -> bool:
    running = running_claim(body)
    assert running is not None
    entry = reservation_entry(reservation, NOW)
    uid = body["metadata"]["uid"]
    return is_own_reservation(entry, owning_pod_uid(reservation), uid, running, node_ram, vram)


def written(
    body: JSON, node: str = "n1", node_ram: int | None = 8192, vram: int | None = None
) -> JSON:
    reservation = pod_reservation(
        body, pod_claim(body), node, node_ram_mb=node_ram, node_vram_mb=vram
    )
    reservation["metadata"]["uid"] = "uid-r"
    return reservation


def test_the_operators_own_reservation_of_a_running_pod_is_its_own() -> None:
    body = pod()
    assert own(body, written(body))


def changed(reservation: JSON, path: str, value: object) -> JSON:
    copied = copy.deepcopy(reservation)
    *parents, last = path.split(".")
    where = copied
    for key in parents:
        where = where[int(key)] if isinstance(where, list) else where.setdefault(key, {})
    if value is None:
        where.pop(last, None)
    else:
        where[last] = value
    return copied


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "hog"),  # not named as the pod
        ("metadata.ownerReferences", None),  # no owner
        ("metadata.ownerReferences.0.uid", "uid-earlier"),  # an earlier incarnation
        ("spec.owner.pod", "other"),
        ("spec.liveness", "Heartbeat"),
        ("spec.node", "n2"),  # not where it runs
        ("spec.ramMB", 1 << 30),  # more than the pod can use
        ("spec.ramMB", 100),  # another size is another claim
        ("spec.vramMB", 1024),
        ("spec.gpus", 2),
        ("spec.expiresAt", "2027-01-01T00:00:00Z"),
    ],
)
def test_anything_else_a_tenant_writes_is_not(path: str, value: object) -> None:
    body = pod()
    assert not own(body, changed(written(body), path, value))


def test_a_pod_not_running_or_not_claiming_has_no_running_claim() -> None:
    assert running_claim(pod(node=None)) is None  # gated, or not yet bound
    assert running_claim({**pod(), "status": {"phase": "Succeeded"}}) is None
    unlabelled = pod()
    del unlabelled["metadata"]["labels"]["headroom.dev/claim"]
    assert running_claim(unlabelled) is None
    assert running_claim(pod(ram="8 gigs")) is None  # unreadable: nothing recorded
    assert running_claim(pod()) == RunningClaim("n1", PodClaim(1024), 2048)


def test_a_running_pods_claim_is_capped_at_its_limit_else_at_the_node() -> None:
    huge = str(1 << 30)
    assert written(pod(huge))["spec"]["ramMB"] == 2048  # its memory limit
    no_limit = pod(huge, containers=[box(request="64Mi")])
    assert written(no_limit, node_ram=8192)["spec"]["ramMB"] == 8192  # the node's total RAM
    assert written(pod(huge, vram="80Gi"), vram=24576)["spec"]["vramMB"] == 24576
    assert written(pod(huge, vram="80Gi"), vram=None)["spec"]["vramMB"] == 81920  # unknown
    # A gated pod (not bound) is reserved at its claim: it is decided like any claim.
    assert written(pod(huge, node=None))["spec"]["ramMB"] == 1 << 30
    # Bound elsewhere than the reservation's node: not what runs there.
    assert written(pod(huge), node="n2")["spec"]["ramMB"] == 1 << 30
    assert own(pod(huge), written(pod(huge)))
    assert own(no_limit, written(no_limit, node_ram=8192), node_ram=8192)
    assert not own(no_limit, written(no_limit, node_ram=8192), node_ram=16384)


def test_a_pods_limit_is_what_its_containers_can_use_together() -> None:
    def of(**spec: object) -> int | None:
        return memory_limit_mb({"spec": spec})

    assert of(containers=[box("1Gi"), box("512Mi")]) == 1536
    assert of(containers=[box("1Gi")], initContainers=[box("3Gi")]) == 3072
    sidecar = box("256Mi", restartPolicy="Always")
    assert of(containers=[box("1Gi")], initContainers=[sidecar]) == 1280
    assert of(containers=[box("1G")], overhead={"memory": "1Mi"}) == 955  # rounded up
    assert of(containers=[box("1Gi"), box(request="1Gi")]) is None  # one without a limit
    assert of(containers=[box("1Gi")], initContainers=[box()]) is None
    # Requests as before (a container without one asks nothing).
    assert memory_request_mb({"spec": {"containers": [box(request="1Gi"), box()]}}) == 1024


LIMITS = st.lists(st.one_of(st.none(), st.integers(1, 1 << 20)), min_size=1, max_size=4)


@given(
    claim=st.integers(1, 1 << 30),
    limits=LIMITS,
    node_ram=st.one_of(st.none(), st.integers(1, 1 << 22)),
)
def test_a_running_pod_is_never_recorded_at_more_than_it_can_use(
    claim: int, limits: list[int | None], node_ram: int | None
) -> None:
    body = pod(str(claim), containers=[box(f"{mb}Mi" if mb else None) for mb in limits])
    reservation = written(body, node_ram=node_ram)
    ram = reservation["spec"]["ramMB"]
    limit = None if None in limits else sum(mb for mb in limits if mb)
    cap = limit if limit is not None else node_ram
    assert ram == (claim if cap is None else min(claim, cap))
    assert own(body, reservation, node_ram=node_ram)
    other = changed(reservation, "spec.ramMB", ram - 1 if ram > 1 else 2)
    assert not own(body, other, node_ram=node_ram)


def test_the_cap_keeps_a_claim_that_fits() -> None:
    claim = PodClaim(1024, 512, gpus=2)
    assert capped_claim(claim, 2048, 8192, 1024) is claim
    assert capped_claim(claim, 512, None, 256) == PodClaim(512, 256, gpus=2)
