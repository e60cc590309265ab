"""Strict mode's answer at create is kept (issue 32), replayed on the fake API server.

Both found by the simulation's webhook reviews (``headroom_dev.sim.reviews``; the seeds
are those of its first draft, before the noisy tenant's creates were reviewed too):

- an API server that calls the webhook again for the same create (a retry: the same
  uid) was told "rejected" the second time, refused at create, because the room the
  first answer held for that very uid counted against it (seeds 163, 246, 491: the
  last room; 81, 350, 382: "would wait" with a wait);
- under StrictFIFO a reservation created just before, not seen yet when the answer
  was given, was decided first: the hold had taken its room, so it waited; then the
  strict create, told "would be admitted", was refused WaitersAhead behind it (seed 69).
"""

from __future__ import annotations

import asyncio
from typing import Any

from headroom.api.config import OperatorConfig
from headroom.api.constants import OUTLOOK_MODE, STRICT
from headroom.api.outlook import Verdict, parse_warning
from headroom.control.controller import Controller
from headroom.control.outlook import OutlookAnswer
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.loop import VirtualClock, run_virtual

NS = "ml"
STRICT_MODE = {OUTLOOK_MODE: STRICT}


async def _leader(server: FakeApiServer, config: OperatorConfig) -> Controller:
    server.ensure_namespace(NS, labels=STRICT_MODE)  # only the label holds room
    server.put_node("n1", memory=8192)
    controller = Controller(config, server.client("operator"), clock=VirtualClock())
    await controller.start()
    await asyncio.sleep(1)
    return controller


def _verdict(answer: OutlookAnswer) -> Verdict | None:
    found = parse_warning(answer.warnings[0])
    return found.verdict if found is not None else None


def _phase(server: FakeApiServer, name: str) -> Any:
    [obj] = [r for r in server.reservations(NS) if r["metadata"]["name"] == name]
    return (obj.get("status") or {}).get("phase")


def test_a_review_of_the_same_create_again_is_told_the_same() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        controller = await _leader(server, OperatorConfig())
        free = controller.state.ledger.allocatable_ram("n1")
        answers: list[OutlookAnswer] = []

        def review(obj: dict[str, Any]) -> None:  # called twice: the API server retried
            for _ in range(2):
                answers.append(controller.outlook.answer(obj))
            assert answers[-1].refusal is None, answers[-1].refusal

        server.create_reservation(NS, "r", "n1", free, annotations=STRICT_MODE, review=review)
        assert [_verdict(a) for a in answers] == [Verdict.ADMITTED, Verdict.ADMITTED]
        assert len(controller.holds) == 1  # one hold, not two
        await asyncio.sleep(2)
        assert _phase(server, "r") == "Admitted"
        assert len(controller.holds) == 0
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


def test_under_strict_fifo_one_created_just_before_does_not_undo_the_promise() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        config = OperatorConfig.model_validate({"queueing": {"strategy": "StrictFIFO"}})
        controller = await _leader(server, config)
        free = controller.state.ledger.allocatable_ram("n1")
        server.create_reservation(NS, "a", "n1", free, wait="60s")  # not seen yet:
        answers: list[OutlookAnswer] = []
        server.create_reservation(
            NS, "b", "n1", free, annotations=STRICT_MODE,
            review=lambda obj: answers.append(controller.outlook.answer(obj)),
        )  # fmt: skip
        [answer] = answers
        assert _verdict(answer) is Verdict.ADMITTED
        assert answer.refusal is None
        await asyncio.sleep(2)
        assert _phase(server, "b") == "Admitted"  # as it was told
        assert _phase(server, "a") == "Queued"  # its room was promised first
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)
