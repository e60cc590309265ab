"""The status writer's one promise: the object ends up carrying its record's newest decision.

Found on the real control plane under load (test_pod_gates_edits.py::
test_a_pod_is_not_pinned_to_a_node_cordoned_before_its_ungate, failing in CI): a
reservation's Queued write was answered, and before the task that made it had
ended, the admission found room and decided it Admitted. ``ensure`` saw the write
still in flight and left it to that attempt, which had already returned; nothing
wrote the admission until the next resync, and the gated pod waited for it.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime

from headroom.api.limits import Limits
from headroom.api.reasons import Phase, Reason
from headroom.control.state import Record, State
from headroom.control.telemetry import NoTelemetry
from headroom.control.writer import StatusWriter
from headroom.kube.transport import JSON
from headroom.objects.status import StatusDecision
from headroom_dev.sim.loop import VirtualClock, run_virtual

AT = datetime(2026, 12, 6, tzinfo=UTC)


class Recorded:
    """A transport that answers every status patch at once and keeps what it was sent."""

    def __init__(self) -> None:
        self.phases: list[str] = []

    async def json_patch(self, path: str, operations: list[JSON]) -> JSON:
        await asyncio.sleep(0.1)
        self.phases.append(operations[-1]["value"]["phase"])
        return {}


def test_a_decision_changed_as_its_previous_write_is_confirmed_is_written_too() -> None:
    async def scenario() -> None:
        state = State(Limits())
        queued = StatusDecision(
            Phase.QUEUED, Reason.INSUFFICIENT_RAM, "waits", AT, decision_id="d1"
        )
        record = Record("uid-1", "ml", "r", "n1", queued)
        assert state.remember(record)
        transport = Recorded()
        writer: StatusWriter

        def admit_in_the_moment_after(confirmed: Record) -> None:
            # The admission's next turn comes before the write's task has ended.
            def admit() -> None:
                record.decision = StatusDecision(
                    Phase.ADMITTED, Reason.FITS, "fits", AT, decision_id="d2"
                )
                record.confirmed = False
                writer.ensure(record.uid)

            if confirmed.decision.phase == Phase.QUEUED:
                asyncio.get_running_loop().call_soon(admit)

        writer = StatusWriter(
            state,
            transport,  # type: ignore[arg-type]
            VirtualClock(),
            NoTelemetry(),
            may_act=lambda: True,
            time_left=lambda: 60.0,
            on_gone=lambda uid: None,
            on_confirmed=admit_in_the_moment_after,
            rng=random.Random(1),
        )
        writer.ensure(record.uid)
        await asyncio.sleep(5)
        assert transport.phases == ["Queued", "Admitted"]
        assert record.confirmed
        assert len(writer) == 0
        await writer.stop()

    run_virtual(scenario(), max_virtual_seconds=60)
