"""Ratios as people read them: exact decimals when they terminate, else ``n/d``."""

from __future__ import annotations

from fractions import Fraction


def format_ratio(ratio: Fraction) -> str:
    """Exact decimal when it terminates (``1.5``), else ``n/d``."""
    if ratio.denominator == 1:
        return str(ratio.numerator)
    denominator = ratio.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    if denominator != 1:
        return f"{ratio.numerator}/{ratio.denominator}"
    digits = 0
    while (ratio * 10**digits).denominator != 1:
        digits += 1
    scaled = ratio.numerator * 10**digits // ratio.denominator
    text = str(scaled).rjust(digits + 1, "0")
    return f"{text[:-digits]}.{text[-digits:]}"
