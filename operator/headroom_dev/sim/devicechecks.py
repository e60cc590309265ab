"""The simulation's per-device promise: no GPU device is ever held above its memory.

The node-level check (``checks.py``) sums RAM; VRAM must fit per device (issue
20). Every admission written with ``status.devices`` is added to its devices'
holdings, and the holdings of every device it names must stay within that
device's memory as the node's GPU Feature Discovery labels give it (the driver
never changes a node's GPUs, and the default VRAM ratio is 1). An admission of
VRAM on a node with GPUs must name exactly ``spec.gpus`` devices (1 when absent),
each with its share, ``ceil(vramMB / gpus)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headroom.api.constants import GPU_COUNT_LABEL, GPU_MEMORY_LABEL

JSON = dict[str, Any]


def gfd_devices(node: JSON) -> dict[str, int]:
    """Device id -> MiB as GFD labels describe them (``gfd-0``…); empty without them."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    if GPU_MEMORY_LABEL not in labels:
        return {}
    count = int(labels.get(GPU_COUNT_LABEL, "1"))
    return {f"gfd-{index}": int(labels[GPU_MEMORY_LABEL]) for index in range(count)}


@dataclass
class DeviceBook:
    """What admissions hold on each (node, device), as their statuses say."""

    fail: Callable[[str], None]
    count: Callable[[str], None]
    devices: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> id -> MiB
    holdings: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)  # uid ->

    def on_node(self, name: str, node: JSON | None) -> None:
        if node is None:
            return  # a deleted node keeps its GPUs in this book: it comes back the same
        found = gfd_devices(node)
        if found:
            self.devices[name] = found

    def admitted(
        self, uid: str, key: tuple[str, str], obj: JSON, counts: Callable[[str], bool]
    ) -> None:
        """A new admission; ``counts(other_uid)``: whether another admission is held
        alongside it (as the RAM check decides, for late statuses)."""
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        node, vram = str(spec.get("node")), int(spec.get("vramMB") or 0)
        gpus = 1 if spec.get("gpus") is None else int(spec["gpus"])
        held = {str(i["id"]): int(i["memoryMB"]) for i in status.get("devices") or []}
        self.holdings[uid] = (node, held)
        known = self.devices.get(node)
        if status.get("reason") == "OverCommitted" or known is None:
            return
        if held:
            self.count("admitted-on-devices")
        if vram and gpus:
            share = -(-vram // gpus)
            if sorted(held.values()) != [share] * gpus:
                self.fail(f"{key}: {vram} MiB over {gpus} devices admitted as {held}")
        for device in held:
            if device not in known:
                self.fail(f"{key}: admitted on {device}, not a device of node {node}")
                continue
            total = sum(
                mib.get(device, 0)
                for other, (n, mib) in self.holdings.items()
                if n == node and (other == uid or counts(other))
            )
            if total > known[device]:
                self.fail(
                    f"{key}: pushed device {device} of node {node} to {total} MiB "
                    f"> its {known[device]} MiB"
                )

    def released(self, uid: str) -> None:
        self.holdings.pop(uid, None)
