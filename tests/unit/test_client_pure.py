"""The claim library's pure parts: durations as ``spec.wait`` is written, the placement
order, the procedure drivers' handling of interruptions, and the claim procedure's
rarer turns against scripted answers (the real API is in tests/integration)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Generator
from datetime import timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from headroom.api.constants import GO_DURATION
from headroom.client import ClaimRefusedError, Connection, calls, placement, plans, procedure, spec
from headroom.client.spec import WAIT, go_duration


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(minutes=90), "1h30m"),
        (timedelta(hours=24), "24h"),
        (timedelta(seconds=3661), "1h1m1s"),
        (timedelta(milliseconds=1500), "1500ms"),
        (timedelta(microseconds=1000001), "1000001us"),
    ],
)
def test_a_wait_is_written_as_the_schema_wants_it(value: timedelta, written: str) -> None:
    assert go_duration(value) == written
    assert re.fullmatch(GO_DURATION, written)
    assert WAIT.validate_python(written) == value


def headroom(name: str, **status: Any) -> dict[str, Any]:
    figures = {
        "capacityKnown": True,
        "totalRAMMB": 32768,
        "systemReserveMB": 1024,
        "maxOvercommitRatio": "1",
        "limitRAMMB": 31744,
        "reservedRAMMB": 0,
        "allocatableRAMMB": 31744,
        "reservedVRAMMB": 0,
        "activeEntries": 0,
        "staleEntries": 0,
        "maxEntries": 110,
        "utilizationPercent": 0,
        "overCommitted": False,
        "someFieldAddedLater": 1,  # ignored, not refused
        **status,
    }
    return {"metadata": {"name": name}, "status": figures}


NODES = [
    headroom("plain-c", allocatableRAMMB=8000),
    headroom("gpu-b", allocatableRAMMB=8000, vramCapacityMB=16000, reservedVRAMMB=14000),
    headroom("gpu-a", allocatableRAMMB=8000, vramCapacityMB=16000, reservedVRAMMB=4000),
    headroom("big", allocatableRAMMB=20000),
    headroom("full", allocatableRAMMB=100, reservedRAMMB=31644),
    headroom("capped", activeEntries=3, maxEntries=3),
    headroom("no-gpu-room", allocatableRAMMB=8000, vramCapacityMB=1000, reservedVRAMMB=500),
    headroom("unknown", capacityKnown=False, allocatableRAMMB=0),
    {"metadata": {"name": "new"}},
]


def test_nodes_are_ranked_by_ram_then_free_vram_then_name() -> None:
    rooms = placement.rank(NODES, ram_mb=4096, vram_mb=1024)
    assert [(r.node, r.fits) for r in rooms[:4]] == [
        ("big", True),
        ("gpu-a", True),  # 12000 MiB of VRAM free
        ("gpu-b", True),  # 2000
        ("plain-c", True),  # VRAM capacity unknown: after every known one
    ]
    assert {r.node: r.why_not for r in rooms[4:]} == {
        "capped": "entry cap reached (3/3)",
        "full": "allocatable 100 MiB < 4096 MiB",
        "new": "no figures published yet",
        "no-gpu-room": "free VRAM 500 MiB < 1024 MiB",
        "unknown": "capacity unknown",
    }
    assert [r.node for r in rooms[4:]] == sorted(r.node for r in rooms[4:])


def test_a_claim_that_may_wait_queues_where_it_could_fit_once_others_leave() -> None:
    rooms = placement.rank(NODES, ram_mb=30000, vram_mb=0)
    assert placement.candidates(rooms, may_wait=False, most=3) == []
    later = placement.candidates(rooms, may_wait=True, most=3)
    assert [r.node for r in later] == ["capped", "big", "gpu-a"]  # the same rule; limits hold it
    message = placement.no_room(rooms, 30000, 0, "gpu=a100")
    assert message.startswith("no node matching 'gpu=a100' has room for 30000 MiB RAM now (")
    assert "capped: entry cap reached (3/3)" in message
    assert message.endswith("; and 1 more)")  # nine nodes: eight shown


def cleaning_plan(log: list[str]) -> Generator[plans.Step, Any, str]:
    try:
        yield from plans.call(log.append, "created")
        yield from plans.pause(10)
        return "finished"
    except BaseException:
        yield from plans.call(log.append, "deleted")
        raise


def test_an_interruption_is_thrown_into_the_procedure_whose_clean_up_still_runs() -> None:
    log: list[str] = []

    def interrupted_sleep(seconds: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        plans.run(cleaning_plan(log), sleep=interrupted_sleep)
    assert log == ["created", "deleted"]
    log.clear()
    assert plans.run(cleaning_plan(log), sleep=lambda _: None) == "finished"
    assert log == ["created"]


async def test_a_cancellation_waits_for_the_call_in_flight_then_cleans_up() -> None:
    log: list[str] = []
    started = threading.Event()

    def slow_create() -> None:
        started.set()
        time.sleep(0.3)
        log.append("created")

    def plan() -> Generator[plans.Step, Any, None]:
        try:
            yield from plans.call(slow_create)
            yield from plans.pause(10)
        except asyncio.CancelledError:
            yield from plans.call(log.append, "deleted")
            raise

    task = asyncio.create_task(plans.run_async(plan()))
    await asyncio.to_thread(started.wait)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["created", "deleted"]  # the clean-up saw the create land


class FakeReservations:
    """The API calls a claim makes, answered from a script of statuses."""

    def __init__(self, statuses: list[dict[str, Any] | None]) -> None:
        self.statuses, self.conflicts = statuses, 0
        self.deleted: list[tuple[str, str]] = []
        self.created: list[dict[str, Any]] = []

    def obj(self, status: dict[str, Any] | None) -> dict[str, Any]:
        body = self.created[-1]
        meta = {"name": body["metadata"]["name"], "uid": "u-1", "resourceVersion": "7"}
        return {"metadata": meta, "spec": body["spec"], **({"status": status} if status else {})}

    def create(self, conn: Any, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append(body)
        return self.obj(None)

    def get(self, conn: Any, name: str) -> dict[str, Any]:
        return self.obj(self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0])

    def delete(self, conn: Any, name: str, uid: str, resource_version: str | None = None) -> None:
        if resource_version is not None:  # a decision landed since it was last seen
            self.conflicts += 1
            raise ApiException(status=409, reason="Conflict")
        self.deleted.append((name, uid))


def fake_calls(
    monkeypatch: pytest.MonkeyPatch, statuses: list[dict[str, Any] | None]
) -> FakeReservations:
    fake = FakeReservations(statuses)
    for name in ("create", "get", "delete"):
        monkeypatch.setattr(calls, name, getattr(fake, name))
    return fake


CONN = Connection(api=None, namespace="ml")  # type: ignore[arg-type]


def test_reclaimed_before_it_was_seen_admitted_is_a_refusal_and_it_is_deleted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reclaimed = {"phase": "Reclaimed", "reason": "OwnerPodDeleted", "message": "pod p is gone"}
    queued = {"phase": "Queued", "queuePosition": 1, "reason": "InsufficientRAM", "message": "m"}
    fake = fake_calls(monkeypatch, [queued, reclaimed])
    request = spec.request(node="n1", ram_mb=64, name="job")
    lines: list[str] = []
    with pytest.raises(ClaimRefusedError) as refused:
        plans.run(
            procedure.obtain(CONN, request, timeout=timedelta(seconds=30), report=lines.append),
            sleep=lambda _: None,
        )
    assert (refused.value.phase, refused.value.reason) == ("Reclaimed", "OwnerPodDeleted")
    assert "pod p is gone" in str(refused.value)
    assert fake.deleted == [("job", "u-1")]
    assert lines == ["reservation ml/job queued on node n1 at position 1 (InsufficientRAM: m)"]


def test_a_decision_that_lands_while_giving_up_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    admitted = {"phase": "Admitted", "reason": "Fits", "message": "node n1: reserved 64 MiB"}
    fake = fake_calls(monkeypatch, [admitted])  # the create answers Pending; then it is decided
    request = spec.request(node="n1", ram_mb=64, name="job")
    plan = procedure.obtain(CONN, request, timeout=timedelta(microseconds=1), report=print)
    held = plans.run(plan, sleep=lambda _: pytest.fail("no pause: the timeout came first"))
    assert fake.conflicts == 1  # the delete as last seen was refused: it had changed
    assert (held.name, held.node, held.message) == ("job", "n1", "node n1: reserved 64 MiB")
    assert fake.deleted == []
