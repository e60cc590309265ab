"""An admitted claim: what a program holds, as both the sync and async APIs show it.

Its GPU devices are read once, from the status that admitted it: they are part of
the operator's decision (under its stamp) and never change while it is admitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headroom.client.connection import Connection
from headroom.client.devices import Device, cuda_visible_devices
from headroom.client.errors import ClaimLostError, ClaimRefusedError

#: Heartbeats come this often when the node's stale window cannot be read (the caller
#: may not read NodeHeadrooms): a tenth of the operator's default window (5 min).
#: An operator configured with a window under 90 s needs ``heartbeat_interval``.
DEFAULT_HEARTBEAT_INTERVAL = 30.0
#: Reads of a NodeHeadroom not written yet (a node just added) before settling on it.
UNREAD_WINDOW_TRIES = 60


@dataclass
class Held:
    """An admitted reservation and how it is kept alive."""

    conn: Connection
    name: str
    uid: str
    node: str
    ram_mb: int
    vram_mb: int
    message: str
    #: The GPU devices its VRAM is on, in status order (``headroom.client.devices``).
    devices: tuple[Device, ...] = ()
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    #: ``caller``, ``NodeHeadroom`` (a third of its stale window) or ``default``.
    interval_from: str = "default"
    #: Nodes that refused it first (automatic placement), with their reasons.
    refused_by: list[ClaimRefusedError] = field(default_factory=list)
    #: Reads of the node's stale window still to try (it was not readable yet).
    unread_window: int = UNREAD_WINDOW_TRIES
    lost: ClaimLostError | None = None
    #: Set when the release begins: heartbeats stop, and a loss they find is not news.
    stopping: bool = False
    #: Set once the release's delete was attempted (not when it was interrupted).
    released: bool = False

    @property
    def namespace(self) -> str:
        return self.conn.namespace

    @property
    def reference(self) -> str:
        return f"{self.conn.namespace}/{self.name}"


class ClaimView:
    """What a claim shows, read-only; :class:`Claim` and :class:`AsyncClaim` add the verbs."""

    def __init__(self, held: Held) -> None:
        self._held = held

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.reference} on {self.node}: "
            f"{self.ram_mb} MiB RAM, {self.vram_mb} MiB VRAM>"
        )

    @property
    def name(self) -> str:
        return self._held.name

    @property
    def namespace(self) -> str:
        return self._held.namespace

    @property
    def reference(self) -> str:
        """``namespace/name``, as ``$HEADROOM_RESERVATION`` carries it."""
        return self._held.reference

    @property
    def uid(self) -> str:
        return self._held.uid

    @property
    def node(self) -> str:
        """The node it holds memory on (the one chosen, with automatic placement)."""
        return self._held.node

    @property
    def ram_mb(self) -> int:
        return self._held.ram_mb

    @property
    def vram_mb(self) -> int:
        return self._held.vram_mb

    @property
    def message(self) -> str:
        """The operator's admission sentence, with the numbers."""
        return self._held.message

    @property
    def devices(self) -> tuple[Device, ...]:
        """The GPU devices its VRAM is on and the MiB on each, as admitted (empty when
        it holds no VRAM per device: no VRAM, ``gpus=0``, or no inventory on the node)."""
        return self._held.devices

    @property
    def cuda_visible_devices(self) -> str | None:
        """What ``CUDA_VISIBLE_DEVICES`` should be: the device UUIDs, comma-joined; None
        when it holds no device or one is not an NVIDIA UUID (a synthetic id such as
        ``gfd-0``, which CUDA cannot take)."""
        return cuda_visible_devices(self._held.devices)

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats."""
        return self._held.heartbeat_interval

    @property
    def heartbeat_interval_from(self) -> str:
        """``caller``, ``NodeHeadroom`` (a third of its stale window) or ``default``."""
        return self._held.interval_from

    @property
    def refused_by(self) -> list[ClaimRefusedError]:
        """Nodes that refused it first (automatic placement), in order."""
        return list(self._held.refused_by)

    @property
    def lost(self) -> ClaimLostError | None:
        """Why it no longer holds memory, once the heartbeats found out; else None."""
        return self._held.lost

    @property
    def released(self) -> bool:
        return self._held.released

    def check(self) -> None:
        """Raise :class:`ClaimLostError` if the claim was lost."""
        if self._held.lost is not None:
            raise self._held.lost
