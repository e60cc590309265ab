"""Metric names by Prometheus convention, scraped as Prometheus does.

Memory in bytes, each deprecated MiB name the same figure in MiB with help text that
names its successor; the node's RAM limit, so that over-commitment is a comparison;
the waiting queue's age; counters that a rebuild does not move; and the live metrics
(build, leader, webhook, API errors) on the operator's own registry.
"""

from __future__ import annotations

import platform
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

from prometheus_client import CollectorRegistry, generate_latest

from headroom.api.gpus import GpuDevice
from headroom.api.limits import Limits
from headroom.api.selectors import LabelSelector
from headroom.kube.events import EventRecorder
from headroom.kube.transport import Transport
from headroom.ledger import Entry, Ledger
from headroom.ledger.external import DraClaim
from headroom.ledger.quotas import QuotaRules
from headroom.serving.ledgermetrics import LedgerCollector
from headroom.serving.metrics import EventsCollector, OperatorMetrics, version

REFERENCE = Path(__file__).resolve().parents[2] / "docs/reference/metrics.md"
MIB = 1 << 20
GIB = 1024
NOW = datetime.now(UTC)
#: The names the alert rules and the dashboard are written against (issue 23, item 3).
BYTES = {
    "headroom_node_total_ram_bytes",
    "headroom_node_reserved_ram_bytes",
    "headroom_node_allocatable_ram_bytes",
    "headroom_node_reserved_vram_bytes",
    "headroom_node_queued_ram_bytes",
    "headroom_node_ram_limit_bytes",
    "headroom_device_memory_bytes",
    "headroom_device_reserved_bytes",
    "headroom_device_free_bytes",
    "headroom_device_external_bytes",
    "headroom_quota_ram_limit_bytes",
    "headroom_quota_ram_used_bytes",
    "headroom_quota_vram_limit_bytes",
    "headroom_quota_vram_used_bytes",
    "headroom_quota_namespace_ram_used_bytes",
    "headroom_reserved_bytes_total",
    "headroom_released_bytes_total",
    "headroom_reclaimed_bytes_total",
    "headroom_restored_bytes_total",
}


class Scrape:
    """One exposition, parsed: samples by ``'name{labels}'``, and each family's TYPE and HELP."""

    def __init__(self, registry: CollectorRegistry) -> None:
        text = generate_latest(registry).decode()
        self.values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                self.values[key] = float(value)
        self.types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
        self.helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.MULTILINE))

    def names(self) -> set[str]:
        return {key.partition("{")[0] for key in self.values}


def scrape(ledger: Ledger) -> Scrape:
    registry = CollectorRegistry()
    registry.register(LedgerCollector(lambda: ledger))
    return Scrape(registry)


def claim(entry_id: str, ram: int, vram: int = 0, at: datetime = NOW) -> Entry:
    return Entry(entry_id, "n1", ram, at, at, vram)


def busy() -> Ledger:
    """A node with a GPU, a quota, admitted, released, reclaimed and waiting claims, as of
    now: the collector reads ages off the wall clock at scrape time (a module-level time
    was 20 minutes old by the time a full run reached this test)."""
    now = datetime.now(UTC)
    ledger = Ledger(Limits(system_reserve_mb=1024, heartbeat_stale_window=timedelta(minutes=5)))
    ledger.set_node_capacity("n1", 16 * GIB, 80 * GIB)
    ledger.set_node_devices("n1", (GpuDevice("GPU-0", 80 * GIB, ref="gpu.nvidia.com/n1/g0"),))
    ledger.set_namespace("ml", {"team": "ml"})
    selector = LabelSelector(match_labels={"team": "ml"})
    ledger.set_quota(QuotaRules("team", selector, ram_mb=8 * GIB, vram_mb=40 * GIB))
    assert ledger.reserve(claim("ml/a", 4 * GIB, 20 * GIB, at=now), now).admitted
    assert ledger.reserve(claim("ml/b", GIB, at=now), now).admitted
    assert ledger.reserve(claim("web/c", 2 * GIB, at=now), now).admitted
    ledger.release("ml/b")
    ledger.reclaim_entry("web/c")
    waiting = claim("web/w", 64 * GIB, at=now - timedelta(minutes=3))
    assert ledger.reserve_or_wait(waiting, now, now + timedelta(hours=1)).queued
    return ledger


