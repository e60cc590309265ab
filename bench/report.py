"""What ``bench/cluster.py`` prints and saves: one row per benchmark, and the JSON file.

Medians with their spread, because one figure from a shared, noisy machine says
little on its own; the JSON file keeps every repeat. A run that failed half-way
has only some figures, and a benchmark may have only some of its own (B3's
ready time but not its idle CPU): every row shows what is there and nothing
else, and a benchmark with nothing measured has no row.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

Row = tuple[str, str, str]


def _spread(values: list[float], unit: str) -> str:
    return (
        f"{statistics.median(values):,.0f}{unit} (min {min(values):,.0f}, max {max(values):,.0f})"
    )


def _parts(figures: dict[str, Any], *formats: tuple[str, str]) -> list[str]:
    """``template.format(value)`` for each ``(key, template)`` whose key was measured."""
    return [
        template.format(figures[key]) for key, template in formats if figures.get(key) is not None
    ]


def _join(*groups: list[str]) -> str:
    return "; ".join(", ".join(group) for group in groups if group)


def _b0(b0: dict[str, Any]) -> Row | None:
    rates = b0.get("creates_patches_per_s") or []
    if not rates:
        return None
    return "B0", "API ceiling, creates+patches", _spread(rates, "/s")


def _b1(b1: dict[str, Any]) -> Row | None:
    rates = b1.get("admissions_per_s") or []
    if not rates:
        return None
    figure = _join([_spread(rates, "/s")], _parts(b1, ("ratio_to_B0", "{:.2f} x B0")))
    return "B1", "admissions", figure


def _b2(b2: dict[str, Any]) -> Row | None:
    parts = _parts(
        b2, ("p50_ms", "p50 {:.1f} ms"), ("p95_ms", "p95 {:.1f}"), ("p99_ms", "p99 {:.1f}")
    )
    return ("B2", "create -> decision", ", ".join(parts)) if parts else None


def _b3(b3: dict[str, Any]) -> Row | None:
    timings = _parts(
        b3,
        ("ready_s", "ready {:.1f} s"),
        ("first_new_decision_s", "first new decision (idle node) {:.1f} s"),
        ("first_new_backlog_left", "{:,} of the backlog undecided then"),
        ("first_admission_s", "first admission {:.1f} s"),
        ("all_decided_s", "all decided {:.1f} s"),
        ("events_drained_s", "Events posted {:.1f} s"),
    )
    drain = _parts(
        b3,
        ("backlog_drain_per_s", "backlog drained at {:,.0f}/s"),
        ("backlog_drain_ratio_to_B0", "{:.2f} x B0"),
    )
    process = _parts(b3, ("rss_mb", "RSS {:.0f} MB"), ("idle_cpu_pct", "idle CPU {:.1f} %"))
    if not timings and not process:
        return None
    return "B3", f"restart with {b3['reservations']:,}", _join(timings, drain, process)


def _b4(b4: dict[str, Any]) -> Row | None:
    parts = _parts(b4, ("after_deadline_s", "all Reclaimed {:.1f} s after the deadline"))
    return ("B4", f"{b4['reservations']:,} go stale at once", parts[0]) if parts else None


def _cpu(runs: list[dict[str, float]]) -> str:
    """The median CPU of each process over the runs, as % of one core."""
    names = ("operator", "kube-apiserver", "etcd", "others")
    shares = [f"{statistics.median(run.get(name, 0.0) for run in runs):.0f}" for name in names]
    return "CPU % operator / apiserver / etcd / others " + " / ".join(shares)


def _b6(b6: dict[str, Any]) -> Row | None:
    rates = b6.get("admissions_per_s") or []
    figure = _join(
        [_spread(rates, "/s")] if rates else [],
        _parts(b6, ("ratio_to_B0", "{:.2f} x B0")),
        _parts(b6, ("rss_mb", "RSS {:.0f} MB")),
        _parts(b6, ("fill_s", "filled in {:.0f} s")),
        [_cpu(b6["cpu_pct"])] if b6.get("cpu_pct") else [],
    )
    if not figure:
        return None
    return "B6", f"{b6['nodes']:,} nodes, {b6['reservations']:,} reservations", figure


def _b7(b7: dict[str, Any]) -> Row | None:
    rates = b7.get("admissions_per_s") or []
    figure = _join(
        [_spread(rates, "/s")] if rates else [], _parts(b7, ("ratio_to_B0", "{:.2f} x B0"))
    )
    if not figure:
        return None
    what = f"{b7.get('reservations', 0):,} queued on {b7.get('nodes', 0)} full nodes, room at once"
    return "B7", what, figure


def _b8(b8: dict[str, Any]) -> Row | None:
    """The headline of ``bench/fairness.py``; its own table has every phase."""
    phases = b8.get("phases") or {}
    parts = []
    for phase, figures in phases.items():
        operator, api = figures.get("operator") or {}, figures.get("api") or {}
        if "p99_ms" in operator:
            parts.append(
                f"{phase}: operator p50/p99 {operator['p50_ms']:.1f}/{operator['p99_ms']:.1f} ms"
                f" (API {api.get('p50_ms', 0):.1f}/{api.get('p99_ms', 0):.1f})"
            )
    ratios = _parts(
        b8,
        ("storm_operator_p99_ratio", "storm p99 {:.1f} x quiet (<= 2)"),
        ("flood_operator_p99_ratio", "flood p99 {:.1f} x quiet (<= 3)"),
        ("flood_ratio_to_B0", "flood admitted at {:.2f} x B0 (>= 0.5)"),
    )
    storm = phases.get("storm") or {}
    if "reclaimed" in storm:
        ratios.append(f"storm reclaimed {storm['reclaimed']} (0)")
    figure = _join(parts, ratios)
    return ("B8", "noisy neighbour, control tenant", figure) if figure else None


_ROWS: dict[str, Callable[[dict[str, Any]], Row | None]] = {
    "B0": _b0,
    "B1": _b1,
    "B2": _b2,
    "B3": _b3,
    "B4": _b4,
    "B7": _b7,
    "B8": _b8,
    "B6": _b6,
}


def rows(results: dict[str, Any]) -> list[Row]:
    """``(id, what, figure)`` for each benchmark with at least one figure, in order."""
    found = (row(results[bid]) for bid, row in _ROWS.items() if results.get(bid))
    return [r for r in found if r is not None]


def line(results: dict[str, Any], bid: str) -> str:
    """One benchmark's row as it stands now (printed as soon as a figure is measured)."""
    row = _ROWS[bid](results.get(bid) or {})
    return f"{row[0]}  {row[1]}  {row[2]}" if row else f"{bid}  (nothing measured yet)"


def table(results: dict[str, Any]) -> str:
    """The headline figures, one row per benchmark that measured anything."""
    found = rows(results)
    if not found:
        return "(no figures)"
    width = max(len(what) for _, what, _ in found)
    return "\n".join(f"{bid}  {what:<{width}}  {figure}" for bid, what, figure in found)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically: a reader (or a run killed mid-write) sees the old
    file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # as an ordinary write would leave it, not mkstemp's 0600
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=2)
            out.write("\n")
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
