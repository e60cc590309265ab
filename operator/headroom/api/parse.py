"""Total parsers for every value a tenant, a Node or a config file can set.

Each parser returns a value inside its figure's bounds (see ``constants``) or
raises :class:`InvalidValueError` naming the field and the value, for *any* input,
in time and memory bounded by ``MAX_VALUE_LENGTH``. Why this matters: one
reservation's ``expiresAt`` of ``9999-12-31T23:59:59-14:00`` once raised
``OverflowError`` deep in the admission loop and stopped every decision in the
cluster, and a ratio of ``1e20000000`` made ``Fraction`` compute a number with
twenty million digits. So no parser here lets an exponent, a time zone or a
digit count reach arithmetic before it is checked against its bound.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, timezone
from fractions import Fraction

from headroom.api.constants import (
    MAX_DURATION,
    MAX_MB,
    MAX_RATIO,
    MAX_RATIO_DECIMALS,
    MAX_TIME,
    MAX_VALUE_LENGTH,
    MIN_TIME,
)


class InvalidValueError(ValueError):
    """A value that does not parse, or lies outside its bounds; the message says which."""


def shown(value: object, limit: int = 80) -> str:
    """``repr`` of a value, cut short: error messages quote what they refuse."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def _fail(field: str, problem: str) -> InvalidValueError:
    return InvalidValueError(f"{field}: {problem}" if field else problem)


def _short_text(value: object, field: str, what: str) -> str:
    if not isinstance(value, str):
        raise _fail(field, f"{what} must be a string, got {shown(value)}")
    text = value.strip()
    if len(text) > MAX_VALUE_LENGTH:
        raise _fail(
            field,
            f"{what} is {len(text)} characters long, at most {MAX_VALUE_LENGTH}: {shown(value)}",
        )
    return text


# -- times ----------------------------------------------------------------------------------

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)


def format_time(moment: datetime) -> str:
    """RFC 3339 with a Z, second precision, as Kubernetes writes times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object, field: str = "") -> datetime:
    """An RFC 3339 time (or an aware datetime) -> aware UTC datetime in ``[MIN_TIME, MAX_TIME)``."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise _fail(field, f"a time needs a zone: {shown(value)}")
        try:
            return _bounded(value.astimezone(UTC), value, field)
        except OverflowError:
            raise _fail(field, _outside_times(value)) from None
    text = _short_text(value, field, "a time")
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise _fail(field, f"not an RFC 3339 time (e.g. 2026-12-03T10:00:00Z): {shown(value)}")
    year, month, day, hour, minute, second, fraction, zulu, sign, zh, zm = match.groups()
    try:
        if zulu:
            zone = UTC
        else:
            offset = timedelta(hours=int(zh), minutes=int(zm))
            zone = timezone(-offset if sign == "-" else offset)
        micros = int((fraction or "0")[:6].ljust(6, "0"))
        local = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micros, zone
        )
        moment = local.astimezone(UTC)
    except ValueError:
        raise _fail(field, f"not a valid time: {shown(value)}") from None
    except OverflowError:  # e.g. year 9999 at -14:00 is year 10000 in UTC
        raise _fail(field, _outside_times(value)) from None
    return _bounded(moment, value, field)


def _outside_times(value: object) -> str:
    return f"{shown(value)} is outside {format_time(MIN_TIME)} .. {format_time(MAX_TIME)}"


def _bounded(moment: datetime, value: object, field: str) -> datetime:
    if not MIN_TIME <= moment < MAX_TIME:
        raise _fail(field, _outside_times(value))
    return moment


# -- durations --------------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(
    value: object,
    field: str = "",
    *,
    low: timedelta = timedelta(milliseconds=1),
    high: timedelta = MAX_DURATION,
) -> timedelta:
    """``"5m"``, ``"1h30m"``, ``"250ms"`` (Go syntax) or seconds as a number, in [low, high]."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value) if abs(value) < 1e300 else math.inf
    elif isinstance(value, str):
        text = _short_text(value, field, "a duration")
        parts = _DURATION_PART.findall(text)
        if not text or _DURATION_PART.sub("", text) != "":
            raise _fail(field, f"not a duration (use e.g. 90s, 5m, 1h30m): {shown(value)}")
        seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    else:
        raise _fail(field, f"not a duration (use e.g. 90s, 5m, 1h30m): {shown(value)}")
    if not math.isfinite(seconds) or not low.total_seconds() <= seconds <= high.total_seconds():
        raise _fail(
            field,
            f"duration {shown(value)} is outside {_human(low)} .. {_human(high)}",
        )
    return timedelta(seconds=seconds)


def _human(duration: timedelta) -> str:
    seconds = duration.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0 and (unit != "d" or seconds > 86400):
            return f"{int(seconds // size)}{unit}"
    return f"{seconds * 1000:g}ms"


# -- numbers ----------------------------------------------------------------------------------

_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_FRACTION = re.compile(r"(\d+)\s*/\s*(\d+)")


def parse_int(value: object, field: str, low: int, high: int) -> int:
    """A whole number in ``[low, high]``, from an int or its decimal digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        text = _short_text(value, field, "a whole number")
        if not _INTEGER.fullmatch(text):
            raise _fail(field, f"not a whole number: {shown(value)}")
        number = int(text)
    if not low <= number <= high:
        raise _fail(field, f"{shown(value)} is outside {low} .. {high}")
    return number


