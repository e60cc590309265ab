"""Kubernetes memory quantities (``"32Gi"``, ``"1e9"``, ``"500M"``) to whole MiB.

Exact decimal arithmetic, rounded down: a node never looks bigger than it is.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")
_MIB = 2**20


def memory_mib(quantity: str | int) -> int:
    """Bytes in ``quantity``, floored to MiB. Raises ValueError naming the value if malformed."""
    text = str(quantity).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"not a memory quantity: {quantity!r}")
    number, suffix = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"not a memory quantity: {quantity!r}") from None
    scale = Decimal(_BINARY[suffix]) if suffix in _BINARY else _DECIMAL[suffix]
    total = value * scale
    if total < 0:
        raise ValueError(f"memory quantity is negative: {quantity!r}")
    return int(total // _MIB)
