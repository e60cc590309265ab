"""The ledger's figures as Prometheus families, read from it at scrape time.

Counters and gauges that the ledger already keeps are not counted twice: a
custom collector turns ``Ledger.metrics()`` and the node summaries into metric
families when Prometheus scrapes, so they can never disagree with the ledger.

Memory is in bytes, Prometheus's base unit (``headroom_node_reserved_ram_bytes``).
The MiB names they replace (``headroom_node_reserved_ram_mb``) are exported beside
them for one release, the same value in MiB, their help text saying so, so that a
dashboard or an alert written against them keeps working across the upgrade.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headroom.ledger import Ledger
from headroom.ledger.quotas import QuotaView
from headroom.ledger.summary import ClusterSummary

PREFIX = "headroom"
MIB = 1 << 20
DEPRECATED = "Deprecated: use {successor}; removed in the next minor release. "


class MiBFigure:
    """One figure under two names: ``headroom_<base>_bytes`` in bytes, and the deprecated
    ``headroom_<base>_mb`` in MiB that it replaces (kept one release)."""

    def __init__(
        self, base: str, doc: str, labels: Iterable[str] = (), *, counter: bool = False
    ) -> None:
        """``doc`` says what the figure is, without its unit."""
        family = CounterMetricFamily if counter else GaugeMetricFamily
        successor = f"{PREFIX}_{base}_bytes" + ("_total" if counter else "")
        self.bytes = family(f"{PREFIX}_{base}_bytes", f"{doc}, bytes.", labels=list(labels))
        self.mib = family(
            f"{PREFIX}_{base}_mb",
            DEPRECATED.format(successor=successor) + f"{doc}, MiB.",
            labels=list(labels),
        )

    def add(self, labels: list[str], mib: float) -> None:
        self.bytes.add_metric(labels, float(mib) * MIB)
        self.mib.add_metric(labels, float(mib))

    def families(self) -> tuple[Metric, Metric]:
        return self.bytes, self.mib


class LedgerCollector(Collector):
    def __init__(self, ledger: Callable[[], Ledger | None]) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[Metric]:
        ledger = self._ledger()
        if ledger is None:
            return
        now = datetime.now(UTC)
        yield from counter_families(ledger)
        summary = ledger.summary(now)
        yield GaugeMetricFamily(
            f"{PREFIX}_active_entries", "Admitted reservations.", value=summary.active_entries
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_queued_entries",
            "Reservations waiting for room (spec.wait).",
            value=len(ledger.waiting),
        )
        oldest = ledger.waiting.oldest()
        yield GaugeMetricFamily(
            f"{PREFIX}_queue_oldest_wait_seconds",
            "Age of the oldest reservation waiting for room (since its creation); 0 when none.",
            value=max((now - oldest).total_seconds(), 0.0) if oldest is not None else 0.0,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_stale_entries",
            "Admitted reservations past their heartbeat window.",
            value=summary.stale_entries,
        )
        yield from node_families(summary)
        yield from quota_families(ledger.quotas)


def counter_families(ledger: Ledger) -> Iterator[Metric]:
    """The ledger's counters, since this process built it (a restart resets them to 0;
    what the rebuild restores is counted as restored, never as reserved)."""
    m = ledger.metrics()
    for base, value, doc in (
        ("reserved", m.reserved_mb, "RAM admitted by this process, summed over reservations"),
        ("released", m.released_mb, "RAM returned by deleted reservations"),
        ("reclaimed", m.reclaimed_mb, "RAM reclaimed from stale or expired reservations"),
    ):
        figure = MiBFigure(base, doc, counter=True)
        figure.add([], value)
        yield from figure.families()
    yield CounterMetricFamily(
        f"{PREFIX}_restored_bytes",
        "RAM of reservations admitted before this process started and held again by its "
        "rebuild, bytes (not counted as reserved).",
        value=float(m.restored_mb) * MIB,
    )
    failures = CounterMetricFamily(
        f"{PREFIX}_reserve_failures", "Reservations rejected, by reason.", labels=["reason"]
    )
    for reason, count in sorted(m.failures_by_reason.items()):
        failures.add_metric([str(reason)], count)
    yield failures


def node_families(summary: ClusterSummary) -> Iterator[Metric]:
    """Per node, and per GPU device of each node."""
    node = ["node"]
    memory = {
        "total_ram_mb": MiBFigure("node_total_ram", "RAM the ledger counts for the node", node),
        "reserved_ram_mb": MiBFigure("node_reserved_ram", "RAM admitted on the node", node),
        "allocatable_ram_mb": MiBFigure(
            "node_allocatable_ram",
            "RAM still reservable on the node (0 when over-committed)",
            node,
        ),
        "reserved_vram_mb": MiBFigure("node_reserved_vram", "VRAM admitted on the node", node),
        "queued_ram_mb": MiBFigure(
            "node_queued_ram", "RAM the reservations waiting for room on the node ask for", node
        ),
    }
    counts = {
        "active_entries": GaugeMetricFamily(
            f"{PREFIX}_node_active_entries", "Admitted reservations on the node.", labels=node
        ),
        "stale_entries": GaugeMetricFamily(
            f"{PREFIX}_node_stale_entries", "Stale reservations on the node.", labels=node
        ),
        "queued_entries": GaugeMetricFamily(
            f"{PREFIX}_node_queued_entries",
            "Reservations waiting for room on the node.",
            labels=node,
        ),
    }
    limit = GaugeMetricFamily(
        f"{PREFIX}_node_ram_limit_bytes",
        "Most RAM the ledger admits on the node: total x maxOvercommitRatio - systemReserveMB "
        "(- what pods request beyond their claims), bytes; absent when unlimited or unknown. "
        "Reserved above it: over-committed.",
        labels=node,
    )
    utilization = GaugeMetricFamily(
        f"{PREFIX}_node_utilization_ratio", "Reserved / total RAM on the node.", labels=node
    )
    labels = ["node", "device", "kind"]
    device_memory = MiBFigure("device_memory", "Memory of a GPU device", labels)
    device_reserved = MiBFigure("device_reserved", "VRAM admitted on a GPU device", labels)
    device_free = MiBFigure(
        "device_free", "VRAM still free on a GPU device (absent when unlimited)", labels
    )
    device_external = GaugeMetricFamily(
        f"{PREFIX}_device_external_bytes",
        "Memory of a GPU device held outside Headroom, bytes: DRA ResourceClaims' consumed "
        "capacity, or the whole device for a device-plugin pod or a whole allocation.",
        labels=labels,
    )
    for each in summary.nodes:
        name = [each.node]
        for attribute, figure in memory.items():
            figure.add(name, getattr(each, attribute) or 0)
        for attribute, family in counts.items():
            family.add_metric(name, float(getattr(each, attribute) or 0))
        if each.limit_ram_mb is not None:
            limit.add_metric(name, float(each.limit_ram_mb) * MIB)
        utilization.add_metric(name, each.utilization_pct / 100)
        for room in each.devices or ():
            device = [each.node, room.device.id, room.device.kind.value]
            device_memory.add(device, room.device.memory_mb)
            device_reserved.add(device, room.held_mb)
            if room.free_mb is not None:
                device_free.add(device, room.free_mb)
            device_external.add_metric(device, float(room.external_mb) * MIB)
    for figure in memory.values():
        yield from figure.families()
    yield from counts.values()
    yield limit
    yield utilization
    for figure in (device_memory, device_reserved, device_free):
        yield from figure.families()
    yield device_external


def quota_families(quotas: QuotaView) -> Iterator[Metric]:
    """Per HeadroomQuota: what its namespaces may hold together (a limit is absent where
    the quota sets none) and what they hold, in total and per namespace holding any."""
    label = ["quota"]
    ram_limit = MiBFigure(
        "quota_ram_limit",
        "RAM a quota's namespaces may hold together (spec.ramMB; absent: no limit)",
        label,
    )
    ram_used = MiBFigure("quota_ram_used", "RAM a quota's namespaces hold", label)
    vram_limit = MiBFigure(
        "quota_vram_limit",
        "VRAM a quota's namespaces may hold together (spec.vramMB; absent: no limit)",
        label,
    )
    vram_used = MiBFigure("quota_vram_used", "VRAM a quota's namespaces hold", label)
    entries_limit = GaugeMetricFamily(
        f"{PREFIX}_quota_entries_limit",
        "Admitted reservations a quota's namespaces may hold (spec.maxEntries; absent: no limit).",
        labels=label,
    )
    entries = GaugeMetricFamily(
        f"{PREFIX}_quota_entries", "Admitted reservations a quota's namespaces hold.", labels=label
    )
    namespace_ram = MiBFigure(
        "quota_namespace_ram_used",
        "RAM held by each namespace a quota governs (those holding any)",
        ["quota", "namespace"],
    )
    for name in quotas.names():
        rules = quotas.rules(name)
        if rules is None:
            continue
        used = quotas.used(name)
        for figure, limit in ((ram_limit, rules.ram_mb), (vram_limit, rules.vram_mb)):
            if limit is not None:
                figure.add([name], limit)
        if rules.max_entries is not None:
            entries_limit.add_metric([name], float(rules.max_entries))
        ram_used.add([name], used.ram_mb)
        vram_used.add([name], used.vram_mb)
        entries.add_metric([name], float(used.entries))
        for namespace in quotas.namespaces_of(name):
            held = quotas.used_by(namespace)
            if not held.empty:
                namespace_ram.add([name, namespace], held.ram_mb)
    for figure in (ram_limit, ram_used, vram_limit, vram_used):
        yield from figure.families()
    yield from (entries_limit, entries)
    yield from namespace_ram.families()