def parse_ratio(value: object, field: str = "") -> Fraction:
    """An overcommit ratio, exactly: ``1.5``, ``"1.5"``, ``"3/2"``; 0 .. MAX_RATIO.

    Floats are read through their shortest ``repr`` (``1.1`` is 11/10). Decimals
    are checked for size and precision before they become a Fraction, so an
    exponent of any size costs nothing.
    """
    outside = f"overcommit ratio {shown(value)} is outside 0 .. {MAX_RATIO}"
    if isinstance(value, bool):
        raise _fail(field, f"an overcommit ratio must be a number, got {shown(value)}")
    if isinstance(value, Fraction | int):
        ratio = Fraction(value)
    elif isinstance(value, float):
        if not math.isfinite(value) or not 0 <= value <= MAX_RATIO:
            raise _fail(field, outside)
        ratio = _decimal_ratio(repr(value), value, field)
    elif isinstance(value, str):
        text = _short_text(value, field, "an overcommit ratio")
        if match := _FRACTION.fullmatch(text):
            numerator, denominator = int(match[1]), int(match[2])
            if denominator == 0:
                raise _fail(field, f"overcommit ratio {shown(value)} divides by zero")
            ratio = Fraction(numerator, denominator)
        elif _DECIMAL.fullmatch(text):
            ratio = _decimal_ratio(text, value, field)
        else:
            raise _fail(field, f"an overcommit ratio must be a number, got {shown(value)}")
    else:
        raise _fail(field, f"an overcommit ratio must be a number, got {shown(value)}")
    if not 0 <= ratio <= MAX_RATIO:
        raise _fail(field, outside)
    return ratio


def _decimal_ratio(text: str, value: object, field: str) -> Fraction:
    negative, significant, exponent = _decimal_parts(text)
    if not significant:
        return Fraction(0)
    trailing = len(significant) - len(significant.rstrip("0"))
    places = -(exponent + trailing)  # decimal places of the exact value
    magnitude = len(significant) + exponent - 1  # power of ten of its first digit
    if negative or magnitude > 2:  # negative, or 1000 and above: out of range, never expanded
        raise _fail(field, f"overcommit ratio {shown(value)} is outside 0 .. {MAX_RATIO}")
    if places > MAX_RATIO_DECIMALS:
        raise _fail(
            field,
            f"overcommit ratio {shown(value)} has more than {MAX_RATIO_DECIMALS} decimal places",
        )
    return Fraction(int(significant)) * Fraction(10) ** exponent


_DECIMAL_PARTS = re.compile(r"([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?")


def _decimal_parts(text: str) -> tuple[bool, str, int]:
    """``"-12.50e3"`` -> (negative, "1250", 1): digits without leading zeros and the
    power of ten of the last one. Pure string work: an exponent of any size is just
    an int here, never a number of that size (``Decimal`` itself refuses some)."""
    match = _DECIMAL_PARTS.fullmatch(text)
    if match is None:
        raise ValueError(text)
    sign, whole, fraction, exponent = match.groups()
    fraction = fraction or ""
    significant = (whole + fraction).lstrip("0")
    return sign == "-", significant, int(exponent or "0") - len(fraction)


# -- memory quantities ------------------------------------------------------------------------

_QUANTITY = re.compile(
    r"([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_EXPONENT = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_MIB = 1 << 20


def memory_mib(value: object, field: str = "", *, round_up: bool = False) -> int:
    """A Kubernetes memory quantity (``"32Gi"``, ``"1e9"``, ``"500M"``) in whole MiB.

    Exact and rounded down, so a node never looks bigger than it is (``round_up``
    for a claim, which must never be smaller than what was asked); at most
    ``MAX_MB``. The exponent is checked before anything is multiplied out.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = _short_text(value, field, "a memory quantity")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise _fail(field, f"not a memory quantity (e.g. 32Gi): {shown(value)}")
    negative, significant, exponent = _decimal_parts(match[1])
    exponent += int(match[2] or "0")
    suffix = match[3] or ""
    if not significant:
        return 0
    if negative:
        raise _fail(field, f"a memory quantity cannot be negative: {shown(value)}")
    power10 = exponent + _DECIMAL_EXPONENT.get(suffix, 0)
    power2 = _BINARY.get(suffix, 0)
    # log10 of the byte count, roughly; MAX_MB MiB is about 10^15.05 bytes.
    magnitude = len(significant) - 1 + power10 + power2 * 0.30103
    if magnitude > 20:
        raise _fail(field, f"{shown(value)} is above {MAX_MB} MiB")
    if magnitude < -3:
        return 1 if round_up else 0  # less than a byte
    exact = Fraction(int(significant)) * Fraction(10) ** power10 * (1 << power2)
    mib = -int(-exact // _MIB) if round_up else int(exact // _MIB)
    if mib > MAX_MB:
        raise _fail(field, f"{shown(value)} is above {MAX_MB} MiB")
    return mib
