"""The table ``bench/cluster.py`` prints: one row per benchmark that ran.

Medians with their spread, because one figure from a shared, noisy machine says
little on its own; the JSON file keeps every repeat.
"""

from __future__ import annotations

import statistics
from typing import Any


def _spread(values: list[float], unit: str) -> str:
    return (
        f"{statistics.median(values):,.0f}{unit} (min {min(values):,.0f}, max {max(values):,.0f})"
    )


def table(results: dict[str, Any]) -> str:
    """The headline figures, one row per benchmark that ran."""
    rows = [
        (
            "B0",
            "API ceiling, creates+patches",
            _spread(results["B0"]["creates_patches_per_s"], "/s"),
        )
    ]
    if "B1" in results:
        b1 = results["B1"]
        rows.append(
            (
                "B1",
                "admissions",
                f"{_spread(b1['admissions_per_s'], '/s')}; {b1['ratio_to_B0']:.2f} x B0",
            )
        )
    if "B2" in results:
        b2 = results["B2"]
        rows.append(
            (
                "B2",
                "create -> decision",
                f"p50 {b2['p50_ms']:.1f} ms, p95 {b2['p95_ms']:.1f}, p99 {b2['p99_ms']:.1f}",
            )
        )
    if "B3" in results:
        b3 = results["B3"]
        rows.append(
            (
                "B3",
                f"restart with {b3['reservations']:,}",
                f"ready {b3['ready_s']:.1f} s, first admission {b3['first_admission_s']:.1f} s, "
                f"all decided {b3['all_decided_s']:.1f} s, Events posted "
                f"{b3['events_drained_s']:.1f} s; RSS {b3['rss_mb']:.0f} MB, "
                f"idle CPU {b3['idle_cpu_pct']:.1f} %",
            )
        )
    if "B4" in results:
        b4 = results["B4"]
        rows.append(
            (
                "B4",
                f"{b4['reservations']:,} go stale at once",
                f"all Reclaimed {b4['after_deadline_s']:.1f} s after the deadline",
            )
        )
    if "B6" in results:
        b6 = results["B6"]
        rows.append(
            (
                "B6",
                f"{b6['nodes']:,} nodes, {b6['reservations']:,} reservations",
                f"{_spread(b6['admissions_per_s'], '/s')}; {b6['ratio_to_B0']:.2f} x B0; "
                f"RSS {b6['rss_mb']:.0f} MB; filled in {b6['fill_s']:.0f} s",
            )
        )
    width = max(len(what) for _, what, _ in rows)
    return "\n".join(f"{bid}  {what:<{width}}  {figure}" for bid, what, figure in rows)
