"""Per-quota metrics (HeadroomQuota), read from the ledger at scrape time.

Scraped as Prometheus does and parsed as the integration tests parse /metrics
(``OperatorProcess.metrics``): ``'name{label="v"}' -> value``. Memory is exported in
bytes, and for one release also under the deprecated MiB names, which must agree.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from headroom.api.limits import Limits
from headroom.api.selectors import LabelSelector
from headroom.ledger import Entry, Ledger
from headroom.ledger.quotas import QuotaRules
from headroom.serving.ledgermetrics import LedgerCollector

DASHBOARD = Path(__file__).resolve().parents[2] / "charts/headroom/dashboards/headroom.json"
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
GIB = 1024
MIB = 1 << 20
QUOTA_FAMILIES = {
    "headroom_quota_ram_limit_bytes",
    "headroom_quota_ram_used_bytes",
    "headroom_quota_vram_limit_bytes",
    "headroom_quota_vram_used_bytes",
    "headroom_quota_entries_limit",
    "headroom_quota_entries",
    "headroom_quota_namespace_ram_used_bytes",
}
DEPRECATED_QUOTA_FAMILIES = {
    name.removesuffix("_bytes") + "_mb" for name in QUOTA_FAMILIES if name.endswith("_bytes")
}


def scrape(ledger: Ledger) -> tuple[dict[str, float], set[str]]:
    """The samples, and the families announced (``# TYPE``), as a scrape sees them."""
    registry = CollectorRegistry()
    registry.register(LedgerCollector(lambda: ledger))
    text = generate_latest(registry).decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values, set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))


def quota_samples(values: dict[str, float]) -> dict[str, float]:
    """The quota samples with memory in MiB (a ``_bytes`` sample / 2^20), once each
    deprecated ``_mb`` sample is checked to be its ``_bytes`` twin in MiB."""
    samples, twins = {}, 0
    for key, value in values.items():
        name, brace, labels = key.partition("{")
        if not name.startswith("headroom_quota_"):
            continue
        if name.endswith("_mb"):
            assert values[f"{name.removesuffix('_mb')}_bytes{brace}{labels}"] == value * MIB
            twins += 1
        elif name.endswith("_bytes"):
            samples[key] = value / MIB
        else:
            samples[key] = value
    assert twins == sum(1 for key in samples if key.partition("{")[0].endswith("_bytes"))
    return samples


def book() -> Ledger:
    ledger = Ledger(Limits(heartbeat_stale_window=timedelta(minutes=5)))
    ledger.set_node_capacity("n1", 512 * GIB, 80 * GIB)
    for namespace, team in (("ml", "ml"), ("ml-dev", "ml"), ("web", "web"), ("idle", "ml")):
        ledger.set_namespace(namespace, {"team": team})
    return ledger


def claim(entry_id: str, ram: int, vram: int = 0) -> Entry:
    return Entry(entry_id, "n1", ram, T0, T0, vram)


def test_without_quotas_the_families_are_announced_with_no_samples() -> None:
    values, families = scrape(book())
    assert families >= QUOTA_FAMILIES  # what the dashboard queries is always exported
    assert families >= DEPRECATED_QUOTA_FAMILIES  # and, for one release, the MiB names
    assert quota_samples(values) == {}


def test_each_quota_shows_its_limits_and_what_its_namespaces_hold() -> None:
    ledger = book()
    ml = LabelSelector(match_labels={"team": "ml"})
    ledger.set_quota(QuotaRules("team-ml", ml, ram_mb=64 * GIB, vram_mb=40 * GIB, max_entries=10))
    ledger.set_quota(QuotaRules("web", LabelSelector(match_labels={"team": "web"})))
    assert ledger.reserve(claim("ml/a", 40 * GIB, 8 * GIB), T0).admitted
    assert ledger.reserve(claim("ml-dev/b", 16 * GIB), T0).admitted
    assert ledger.reserve(claim("web/c", 3 * GIB), T0).admitted
    assert ledger.reserve(claim("other/d", 5 * GIB), T0).admitted  # no quota: not shown
    values, _ = scrape(ledger)
    assert quota_samples(values) == {
        'headroom_quota_ram_limit_bytes{quota="team-ml"}': 65536.0,
        'headroom_quota_ram_used_bytes{quota="team-ml"}': 57344.0,
        'headroom_quota_vram_limit_bytes{quota="team-ml"}': 40960.0,
        'headroom_quota_vram_used_bytes{quota="team-ml"}': 8192.0,
        'headroom_quota_entries_limit{quota="team-ml"}': 10.0,
        'headroom_quota_entries{quota="team-ml"}': 2.0,
        'headroom_quota_namespace_ram_used_bytes{namespace="ml",quota="team-ml"}': 40960.0,
        'headroom_quota_namespace_ram_used_bytes{namespace="ml-dev",quota="team-ml"}': 16384.0,
        # No limit on any dimension: the limit gauges are absent, usage is shown.
        'headroom_quota_ram_used_bytes{quota="web"}': 3072.0,
        'headroom_quota_vram_used_bytes{quota="web"}': 0.0,
        'headroom_quota_entries{quota="web"}': 1.0,
        'headroom_quota_namespace_ram_used_bytes{namespace="web",quota="web"}': 3072.0,
    }


def test_the_metrics_follow_releases_relabels_lowered_and_deleted_quotas() -> None:
    ledger = book()
    ml = LabelSelector(match_labels={"team": "ml"})
    ledger.set_quota(QuotaRules("team-ml", ml, ram_mb=64 * GIB))
    assert ledger.reserve(claim("ml/a", 40 * GIB), T0).admitted
    assert ledger.reserve(claim("ml-dev/b", 16 * GIB), T0).admitted
    ledger.release("ml/a")
    ledger.set_namespace("ml-dev", {"team": "none"})  # leaves the quota
    ledger.set_quota(QuotaRules("team-ml", ml, ram_mb=GIB))  # lowered
    values, _ = scrape(ledger)
    assert quota_samples(values) == {
        'headroom_quota_ram_limit_bytes{quota="team-ml"}': 1024.0,
        'headroom_quota_ram_used_bytes{quota="team-ml"}': 0.0,
        'headroom_quota_vram_used_bytes{quota="team-ml"}': 0.0,
        'headroom_quota_entries{quota="team-ml"}': 0.0,
    }
    ledger.set_namespace("ml-dev", {"team": "ml"})  # back, over the lowered limit
    values, _ = scrape(ledger)
    assert values['headroom_quota_ram_used_bytes{quota="team-ml"}'] == 16 * 1024**3
    assert values['headroom_quota_ram_limit_bytes{quota="team-ml"}'] == 1024**3
    assert values['headroom_quota_ram_used_mb{quota="team-ml"}'] == 16384.0
    assert values['headroom_quota_ram_limit_mb{quota="team-ml"}'] == 1024.0
    ledger.remove_quota("team-ml")
    values, families = scrape(ledger)
    assert quota_samples(values) == {}
    assert families >= QUOTA_FAMILIES | DEPRECATED_QUOTA_FAMILIES


def test_the_dashboard_queries_only_quota_metrics_the_collector_exports() -> None:
    """The unit twin of tests/integration/test_dashboard.py for the quota panels."""
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    expressions += [v.get("query", "") for v in dashboard["templating"]["list"]]
    queried = {m for e in expressions for m in re.findall(r"\bheadroom_quota_[a-z_]+", e)}
    _, families = scrape(book())
    assert queried == QUOTA_FAMILIES  # each shown, none missing
    assert "quota" in {v["name"] for v in dashboard["templating"]["list"]}
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert families >= queried
