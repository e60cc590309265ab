"""Which nodes a claim fits on now, best first, read from the NodeHeadrooms.

**The order** is the operator's (``headroom.ledger.nodeorder``, pure and shared, so
that this and the operator's placement of gated pods never disagree): most
allocatable RAM first, then most free VRAM (VRAM capacity minus reserved VRAM; a
node whose VRAM capacity is unknown comes after every node whose capacity is known),
then the node's name; spread, not tight packing.

**A node fits** when its capacity is known, it is under its entry cap, its
allocatable RAM is at least the RAM asked and, where its VRAM capacity is known,
its free VRAM is at least the VRAM asked and, where it lists its GPU devices, at
least ``gpus`` of them have the claim's share (``ceil(vram / gpus)``) free, as the
operator admits per device (``headroom.client.devices``): the operator's admission
test, applied to the figures it last published (at most ``summaryInterval`` old). A
node can fill up between this reading and the claim; ``--node auto`` then tries the
next one.

The order is the same for claims on devices: the per-device test only removes the
nodes where the claim cannot go.

A label selector is sent with the NodeHeadroom list: the operator copies each
Node's labels onto its NodeHeadroom, so whoever may read NodeHeadrooms (a tenant
bound to ``headroom-nodeheadroom-reader``) can select by them without reading Nodes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from headroom.api.models import DeviceHeadroom, NodeHeadroomStatus
from headroom.client import calls
from headroom.client.connection import Connection, connect
from headroom.client.devices import device_fit, largest_free_mb, spread_over
from headroom.client.errors import PlacementError, api_message
from headroom.client.spec import GPUS, MIB, SCHEMA_NAMES, check
from headroom.ledger import nodeorder

JSON = dict[str, Any]
#: What grants reading NodeHeadrooms; quoted wherever they are forbidden.
NODEHEADROOM_GRANT = (
    "NodeHeadrooms are cluster-scoped: the ClusterRole headroom-nodeheadroom-reader "
    "grants reading them (chart value nodeHeadroomReaders)"
)
_STATUS_FIELDS = {field.alias or name for name, field in NodeHeadroomStatus.model_fields.items()}
_DEVICE_FIELDS = {field.alias or name for name, field in DeviceHeadroom.model_fields.items()}


#: The rule, in a few words, for messages.
ORDER_RULE = nodeorder.RULE


class AutoNode:
    """Stands for "the best node now" where a node name is expected (``AUTO``)."""

    def __repr__(self) -> str:
        return "AUTO"


#: ``claim(AUTO, ...)``: place the claim on the best node by the rule above.
AUTO = AutoNode()


@dataclass(frozen=True)
class NodeRoom:
    """One node's room for a claim of a given size."""

    node: str
    fits: bool
    #: Why it does not fit now, in a few words with the numbers; None when it fits.
    why_not: str | None
    allocatable_ram_mb: int = 0
    #: VRAM capacity minus reserved VRAM; None where the capacity is unknown.
    free_vram_mb: int | None = None
    active_entries: int = 0
    max_entries: int = 0
    queued_entries: int = 0
    #: Within the node's limits once others leave: a claim that may wait can queue here.
    could_fit_later: bool = False
    #: MiB free on the emptiest GPU device; None without devices or when unlimited.
    largest_free_device_mb: int | None = None
    #: Whether the node lists its GPU devices (admits VRAM per device).
    has_devices: bool = False

    def as_json(self) -> JSON:
        return {
            "node": self.node,
            "fits": self.fits,
            "whyNot": self.why_not,
            "allocatableRAMMB": self.allocatable_ram_mb,
            "freeVRAMMB": self.free_vram_mb,
            "activeEntries": self.active_entries,
            "maxEntries": self.max_entries,
            "queuedEntries": self.queued_entries,
            "largestFreeDeviceMB": self.largest_free_device_mb,
        }


def readable_devices(items: object) -> list[DeviceHeadroom] | None:
    """A NodeHeadroom's devices, each read on its own: fields added later are ignored
    and a device that cannot be read is left out (it then counts as having no room),
    so that one odd device never hides the node's other figures."""
    if not isinstance(items, list):
        return None
    readable = []
    for item in items:
        if not isinstance(item, dict):
            continue
        try:
            readable.append(
                DeviceHeadroom.model_validate(
                    {key: value for key, value in item.items() if key in _DEVICE_FIELDS}
                )
            )
        except ValidationError:
            continue
    return readable


