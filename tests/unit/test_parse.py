"""The parsers are total: a value in bounds or InvalidValueError naming it, for any input.

Hypothesis feeds them arbitrary text and objects; its per-example deadline
(200 ms) is what would catch a parser that expands an exponent. The named cases
are the ones that once stopped every decision in the cluster (issue 14).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.api.constants import MAX_MB, MAX_RATIO, MAX_TIME, MIN_TIME
from headroom.api.parse import (
    InvalidValueError,
    memory_mib,
    parse_duration,
    parse_int,
    parse_ratio,
    parse_time,
)

ANYTHING = st.one_of(
    st.text(max_size=200),
    st.text(alphabet="0123456789eE+-.:/TZz ,KMGTPEimnuk", max_size=80),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.datetimes(timezones=st.timezones()),
    st.timedeltas(),
)
T = TypeVar("T")


def parsed_or_refused(parse: Callable[[object, str], T], value: object, field: str) -> T | str:
    """The parsed value, or the refusal's message (asserted on outside any except block)."""
    try:
        return parse(value, field)
    except InvalidValueError as error:
        return str(error)


@given(ANYTHING)
def test_parse_time_is_total_and_bounded(value: object) -> None:
    moment = parsed_or_refused(parse_time, value, "spec.expiresAt")
    if isinstance(moment, str):
        assert moment.startswith("spec.expiresAt: ")
    else:
        assert moment.tzinfo is UTC
        assert MIN_TIME <= moment < MAX_TIME


@given(ANYTHING)
def test_parse_ratio_is_total_and_bounded(value: object) -> None:
    ratio = parsed_or_refused(parse_ratio, value, "annotation r")
    if isinstance(ratio, str):
        assert ratio.startswith("annotation r: ")
    else:
        assert 0 <= ratio <= MAX_RATIO


@given(ANYTHING)
def test_memory_mib_is_total_and_bounded(value: object) -> None:
    mib = parsed_or_refused(memory_mib, value, "status.allocatable.memory")
    if isinstance(mib, str):
        assert mib.startswith("status.allocatable.memory: ")
    else:
        assert 0 <= mib <= MAX_MB


@given(ANYTHING)
def test_parse_duration_is_total_and_bounded(value: object) -> None:
    duration = parsed_or_refused(parse_duration, value, "sweepPeriod")
    if isinstance(duration, str):
        assert duration.startswith("sweepPeriod: ")
    else:
        assert timedelta(milliseconds=1) <= duration <= timedelta(days=366)


@given(ANYTHING)
def test_parse_int_is_total_and_bounded(value: object) -> None:
    number = parsed_or_refused(lambda v, f: parse_int(v, f, 1, 100_000), value, "annotation n")
    if isinstance(number, str):
        assert number.startswith("annotation n: ")
    else:
        assert 1 <= number <= 100_000


@pytest.mark.parametrize(
    "value",
    [
        "9999-12-31T23:59:59-14:00",  # overflows when converted to UTC
        "0001-01-01T00:00:00+14:00",  # underflows when converted to UTC
        "9000-01-01T00:00:00Z",  # the first moment past the bound
        "1969-12-31T23:59:59Z",
        "2026-02-30T10:00:00Z",
        "2026-12-03T10:00:00",  # no zone
        "x" * 10_000,
    ],
)
def test_times_out_of_range_or_malformed_are_refused_naming_the_value(value: str) -> None:
    with pytest.raises(InvalidValueError, match=r"spec\.expiresAt") as error:
        parse_time(value, "spec.expiresAt")
    assert value[:20] in str(error.value) or "characters long" in str(error.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-12-03T10:00:00Z", datetime(2026, 12, 3, 10, tzinfo=UTC)),
        ("2026-12-03T12:00:00+02:00", datetime(2026, 12, 3, 10, tzinfo=UTC)),
        ("2026-12-03T10:00:00.123456789Z", datetime(2026, 12, 3, 10, 0, 0, 123456, tzinfo=UTC)),
        ("2026-12-03T10:00:00,5Z", datetime(2026, 12, 3, 10, 0, 0, 500000, tzinfo=UTC)),
        ("8999-12-31T23:59:59Z", datetime(8999, 12, 31, 23, 59, 59, tzinfo=UTC)),
    ],
)
def test_times_the_api_server_accepts_are_read(value: str, expected: datetime) -> None:
    assert parse_time(value) == expected


@pytest.mark.parametrize(
    "value", ["1e20000000", "1e999999999999999999", "1e-20000000", "1.0000000001", "1e3"]
)
def test_ratio_exponents_are_refused_before_they_are_expanded(value: str) -> None:
    with pytest.raises(InvalidValueError, match="overcommit ratio"):
        parse_ratio(value)


@pytest.mark.parametrize(
    ("value", "expected"), [("0e99999999", Fraction(0)), ("1.5e1", Fraction(15)), ("1e2", 100)]
)
def test_ratio_exponents_in_range_are_exact(value: str, expected: Fraction) -> None:
    assert parse_ratio(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("32Gi", 32 * 1024),
        ("1e9", 953),
        ("500M", 476),
        ("1023Ki", 0),
        ("0", 0),
        ("1e-99999999999", 0),
        (f"{MAX_MB}Mi", MAX_MB),
        (17179869184, 16384),
    ],
)
def test_memory_quantities(value: object, expected: int) -> None:
    assert memory_mib(value) == expected


@pytest.mark.parametrize("value", ["1e40", "999Ei", "1e999999999999", f"{MAX_MB + 1}Mi", "-1Gi"])
def test_memory_beyond_the_bound_is_an_error_not_an_exception_of_another_kind(value: str) -> None:
    with pytest.raises(InvalidValueError, match=r"status.capacity.memory: .*"):
        memory_mib(value, "status.capacity.memory")


@pytest.mark.parametrize("value", ["0.0001ms", "99999999999h", "1e400", -1, 0, "5d", "1h 30m"])
def test_durations_out_of_bounds_are_refused(value: object) -> None:
    with pytest.raises(InvalidValueError, match="duration"):
        parse_duration(value)
