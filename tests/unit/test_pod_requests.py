"""Memory the scheduler gave away (``ledger.podrequests``) and what it does to the limit."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.ledger import Entry, Ledger, Owner
from headroom.ledger.podrequests import PodRequests
from headroom.objects.podmemory import memory_request_mb

T0 = datetime(2026, 12, 4, tzinfo=UTC)
PODS = st.sampled_from([("ml", "a"), ("ml", "b"), ("ci", "a")])
NODES = st.sampled_from(["n1", "n2"])
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), PODS, NODES, st.integers(0, 10_000)),
        st.tuples(st.just("remove"), PODS, NODES, st.just(0)),
        st.tuples(st.just("claim"), PODS, NODES, st.integers(-5_000, 5_000)),
    ),
    max_size=60,
)


@given(OPERATIONS)
def test_each_node_counts_what_its_pods_requested_beyond_their_claims_on_it(
    operations: list[tuple[str, tuple[str, str], str, int]],
) -> None:
    """Only a claim on the node a pod runs on offsets its request there: one it holds on
    another node (a launcher reserving for its workers) hides nothing of its own."""
    pods = PodRequests()
    placed: dict[tuple[str, str], tuple[str, int]] = {}
    claims: dict[tuple[tuple[str, str], str], int] = {}
    for verb, key, node, mb in operations:
        if verb == "set":
            moved = pods.set_pod(key, node, mb)
            placed[key] = (node, mb)
        elif verb == "remove":
            moved = pods.remove_pod(key)
            placed.pop(key, None)
        else:
            moved = pods.claim(key, node, mb)
            claims[(key, node)] = claims.get((key, node), 0) + mb
        for name in ("n1", "n2"):
            expected = sum(
                max(0, request - claims.get((k, at), 0))
                for k, (at, request) in placed.items()
                if at == name
            )
            assert pods.on(name) == expected
        assert moved <= {"n1", "n2"}


def test_a_claim_on_another_node_hides_nothing_of_the_pods_request() -> None:
    book = Ledger(Limits(system_reserve_mb=0))
    book.set_node_capacity("n1", 10_000)
    book.set_node_capacity("n2", 10_000)
    book.set_pod_request(("ml", "launcher"), "n1", 3000)
    # It reserves on n2 for its workers: n1 still carries its whole request, and n2 no
    # request of it at all.
    workers = Entry("ml/workers", "n2", 2000, T0, T0, owner=Owner(pod="launcher"))
    assert book.reserve(workers, T0).admitted
    assert book.node_summary("n1", T0).pod_requests_mb == 3000
    assert book.node_summary("n2", T0).pod_requests_mb == 0
    assert book.allocatable_ram("n1") == 7000
    assert book.allocatable_ram("n2") == 8000
    # Its own claim on n1 offsets it there, and only that one.
    own = Entry("ml/own", "n1", 1000, T0, T0, owner=Owner(pod="launcher"))
    assert book.reserve(own, T0).admitted
    assert book.node_summary("n1", T0).pod_requests_mb == 2000
    book.release("ml/workers")
    assert book.node_summary("n1", T0).pod_requests_mb == 2000


def entry(name: str, ram: int, pod: str | None = None) -> Entry:
    return Entry(f"ml/{name}", "n1", ram, T0, T0, owner=Owner(pod=pod))


def test_pods_without_reservations_leave_the_limit_and_claims_offset_their_requests() -> None:
    book = Ledger(Limits(system_reserve_mb=1024))
    book.set_node_capacity("n1", 10_240)  # limit 9216
    assert book.set_pod_request(("ml", "web"), "n1", 2048) == {"n1"}
    assert book.allocatable_ram("n1") == 7168
    refused = book.reserve(entry("big", 8192), T0)
    assert refused.reason == Reason.INSUFFICIENT_RAM
    assert "(total 10240 × 1 − reserve 1024 − pods 2048 − reserved 0)" in refused.message
    # A pod that holds a reservation counts only by what it asked beyond its claim.
    book.set_pod_request(("ml", "train"), "n1", 3072)
    assert book.node_summary("n1", T0).pod_requests_mb == 5120
    assert book.reserve(entry("train", 2048, pod="train"), T0).admitted
    assert book.node_summary("n1", T0).pod_requests_mb == 2048 + 1024
    assert book.allocatable_ram("n1") == 9216 - 3072 - 2048
    book.release("ml/train")
    assert book.node_summary("n1", T0).pod_requests_mb == 5120
    book.remove_pod_request(("ml", "train"))
    book.remove_pod_request(("ml", "web"))
    assert book.allocatable_ram("n1") == 9216


def test_a_node_seen_after_its_pods_starts_with_their_requests() -> None:
    book = Ledger(Limits(system_reserve_mb=0))
    book.set_pod_request(("ml", "web"), "late", 1000)
    book.set_node_capacity("late", 4000)
    assert book.allocatable_ram("late") == 3000


def test_a_pods_request_is_what_the_scheduler_books() -> None:
    def pod(**spec: object) -> dict[str, object]:
        return {"spec": spec}

    def box(memory: str, **more: object) -> dict[str, object]:
        return {"name": "c", "resources": {"requests": {"memory": memory}}, **more}

    assert memory_request_mb(pod(containers=[box("1Gi"), box("512Mi")])) == 1536
    assert memory_request_mb(pod(containers=[box("1Gi")], initContainers=[box("3Gi")])) == 3072
    sidecar = box("256Mi", restartPolicy="Always")
    assert memory_request_mb(pod(containers=[box("1Gi")], initContainers=[sidecar])) == 1280
    assert memory_request_mb(pod(containers=[box("1G")], overhead={"memory": "1Mi"})) == 955
    assert memory_request_mb(pod(containers=[{"name": "c"}])) == 0
