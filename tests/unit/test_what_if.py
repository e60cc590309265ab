"""``what_if``'s pure parts: the ``Warning`` headers read back into an outlook.

The API server sends each admission warning as ``299 - "text"`` (Go's quoting: ``"``
and ``\\`` escaped), one header line each, which HTTP libraries may also join into one
value with ``", "``; the outlook's words contain commas, colons and parentheses.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from urllib3 import HTTPHeaderDict

from headroom.api.outlook import CAVEAT, NO_OUTLOOK, Outlook, Verdict
from headroom.cli import _parser
from headroom.cli.exits import Exit, UsageError
from headroom.cli.fit import VERDICT_EXITS, _size
from headroom.client import calls, whatif
from headroom.client.spec import request
from headroom.client.whatif import (
    NO_OUTLOOK_RETURNED,
    WhatIf,
    dry_run_body,
    read_outlook,
    warning_texts,
)

OUTLOOKS = [
    Outlook(Verdict.ADMITTED, "4000 of 10000 MiB RAM free", node="gpu-1"),
    Outlook(
        Verdict.QUEUED,
        "node gpu-1: requested 8192 MiB, allocatable 6144 MiB (RAM 8192, reserved 2048)",
        node="gpu-1",
        reason="InsufficientRAM",
        position=3,
    ),
    Outlook(
        Verdict.REJECTED,
        'spec.wait: "5q" is not a duration, C:\\path, "quoted", a, b',
        reason="InvalidSpec",
    ),
    Outlook(Verdict.UNKNOWN, "this replica does not decide now (a standby, ...)"),
]


def header(text: str, code: int = 299, agent: str = "-") -> str:
    """As the API server writes one warning (Go's ``strconv``-like quoting)."""
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'{code} {agent} "{quoted}"'


@pytest.mark.parametrize("said", OUTLOOKS, ids=lambda o: str(o.verdict))
def test_each_outlook_reads_back_from_its_header(said: Outlook) -> None:
    caveat = f"{CAVEAT}2 reservation(s) on gpu-1 seen earlier are not decided yet and go first"
    for values in (
        [header(said.warning()), header(caveat)],  # one header line each
        [f"{header(said.warning())}, {header(caveat)}"],  # joined into one value
        [f"{header(said.warning())},{header(caveat)}"],
    ):
        found = read_outlook("gpu-1", warning_texts(values))
        assert found.outlook == said
        assert found.caveats == (caveat[len(CAVEAT) :],)
        assert found.lines() == [said.warning(), caveat]


def test_escaped_quotes_backslashes_and_commas_are_kept() -> None:
    text = 'a "quoted" word, a \\ backslash, and a comma'
    assert warning_texts([header(text)]) == [text]
    assert warning_texts([f"{header(text)} , {header('second')}"]) == [text, "second"]


def test_a_date_other_codes_and_malformed_elements_are_handled() -> None:
    dated = '299 kube-apiserver "with a date" "Mon, 07 Dec 2026 16:00:00 GMT"'
    assert warning_texts([dated]) == ["with a date"]
    assert warning_texts([header("stale", code=110), header("kept")]) == ["kept"]
    assert warning_texts(["garbage, " + header("after garbage")]) == ["after garbage"]
    assert warning_texts(['299 - "not closed']) == []
    assert warning_texts(["", "  ", ","]) == []


def test_no_outlook_among_the_warnings_is_unknown_and_says_so() -> None:
    for texts in ([], ["another webhook: label team is deprecated"], [f"{CAVEAT}x"]):
        found = read_outlook("gpu-1", texts)
        assert found.verdict is Verdict.UNKNOWN
        assert found.outlook.detail == NO_OUTLOOK_RETURNED
        assert found.warnings == tuple(texts)
    other = read_outlook("gpu-1", ["another webhook's word", OUTLOOKS[0].warning()])
    assert other.outlook == OUTLOOKS[0]


def test_the_operators_own_no_outlook_is_passed_on() -> None:
    found = read_outlook("gpu-1", [f"{NO_OUTLOOK}this replica does not decide now"])
    assert found.outlook == Outlook(Verdict.UNKNOWN, "this replica does not decide now")


def test_as_json_says_the_verdict_and_its_parts() -> None:
    queued = WhatIf("gpu-1", OUTLOOKS[1], ("x",))
    assert queued.as_json() == {
        "node": "gpu-1",
        "verdict": "Queued",
        "reason": "InsufficientRAM",
        "position": 3,
        "detail": OUTLOOKS[1].detail,
        "caveats": ["x"],
    }


def test_repeated_warning_lines_are_all_read() -> None:
    headers = HTTPHeaderDict()
    headers.add("Warning", header("one"))
    headers.add("warning", header("two"))
    headers.add("Content-Type", "application/json")
    assert calls.header_values(headers, "Warning") == [header("one"), header("two")]
    assert calls.header_values({"WARNING": header("one")}, "Warning") == [header("one")]
    assert calls.header_values(None, "Warning") == []


class FakeCustom:
    """Answers a create as the API server answers a dry run: the object, 201, headers."""

    def __init__(self, headers: Any) -> None:
        self.headers = headers
        self.asked: list[dict[str, Any]] = []

    def create_namespaced_custom_object_with_http_info(self, *args: Any, **kwargs: Any) -> Any:
        self.asked.append({"args": args, **kwargs})
        assert kwargs["_return_http_data_only"] is False
        return args[4], 201, self.headers


class FakeConnection:
    namespace = "ml"

    def __init__(self, headers: Any) -> None:
        self.custom = FakeCustom(headers)


def test_ask_dry_runs_a_generated_name_and_reads_the_answer() -> None:
    headers = HTTPHeaderDict()
    headers.add("Warning", header(OUTLOOKS[1].warning()))
    conn = FakeConnection(headers)
    found = whatif.ask(conn, request(node="gpu-1", ram_mb=8192, wait="5m"), "gpu-1")  # type: ignore[arg-type]
    assert found.outlook == OUTLOOKS[1]
    (asked,) = conn.custom.asked
    assert asked["dry_run"] == "All"
    body = asked["args"][4]
    assert body["metadata"] == {"generateName": whatif.GENERATE_NAME}
    assert body["spec"] == {"node": "gpu-1", "ramMB": 8192, "wait": "5m"}


def test_a_named_claim_is_dry_run_under_its_name() -> None:
    body = dry_run_body(request(node=None, ram_mb=1, name="train-42"), "gpu-2")
    assert body["metadata"] == {"name": "train-42"}
    assert body["spec"]["node"] == "gpu-2"


def test_every_verdict_has_its_exit_code() -> None:
    assert set(VERDICT_EXITS) == set(Verdict)
    assert VERDICT_EXITS[Verdict.ADMITTED] == Exit.DONE
    assert VERDICT_EXITS[Verdict.REJECTED] == Exit.REFUSED
    codes = [VERDICT_EXITS[Verdict.QUEUED], VERDICT_EXITS[Verdict.UNKNOWN]]
    assert len({*codes, Exit.DONE, Exit.REFUSED, Exit.USAGE, Exit.UNREACHABLE}) == 6


def fit_args(*argv: str) -> argparse.Namespace:
    return _parser("kubectl-headroom", with_run=False).parse_args(["fit", *argv])


def test_dry_run_flags_are_checked_before_anything_is_sent() -> None:
    size = _size(fit_args("--ram", "1024", "--dry-run", "--node", "gpu-1", "--wait-for-room", "2m"))
    assert (size.node, size.ram_mb, size.wait) == ("gpu-1", 1024, "2m")
    with pytest.raises(UsageError, match="--node: only with --dry-run"):
        _size(fit_args("--ram", "1024", "--node", "gpu-1"))
    with pytest.raises(UsageError, match="--wait-for-room: only with --dry-run"):
        _size(fit_args("--ram", "1024", "--wait-for-room", "2m"))
    with pytest.raises(UsageError, match="--wait-for-room"):
        _size(fit_args("--ram", "1024", "--dry-run", "--wait-for-room", ".5s"))
    with pytest.raises(UsageError, match="selector"):
        _size(fit_args("--ram", "1024", "--dry-run", "--node", "gpu-1", "-l", "a=b"))
