"""The Reservation follower's resume logic, against scripted watch sessions.

Narrow unit tests of our own code: which resourceVersion each WATCH resumes from,
and when it relists. The real watch is exercised by every integration test and by
the API-server restart in the chaos suite.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from headroom.kube.backoff import Backoff
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport
from headroom.kube.watch import follow


def obj(name: str, version: str) -> JSON:
    return {"metadata": {"name": name, "resourceVersion": version}}


class ScriptedWatches:
    """Each call to ``watch`` plays the next session: events, then an optional error."""

    def __init__(self, *sessions: tuple[list[JSON], BaseException | None]) -> None:
        self.sessions = list(sessions)
        self.versions: list[str] = []
        self.drained = asyncio.Event()  # every session played and its events handled

    async def watch(
        self, path: str, *, resource_version: str, label_selector: str | None = None
    ) -> AsyncIterator[JSON]:
        self.versions.append(resource_version)
        if not self.sessions:
            self.drained.set()
            await asyncio.Event().wait()  # a quiet watch: the test ends here
        events, error = self.sessions.pop(0)
        for event in events:
            yield event
        if error is not None:
            raise error


async def run(
    watches: ScriptedWatches,
    relisted: str = "900",
    fail_on: str | None = None,
    restarts: list[str] | None = None,
) -> tuple[list[tuple[str, str]], int]:
    seen: list[tuple[str, str]] = []
    relists = 0
    restarted = restarts.append if restarts is not None else (lambda reason: None)

    def on_event(kind: str, body: JSON) -> None:
        if body["metadata"]["name"] == fail_on:
            raise RuntimeError("a handler bug")
        seen.append((kind, body["metadata"]["name"]))

    async def relist() -> str:
        nonlocal relists
        relists += 1
        return relisted

    task = asyncio.create_task(
        follow(
            cast(Transport, watches),
            "/rsv",
            "100",
            on_event,
            relist,
            backoff=Backoff(0, 0),
            restarted=restarted,
        )
    )
    await asyncio.wait_for(watches.drained.wait(), timeout=5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return seen, relists


async def test_resumes_from_the_last_event_after_a_broken_connection() -> None:
    watches = ScriptedWatches(
        ([{"type": "ADDED", "object": obj("a", "101")}], ApiUnavailableError("connection reset")),
        ([{"type": "MODIFIED", "object": obj("a", "102")}], None),
    )
    seen, relists = await run(watches)
    assert seen == [("ADDED", "a"), ("MODIFIED", "a")]
    assert watches.versions == ["100", "101", "102"]
    assert relists == 0


async def test_bookmarks_advance_the_version_without_an_event() -> None:
    watches = ScriptedWatches(([{"type": "BOOKMARK", "object": obj("", "150")}], None))
    seen, _ = await run(watches)
    assert seen == []
    assert watches.versions == ["100", "150"]


@pytest.mark.parametrize("how", ["ERROR event", "HTTP 410"])
async def test_an_expired_version_relists_and_watches_from_the_new_list(how: str) -> None:
    gone: Any = (
        ([{"type": "ERROR", "object": {"code": 410, "message": "too old"}}], None)
        if how == "ERROR event"
        else ([], ApiError(410, "Expired", "too old"))
    )
    watches = ScriptedWatches(gone, ([{"type": "DELETED", "object": obj("b", "901")}], None))
    seen, relists = await run(watches)
    assert relists == 1
    assert watches.versions == ["100", "900", "901"]
    assert seen == [("DELETED", "b")]


async def test_other_errors_retry_from_the_same_version_without_relisting() -> None:
    watches = ScriptedWatches(
        ([{"type": "ERROR", "object": {"code": 500, "message": "etcd down"}}], None),
        ([], ApiUnavailableError("read timed out")),
    )
    _, relists = await run(watches)
    assert relists == 0
    assert watches.versions == ["100", "100", "100"]


async def test_a_failing_handler_does_not_end_the_watch() -> None:
    watches = ScriptedWatches(
        (
            [
                {"type": "ADDED", "object": obj("bad", "101")},
                {"type": "ADDED", "object": obj("good", "102")},
            ],
            None,
        ),
    )
    seen, _ = await run(watches, fail_on="bad")
    assert seen == [("ADDED", "good")]
    assert watches.versions == ["100", "102"]


async def test_each_new_stream_is_reported_with_why_the_last_one_ended() -> None:
    """What ``headroom_watch_restarts_total{reason}`` counts: one per stream started again."""
    watches = ScriptedWatches(
        ([{"type": "ADDED", "object": obj("a", "101")}], None),  # the server's timeout
        ([], ApiUnavailableError("connection reset")),
        ([{"type": "ERROR", "object": {"code": 500, "message": "etcd down"}}], None),
        ([{"type": "ERROR", "object": {"code": 410, "message": "too old"}}], None),
        ([], ApiError(410, "Expired", "too old")),
    )
    restarts: list[str] = []
    _, relists = await run(watches, restarts=restarts)
    assert restarts == ["ended", "failed", "failed", "expired", "expired"]
    assert relists == 2
    assert len(watches.versions) == len(restarts) + 1  # the first stream is no restart