def test_memory_is_in_bytes_and_each_mib_name_is_its_deprecated_twin() -> None:
    found = scrape(busy())
    assert found.names() >= BYTES
    deprecated = {name for name in found.names() if re.search(r"_mb(_total)?$", name)}
    assert len(deprecated) == len(BYTES) - 3  # none for the limit, restored, external
    for name in deprecated:
        successor = re.sub(r"_mb(_total)?$", r"_bytes\1", name)
        assert found.helps[name].startswith(
            f"Deprecated: use {successor}; removed in the next minor release."
        ), found.helps[name]
        assert found.types[name] == found.types[successor]
        for key, value in found.values.items():
            if key.partition("{")[0] == name:
                assert found.values[key.replace(name, successor, 1)] == value * MIB, key
    for name in BYTES:
        assert "Deprecated" not in found.helps[name]
    for counter in ("reserved", "released", "reclaimed", "restored"):
        assert found.types[f"headroom_{counter}_bytes_total"] == "counter"


def test_the_figures_in_bytes() -> None:
    values = scrape(busy()).values
    node, device = '{node="n1"}', '{device="GPU-0",kind="gpu",node="n1"}'
    assert values[f"headroom_node_total_ram_bytes{node}"] == 16 * GIB * MIB
    assert values[f"headroom_node_reserved_ram_bytes{node}"] == 4 * GIB * MIB
    assert values[f"headroom_node_ram_limit_bytes{node}"] == 15 * GIB * MIB  # 16 − 1 reserve
    assert values[f"headroom_node_allocatable_ram_bytes{node}"] == 11 * GIB * MIB
    assert values[f"headroom_node_reserved_vram_bytes{node}"] == 20 * GIB * MIB
    assert values[f"headroom_node_queued_ram_bytes{node}"] == 64 * GIB * MIB
    assert values[f"headroom_device_memory_bytes{device}"] == 80 * GIB * MIB
    assert values[f"headroom_device_reserved_bytes{device}"] == 20 * GIB * MIB
    assert values[f"headroom_device_free_bytes{device}"] == 60 * GIB * MIB
    assert values[f"headroom_device_external_bytes{device}"] == 0
    ledger = busy()
    ledger.set_resource_claim(("ml", "share"), DraClaim({"gpu.nvidia.com/n1/g0": 10 * GIB}))
    values = scrape(ledger).values
    assert values[f"headroom_device_external_bytes{device}"] == 10 * GIB * MIB
    assert values[f"headroom_device_free_bytes{device}"] == 50 * GIB * MIB
    assert values['headroom_quota_ram_limit_bytes{quota="team"}'] == 8 * GIB * MIB
    assert values['headroom_quota_ram_used_bytes{quota="team"}'] == 4 * GIB * MIB
    assert values['headroom_quota_vram_limit_bytes{quota="team"}'] == 40 * GIB * MIB
    assert values['headroom_quota_vram_used_bytes{quota="team"}'] == 20 * GIB * MIB
    ml = '{namespace="ml",quota="team"}'
    assert values[f"headroom_quota_namespace_ram_used_bytes{ml}"] == 4 * GIB * MIB
    assert values["headroom_reserved_bytes_total"] == 7 * GIB * MIB
    assert values["headroom_released_bytes_total"] == GIB * MIB
    assert values["headroom_reclaimed_bytes_total"] == 2 * GIB * MIB
    assert values["headroom_restored_bytes_total"] == 0
    assert values["headroom_queued_entries"] == 1
    assert 180 <= values["headroom_queue_oldest_wait_seconds"] < 240


def test_an_over_committed_node_reads_reserved_above_its_limit() -> None:
    """allocatable stops at 0; the limit gauge keeps the over-commitment visible."""
    ledger = busy()
    ledger.set_node_capacity("n1", 4 * GIB, 80 * GIB)  # shrank under what it holds
    values = scrape(ledger).values
    node = '{node="n1"}'
    assert values[f"headroom_node_ram_limit_bytes{node}"] == 3 * GIB * MIB
    assert values[f"headroom_node_reserved_ram_bytes{node}"] == 4 * GIB * MIB
    assert values[f"headroom_node_allocatable_ram_bytes{node}"] == 0
    assert ledger.node_summary("n1", NOW).over_committed


