"""Prometheus metrics, read from the ledger at scrape time.

Counters and gauges that the ledger already keeps are not counted twice: a
custom collector turns ``Ledger.metrics()`` and the node summaries into metric
families when Prometheus scrapes, so they can never disagree with the ledger.
Only what the ledger cannot know (latency, write failures) is a live metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headroom.kube.events import EventRecorder
from headroom.ledger import Ledger
from headroom.ledger.quotas import Quotas

PREFIX = "headroom"


class LedgerCollector(Collector):
    def __init__(self, ledger: Callable[[], Ledger | None]) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[Metric]:
        ledger = self._ledger()
        if ledger is None:
            return
        now = datetime.now(UTC)
        m = ledger.metrics()
        for name, value, doc in (
            ("reserved_mb", m.reserved_mb, "MiB of RAM admitted, summed over reservations."),
            ("released_mb", m.released_mb, "MiB of RAM returned by deleted reservations."),
            ("reclaimed_mb", m.reclaimed_mb, "MiB of RAM reclaimed from stale/expired ones."),
        ):
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)
        failures = CounterMetricFamily(
            f"{PREFIX}_reserve_failures", "Reservations rejected, by reason.", labels=["reason"]
        )
        for reason, count in sorted(m.failures_by_reason.items()):
            failures.add_metric([str(reason)], count)
        yield failures

        summary = ledger.summary(now)
        yield GaugeMetricFamily(
            f"{PREFIX}_active_entries", "Admitted reservations.", value=summary.active_entries
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_queued_entries",
            "Reservations waiting for room (spec.wait).",
            value=len(ledger.waiting),
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_stale_entries",
            "Admitted reservations past their heartbeat window.",
            value=summary.stale_entries,
        )
        per_node = {
            "node_total_ram_mb": ("RAM the ledger counts for the node, MiB.", "total_ram_mb"),
            "node_reserved_ram_mb": ("RAM admitted on the node, MiB.", "reserved_ram_mb"),
            "node_allocatable_ram_mb": (
                "RAM still reservable on the node, MiB.",
                "allocatable_ram_mb",
            ),
            "node_reserved_vram_mb": ("VRAM admitted on the node, MiB.", "reserved_vram_mb"),
            "node_active_entries": ("Admitted reservations on the node.", "active_entries"),
            "node_stale_entries": ("Stale reservations on the node.", "stale_entries"),
            "node_queued_entries": ("Reservations waiting for room on the node.", "queued_entries"),
            "node_queued_ram_mb": ("RAM the waiting reservations ask for, MiB.", "queued_ram_mb"),
        }
        families = {
            key: GaugeMetricFamily(f"{PREFIX}_{key}", doc, labels=["node"])
            for key, (doc, _) in per_node.items()
        }
        utilization = GaugeMetricFamily(
            f"{PREFIX}_node_utilization_ratio", "Reserved / total RAM on the node.", labels=["node"]
        )
        labels = ["node", "device", "kind"]
        device_memory = GaugeMetricFamily(
            f"{PREFIX}_device_memory_mb", "Memory of a GPU device, MiB.", labels=labels
        )
        device_reserved = GaugeMetricFamily(
            f"{PREFIX}_device_reserved_mb", "VRAM admitted on a GPU device, MiB.", labels=labels
        )
        device_free = GaugeMetricFamily(
            f"{PREFIX}_device_free_mb",
            "VRAM still free on a GPU device, MiB (absent when unlimited).",
            labels=labels,
        )
        for node in summary.nodes:
            for key, (_, attribute) in per_node.items():
                families[key].add_metric([node.node], float(getattr(node, attribute) or 0))
            utilization.add_metric([node.node], node.utilization_pct / 100)
            for room in node.devices or ():
                device = [node.node, room.device.id, room.device.kind.value]
                device_memory.add_metric(device, float(room.device.memory_mb))
                device_reserved.add_metric(device, float(room.held_mb))
                if room.free_mb is not None:
                    device_free.add_metric(device, float(room.free_mb))
        yield from families.values()
        yield utilization
        yield from (device_memory, device_reserved, device_free)
        yield from quota_families(ledger.quotas)


def quota_families(quotas: Quotas) -> Iterator[Metric]:
    """Per HeadroomQuota: what its namespaces may hold together (a limit is absent where
    the quota sets none) and what they hold, in total and per namespace holding any."""
    label = ["quota"]
    ram_limit = GaugeMetricFamily(
        f"{PREFIX}_quota_ram_limit_mb",
        "RAM a quota's namespaces may hold together, MiB (spec.ramMB; absent: no limit).",
        labels=label,
    )
    ram_used = GaugeMetricFamily(
        f"{PREFIX}_quota_ram_used_mb", "RAM a quota's namespaces hold, MiB.", labels=label
    )
    vram_limit = GaugeMetricFamily(
        f"{PREFIX}_quota_vram_limit_mb",
        "VRAM a quota's namespaces may hold together, MiB (spec.vramMB; absent: no limit).",
        labels=label,
    )
    vram_used = GaugeMetricFamily(
        f"{PREFIX}_quota_vram_used_mb", "VRAM a quota's namespaces hold, MiB.", labels=label
    )
    entries_limit = GaugeMetricFamily(
        f"{PREFIX}_quota_entries_limit",
        "Admitted reservations a quota's namespaces may hold (spec.maxEntries; absent: no limit).",
        labels=label,
    )
    entries = GaugeMetricFamily(
        f"{PREFIX}_quota_entries", "Admitted reservations a quota's namespaces hold.", labels=label
    )
    namespace_ram = GaugeMetricFamily(
        f"{PREFIX}_quota_namespace_ram_used_mb",
        "RAM held by each namespace a quota governs (those holding any), MiB.",
        labels=["quota", "namespace"],
    )
    for name in quotas.names():
        rules = quotas.rules(name)
        if rules is None:
            continue
        used = quotas.used(name)
        for family, limit in (
            (ram_limit, rules.ram_mb),
            (vram_limit, rules.vram_mb),
            (entries_limit, rules.max_entries),
        ):
            if limit is not None:
                family.add_metric([name], float(limit))
        ram_used.add_metric([name], float(used.ram_mb))
        vram_used.add_metric([name], float(used.vram_mb))
        entries.add_metric([name], float(used.entries))
        for namespace in quotas.namespaces_of(name):
            held = quotas.used_by(namespace)
            if not held.empty:
                namespace_ram.add_metric([name, namespace], float(held.ram_mb))
    yield from (ram_limit, ram_used, vram_limit, vram_used, entries_limit, entries, namespace_ram)


class EventsCollector(Collector):
    """The Event recorder's backlog: Events are posted off the hot path, so a burst of
    decisions leaves a queue that drains later (and work that is not idle CPU)."""

    def __init__(self, recorder: EventRecorder) -> None:
        self._recorder = recorder

    def collect(self) -> Iterator[Metric]:
        recorder = self._recorder
        yield GaugeMetricFamily(
            f"{PREFIX}_events_queued", "Kubernetes Events waiting to be posted.", recorder.queued
        )
        yield CounterMetricFamily(
            f"{PREFIX}_events_posted", "Kubernetes Events posted.", value=recorder.posted
        )
        yield CounterMetricFamily(
            f"{PREFIX}_events_dropped",
            "Kubernetes Events dropped because the queue was full.",
            value=recorder.dropped,
        )


class OperatorMetrics:
    """The registry the operator serves at /metrics."""

    def __init__(self, ledger: Callable[[], Ledger | None]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(LedgerCollector(ledger))
        self.admission_latency = Histogram(
            f"{PREFIX}_admission_latency_seconds",
            "From the operator seeing a new reservation to its decision written to status.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.decisions = Counter(
            f"{PREFIX}_decisions",
            "Decisions written to status, by phase.",
            ["phase"],
            registry=self.registry,
        )
        self.status_write_failures = Counter(
            f"{PREFIX}_status_write_failures",
            "Status writes that failed and were rolled back or retried.",
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "From creation to admission, for reservations that waited for room.",
            buckets=(0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400),
            registry=self.registry,
        )
        self.pods_gated = Gauge(
            f"{PREFIX}_pods_gated",
            "Pods held now by the scheduling gate headroom.dev/admission.",
            registry=self.registry,
        )
        self.gate_wait = Histogram(
            f"{PREFIX}_pod_gate_seconds",
            "From the operator first seeing a gated pod to its pin-and-ungate patch landing.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600),
            registry=self.registry,
        )
        self.ungate_failures = Counter(
            f"{PREFIX}_pod_ungate_failures",
            "Pin-and-ungate patches refused (the reservation is reclaimed UngateRefused), by "
            "the API server's reason.",
            ["reason"],
            registry=self.registry,
        )
        self.reclaims = Counter(
            f"{PREFIX}_reclaims",
            "Reservations reclaimed, by reason.",
            ["reason"],
            registry=self.registry,
        )

    # -- headroom.control.telemetry.Telemetry ------------------------------------------------

    def decision_written(self, phase: str, seconds_since_seen: float) -> None:
        self.admission_latency.observe(seconds_since_seen)
        self.decisions.labels(phase).inc()

    def reclaimed(self, reason: str) -> None:
        self.reclaims.labels(reason).inc()

    def waited(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)

    def status_write_failed(self) -> None:
        self.status_write_failures.inc()

    def ungated(self, seconds: float) -> None:
        self.gate_wait.observe(seconds)

    def ungate_failed(self, reason: str) -> None:
        self.ungate_failures.labels(reason).inc()

    def count_gated(self, gated: Callable[[], int]) -> None:
        """Read the number of gated pods from ``gated`` at each scrape."""
        self.pods_gated.set_function(gated)
