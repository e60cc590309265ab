"""Limits parse exactly: no float ever reaches an admission decision."""

from __future__ import annotations

from fractions import Fraction

import pytest

from headroom.api.limits import Limits, default_limits
from headroom.api.parse import parse_ratio


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (1, Fraction(1)),
        (1.0, Fraction(1)),
        (1.1, Fraction(11, 10)),
        ("1.5", Fraction(3, 2)),
        ("3/2", Fraction(3, 2)),
        (" 2 ", Fraction(2)),
        (0, Fraction(0)),
        ("0.333", Fraction(333, 1000)),
    ],
)
def test_parse_ratio_is_exact(raw: object, expected: Fraction) -> None:
    assert parse_ratio(raw) == expected


@pytest.mark.parametrize("raw", [-0.1, "abc", "", None, True, [1], "1/0", 101, "nan", "inf"])
def test_parse_ratio_refuses_bad_values_naming_them(raw: object) -> None:
    with pytest.raises(ValueError, match="overcommit ratio") as error:
        parse_ratio(raw)
    assert repr(raw) in str(error.value)


def test_defaults_are_conservative() -> None:
    limits = default_limits()
    assert limits.max_overcommit_ratio == 1
    assert limits.system_reserve_mb == 1024
    assert not limits.unlimited


def test_overrides_replace_only_what_is_given() -> None:
    base = Limits()
    changed = base.with_overrides(system_reserve_mb=0)
    assert changed.system_reserve_mb == 0
    assert changed.max_overcommit_ratio == base.max_overcommit_ratio
    assert changed.max_entries_per_node == base.max_entries_per_node