def test_no_limit_gauge_where_the_ledger_sets_no_limit() -> None:
    ledger = Ledger(Limits(max_overcommit_ratio=0))  # unlimited
    ledger.set_node_capacity("free", 16 * GIB)
    ledger.set_node_capacity("n1", 16 * GIB)
    ledger.set_node_capacity("n1", 16 * GIB, limits=Limits(system_reserve_mb=0))
    assert ledger.reserve(claim("a/x", GIB), NOW).admitted
    ledger.remove_node("n1")  # capacity unknown while it holds a claim
    values = scrape(ledger).values
    assert not any(key.startswith("headroom_node_ram_limit_bytes") for key in values)
    assert values['headroom_node_reserved_ram_bytes{node="n1"}'] == GIB * MIB
    assert values["headroom_queue_oldest_wait_seconds"] == 0


def test_a_rebuild_counts_what_it_holds_again_as_restored_not_reserved() -> None:
    before = busy()
    entries = [claim(e.id, e.ram_mb, e.vram_mb) for e in before.entries()]
    after, _ = Ledger.rebuild(before.limits, [("n1", 16 * GIB, 80 * GIB, None)], entries)
    values = scrape(after).values
    assert values["headroom_restored_bytes_total"] == 4 * GIB * MIB
    for counter in ("reserved", "released", "reclaimed"):
        assert values[f"headroom_{counter}_bytes_total"] == 0
    assert after.reserve(claim("web/d", GIB), NOW).admitted
    assert scrape(after).values["headroom_reserved_bytes_total"] == GIB * MIB


def test_the_live_metrics_of_the_operator() -> None:
    metrics = OperatorMetrics(lambda: None)
    deciding = False
    metrics.follow_leadership(lambda: deciding)
    metrics.count_undecided(lambda: 3)
    values = Scrape(metrics.registry).values
    build = (
        f'headroom_build_info{{python_version="{platform.python_version()}",version="{version()}"}}'
    )
    assert values[build] == 1
    assert version() != "unknown"
    assert values["headroom_leader"] == 0
    assert values["headroom_undecided_reservations"] == 3
    assert not any(key.startswith("headroom_node_") for key in values)  # no ledger yet
    for result in ("allowed", "patched", "denied", "error"):  # 0 before the first review
        assert values[f'headroom_webhook_reviews_total{{result="{result}"}}'] == 0
    deciding = True
    metrics.api_error("patch", "409")
    metrics.api_error("watch", "timeout")
    metrics.api_error("patch", "409")
    metrics.watch_restarted("reservations", "ended")
    metrics.status_write_retried()
    metrics.reviewed("patched", 0.002)
    values = Scrape(metrics.registry).values
    assert values["headroom_leader"] == 1
    assert values['headroom_api_errors_total{code="409",verb="patch"}'] == 2
    assert values['headroom_api_errors_total{code="timeout",verb="watch"}'] == 1
    assert values['headroom_watch_restarts_total{reason="ended",resource="reservations"}'] == 1
    assert values["headroom_status_write_retries_total"] == 1
    assert values["headroom_status_write_failures_total"] == 0
    assert values['headroom_webhook_reviews_total{result="patched"}'] == 1
    assert values["headroom_webhook_review_seconds_count"] == 1


def test_the_reference_documents_every_metric_and_only_those() -> None:
    """docs/reference/metrics.md names each exported family, and nothing else."""
    metrics = OperatorMetrics(busy)
    metrics.registry.register(EventsCollector(EventRecorder(cast(Transport, None))))
    exported = {name for name in Scrape(metrics.registry).types if not name.endswith("_created")}
    documented = set(re.findall(r"\bheadroom_[a-z_]+[a-z]", REFERENCE.read_text()))
    documented -= {"headroom_dev"}  # a package, not a metric
    assert exported - documented == set(), "exported, not documented"
    assert documented - exported == set(), "documented, not exported"