def assess(headroom: JSON, ram_mb: int, vram_mb: int, gpus: int | None = None) -> NodeRoom:
    """How a claim of this size (``vram_mb`` over ``gpus`` devices: None is the operator's
    default, 1) stands on the node this NodeHeadroom describes."""
    name = str(headroom["metadata"]["name"])
    raw = headroom.get("status") or {}
    known = {key: value for key, value in raw.items() if key in _STATUS_FIELDS}
    if "devices" in known:
        known["devices"] = readable_devices(known["devices"])
    try:
        status = NodeHeadroomStatus.model_validate(known)
    except ValidationError:
        return NodeRoom(name, False, "no figures published yet")
    # The VRAM limit (capacity × the node's VRAM ratio) where the operator publishes it;
    # an older operator publishes only the capacity, the limit at ratio 1. Ratio 0:
    # VRAM is not limited, as where it is unknown.
    vram_limit = status.limit_vram_mb
    if vram_limit is None and status.max_vram_overcommit_ratio is None:
        vram_limit = status.vram_capacity_mb
    free_vram = None if vram_limit is None else max(0, vram_limit - status.reserved_vram_mb)
    spread = spread_over(vram_mb, gpus)
    devices = status.devices
    per_device = device_fit(devices, vram_mb, spread) if devices is not None and spread else None
    could_fit_later = (
        status.capacity_known
        and status.max_entries > 0
        and (status.limit_ram_mb is None or status.limit_ram_mb >= ram_mb)
        and (status.vram_capacity_mb is None or status.vram_capacity_mb >= vram_mb)
        and (per_device is None or per_device.fits_later)
    )
    if not status.capacity_known:
        why_not: str | None = "capacity unknown"
    elif status.active_entries >= status.max_entries:
        why_not = f"entry cap reached ({status.active_entries}/{status.max_entries})"
    elif status.allocatable_ram_mb < ram_mb:
        why_not = f"allocatable {status.allocatable_ram_mb} MiB < {ram_mb} MiB"
    elif free_vram is not None and free_vram < vram_mb:
        why_not = f"free VRAM {free_vram} MiB < {vram_mb} MiB"
    elif per_device is not None and not per_device.fits:
        why_not = per_device.why_not()
    else:
        why_not = None
    return NodeRoom(
        name,
        why_not is None,
        why_not,
        allocatable_ram_mb=status.allocatable_ram_mb,
        free_vram_mb=free_vram,
        active_entries=status.active_entries,
        max_entries=status.max_entries,
        queued_entries=status.queued_entries,
        could_fit_later=could_fit_later,
        largest_free_device_mb=None if devices is None else largest_free_mb(devices),
        has_devices=devices is not None,
    )


def rank(
    headrooms: Iterable[JSON], ram_mb: int, vram_mb: int, gpus: int | None = None
) -> list[NodeRoom]:
    """Every node: those that fit now first, best first; then the others, by name."""
    rooms = [assess(h, ram_mb, vram_mb, gpus) for h in headrooms]
    fitting = nodeorder.best_first(r for r in rooms if r.fits)
    return fitting + sorted((r for r in rooms if not r.fits), key=lambda r: r.node)


def read(
    conn: Connection,
    ram_mb: int,
    vram_mb: int,
    selector: str | None = None,
    gpus: int | None = None,
) -> list[NodeRoom]:
    """:func:`rank` over the NodeHeadrooms of the nodes matching ``selector`` (all without).

    Raises :class:`PlacementError` when the caller may not list NodeHeadrooms.
    """
    return rank(node_headrooms(conn, selector), ram_mb, vram_mb, gpus)


def node_headrooms(conn: Connection, selector: str | None = None) -> list[JSON]:
    """The NodeHeadrooms of the nodes matching ``selector`` (with their Node's labels).

    Raises :class:`PlacementError` when the caller may not list them.
    """
    try:
        return calls.node_headrooms(conn, selector)
    except ApiException as error:
        if error.status != 403:
            raise
        raise PlacementError(
            f"cannot list NodeHeadrooms: {api_message(error)}. {NODEHEADROOM_GRANT}"
        ) from None


def candidates(rooms: list[NodeRoom], *, may_wait: bool, most: int) -> list[NodeRoom]:
    """The nodes to try, best first: those that fit now; when none does and the claim
    may wait, those where it could fit once others leave (ranked by the same rule)."""

    def fits_later(room: NodeRoom) -> bool:
        return may_wait and room.could_fit_later

    return list(islice(nodeorder.to_try(rooms, lambda room: room.fits, fits_later), most))


def size_text(ram_mb: int, vram_mb: int, gpus: int | None = None) -> str:
    """``4096 MiB RAM and 102400 MiB VRAM over 2 GPUs``."""
    text = f"{ram_mb} MiB RAM" + (f" and {vram_mb} MiB VRAM" if vram_mb else "")
    if vram_mb and gpus is not None and gpus != 1:
        text += " over the node's GPUs" if gpus == 0 else f" over {gpus} GPUs"
    return text


def no_room(
    rooms: list[NodeRoom],
    ram_mb: int,
    vram_mb: int,
    selector: str | None,
    gpus: int | None = None,
) -> str:
    """One sentence: no node fits, and why not, node by node (the first few)."""
    size = size_text(ram_mb, vram_mb, gpus)
    where = f" matching {selector!r}" if selector else ""
    if not rooms:
        return f"no node{where} has a NodeHeadroom: nowhere to claim {size}"
    shown = "; ".join(f"{r.node}: {r.why_not}" for r in rooms[:8])
    more = f"; and {len(rooms) - 8} more" if len(rooms) > 8 else ""
    return f"no node{where} has room for {size} now ({shown}{more})"


def nodes_with_room(
    ram_mb: int,
    vram_mb: int = 0,
    *,
    gpus: int | None = None,
    selector: str | None = None,
    connection: Connection | None = None,
) -> list[NodeRoom]:
    """The nodes where a claim of this size fits now, best first (the rule above)."""
    ram: int = check(MIB, SCHEMA_NAMES["ramMB"], ram_mb)
    vram: int = check(MIB, SCHEMA_NAMES["vramMB"], vram_mb)
    spread = None if gpus is None else check(GPUS, SCHEMA_NAMES["gpus"], gpus, "devices")
    rooms = read(connection or connect(), ram, vram, selector, spread)
    return [room for room in rooms if room.fits]
