"""The outlook must say what the decision then made says (the property tests' check)."""

from __future__ import annotations

from headroom.api.outlook import Outlook, Verdict
from headroom.ledger import Decision


def assert_outlook_says(foreseen: Outlook, decision: Decision) -> None:
    """``foreseen`` (asked just before) agrees with ``decision``: the same phase, and the
    same reason, message and queue position; an admission on the node it named."""
    if decision.admitted:
        assert foreseen.verdict is Verdict.ADMITTED, (foreseen, decision)
        assert foreseen.node == decision.entry.node
        return
    if decision.queued:
        assert foreseen.verdict is Verdict.QUEUED, (foreseen, decision)
        assert foreseen.position == decision.position, (foreseen, decision)
        assert decision.message.startswith(foreseen.detail), (foreseen, decision)
    else:
        assert foreseen.verdict is Verdict.REJECTED, (foreseen, decision)
        assert foreseen.detail == decision.message, (foreseen, decision)
    assert foreseen.reason == str(decision.reason), (foreseen, decision)
