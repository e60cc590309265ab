"""Tables like kubectl's, and ``-o json|yaml``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by three spaces, as kubectl prints them."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def render(data: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, default=str)
    if fmt == "yaml":
        return yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=False).rstrip()
    raise ValueError(f"unknown output format {fmt!r}")


def emit(data: Any, text: str, fmt: str) -> None:
    """Print ``text`` for ``-o table``, else ``data`` as JSON or YAML."""
    print(text if fmt == "table" else render(data, fmt))
