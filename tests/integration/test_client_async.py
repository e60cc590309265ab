"""The asyncio variant, ``claim_async``: the same claim, and the event loop never waits.

The official client blocks, so the proof that the loop never waits on the network
is where each API call runs: every one is recorded with its thread, and none may
run on the loop's thread. A heartbeat task keeps the claim past its stale window
while the loop does other work, and a cancelled task releases its claim, also
while it waits in the queue.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from headroom.client import ClaimRefusedError, Connection, calls, claim_async
from headroom_dev import reservations as rsv
from tests.polling import eventually


def phases(custom: client.CustomObjectsApi, namespace: str) -> dict[str, str | None]:
    return {
        item["metadata"]["name"]: (item.get("status") or {}).get("phase")
        for item in rsv.list_all(custom, namespace)
    }


@pytest.fixture
def call_threads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, threading.Thread]]:
    """Every API call the library makes, with the thread that made it."""
    seen: list[tuple[str, threading.Thread]] = []
    for name in ("create", "get", "heartbeat", "delete", "node_headroom", "node_headrooms"):
        original: Callable[..., Any] = getattr(calls, name)

        def recorded(*args: Any, _call: Callable[..., Any] = original, _name: str = name) -> Any:
            seen.append((_name, threading.current_thread()))
            return _call(*args)

        monkeypatch.setattr(calls, name, recorded)
    return seen


async def test_an_async_claim_is_kept_by_a_task_and_released_off_the_loop(
    claim_node: str,
    connection: Connection,
    custom: client.CustomObjectsApi,
    namespace: str,
    call_threads: list[tuple[str, threading.Thread]],
) -> None:
    loop_thread = threading.current_thread()
    async with claim_async(claim_node, ram_mb=1024, connection=connection, name="async") as held:
        assert held.heartbeat_interval == pytest.approx(1.0)
        await asyncio.sleep(6)  # twice the stale window, the loop free all along
        assert await asyncio.to_thread(phases, custom, namespace) == {"async": "Admitted"}
        assert held.lost is None
    assert held.released
    assert phases(custom, namespace) == {}
    made = [name for name, _ in call_threads]
    assert made.count("create") == 1
    assert made.count("heartbeat") >= 5
    assert made.count("delete") == 1
    assert all(thread is not loop_thread for _, thread in call_threads)


async def test_an_async_refusal_raises_with_the_numbers(
    claim_node: str, connection: Connection, custom: client.CustomObjectsApi, namespace: str
) -> None:
    with pytest.raises(ClaimRefusedError) as refused:
        async with claim_async(claim_node, ram_mb=0, vram_mb=8192, connection=connection):
            pytest.fail("the block of a refused claim must not run")
    assert refused.value.reason == "InsufficientVRAM"
    assert "8192" in refused.value.message
    assert phases(custom, namespace) == {}


async def test_a_cancelled_task_releases_its_claim_held_or_queued(
    claim_node: str, connection: Connection, custom: client.CustomObjectsApi, namespace: str
) -> None:
    admitted = asyncio.Event()

    async def holder(name: str, ram_mb: int, wait: str | None = None) -> None:
        async with claim_async(
            claim_node, ram_mb=ram_mb, wait=wait, name=name, connection=connection
        ):
            admitted.set()
            await asyncio.sleep(120)

    holding = asyncio.create_task(holder("holding", 6144))
    await asyncio.wait_for(admitted.wait(), 20)
    queued = asyncio.create_task(holder("queued", 4096, wait="2m"))

    def waits() -> None:
        assert phases(custom, namespace) == {"holding": "Admitted", "queued": "Queued"}

    await asyncio.to_thread(eventually, waits)
    for task in (queued, holding):
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert phases(custom, namespace) == {}
