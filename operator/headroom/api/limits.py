"""Over-commitment limits (seed: Limits, DefaultLimits).

The ratio is held as an exact :class:`~fractions.Fraction` so that no admission
decision ever depends on floating-point rounding: ``1.1`` in a config file means
exactly 11/10, not 1.100000000000000088817841970012523.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from fractions import Fraction

from headroom.api.constants import (
    DEFAULT_HEARTBEAT_STALE_WINDOW,
    DEFAULT_MAX_ENTRIES_PER_NODE,
    DEFAULT_MAX_OVERCOMMIT_RATIO,
    DEFAULT_SYSTEM_RESERVE_MB,
    DEFAULT_VRAM_OVERCOMMIT_RATIO,
)
from headroom.api.gpus import GpuPolicy


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-node admission limits.

    ``max_overcommit_ratio``: reserved/total RAM allowed; 1 = none, 3/2 = 50 %,
    0 = unlimited. ``system_reserve_mb`` is held back from allocation.
    ``max_entries_per_node`` caps *active* reservations per node.
    ``max_vram_overcommit_ratio`` is the same for each GPU device's memory (and the
    node's VRAM sum); ``gpu_policy`` chooses a claim's devices.
    """

    max_overcommit_ratio: Fraction = DEFAULT_MAX_OVERCOMMIT_RATIO
    system_reserve_mb: int = DEFAULT_SYSTEM_RESERVE_MB
    heartbeat_stale_window: timedelta = DEFAULT_HEARTBEAT_STALE_WINDOW
    max_entries_per_node: int = DEFAULT_MAX_ENTRIES_PER_NODE
    max_vram_overcommit_ratio: Fraction = DEFAULT_VRAM_OVERCOMMIT_RATIO
    gpu_policy: GpuPolicy = GpuPolicy.BINPACK

    @property
    def unlimited(self) -> bool:
        """Ratio 0 means RAM is not limited at all."""
        return self.max_overcommit_ratio == 0

    def with_overrides(
        self,
        *,
        max_overcommit_ratio: Fraction | None = None,
        system_reserve_mb: int | None = None,
        max_entries_per_node: int | None = None,
        max_vram_overcommit_ratio: Fraction | None = None,
        gpu_policy: GpuPolicy | None = None,
    ) -> Limits:
        """These limits with the given per-node overrides applied (None keeps the default)."""
        return replace(
            self,
            max_overcommit_ratio=(
                self.max_overcommit_ratio if max_overcommit_ratio is None else max_overcommit_ratio
            ),
            system_reserve_mb=(
                self.system_reserve_mb if system_reserve_mb is None else system_reserve_mb
            ),
            max_entries_per_node=(
                self.max_entries_per_node if max_entries_per_node is None else max_entries_per_node
            ),
            max_vram_overcommit_ratio=(
                self.max_vram_overcommit_ratio
                if max_vram_overcommit_ratio is None
                else max_vram_overcommit_ratio
            ),
            gpu_policy=self.gpu_policy if gpu_policy is None else gpu_policy,
        )


def default_limits() -> Limits:
    """Conservative defaults (seed: DefaultLimits): no overcommit, 1 GiB held back."""
    return Limits()
