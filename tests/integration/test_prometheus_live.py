"""A real Prometheus scrapes a running operator: the dashboard's and the alerts' queries
work on what it serves.

Prometheus (Debian's, from ``make prometheus``) scrapes the operator every second
with the shipped rules file loaded, while a short demo load runs on the real control
plane: nodes, admitted and rejected reservations, and one that queues and is admitted
when room is released. Then, through Prometheus' HTTP API, every query of every
dashboard panel (Grafana's variables substituted as Grafana would) and every alert
expression evaluates without error, every rule's evaluation is healthy, the core
panels return data, and no alert whose metrics the operator serves is pending or firing
on this healthy operator.

The core panels are listed explicitly and are those on metrics the operator serves
today (issue 23 renames metrics to bytes and adds headroom_build_info, headroom_leader,
headroom_undecided_reservations and the like; the dashboard and the rules are read at
run time, so their queries are checked as they change, and those on metrics not yet
served evaluate to nothing without error).
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from headroom_dev.prometheus import PrometheusServer, scrape_config
from tests.integration.metrics_access_support import SECURE, Accounts
from tests.integration.test_dashboard import DASHBOARD, METRIC

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "headroom" / "rules" / "headroom-alerts.yaml"
JOB = "headroom"

#: Panels whose every query must return a finite sample after the demo load: those on
#: metrics the operator serves on main today.
CORE_PANELS = (
    "Active reservations",
    "Stale reservations",
    "Reserved RAM",
    "Allocatable RAM",
    "Reserved, allocatable and limit RAM per node",
    "Utilization per node",
    "Active and stale entries per node",
    "Admissions per second by phase",
    "Admission latency (seen → decision written)",
    "Reserve failures by reason",
    "Waiting for room per node (spec.wait)",
    "Wait before admission (queued ones)",
    "Deciding replicas",
    "Leader by replica",
    "Version",
    "Undecided reservations",
    "Undecided and waiting reservations",
    "Oldest wait for room",
    "Status writes failed and retried",
    "Webhook reviews by result",
    "RAM reserved, released and reclaimed",
)


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside rows too."""
    found = []
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop(0)
        found.append(panel)
        stack.extend(panel.get("panels", []))
    return found


def grafana_substitute(expr: str, variables: dict[str, str]) -> str:
    """``$name`` and ``${name}`` replaced as Grafana would; an unknown variable fails."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in variables, f"no value for ${name} in {expr!r}"
        return variables[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", value, expr)


def finite(samples: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in samples)


def demo_load(make_node: Callable[..., Any], custom: client.CustomObjectsApi, ns: str) -> list[str]:
    """Two nodes; admitted and rejected reservations; one queued, then admitted when the
    reservation in its way is deleted. Returns the nodes' names."""
    nodes = [f"prom-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for node in nodes:
        make_node(node, memory="5Gi")  # limit 4096 MiB each
    rsv.create(custom, ns, "a1", nodes[0], 1024)
    rsv.create(custom, ns, "a2", nodes[0], 2048)
    rsv.create(custom, ns, "b1", nodes[1], 3072)
    rsv.create(custom, ns, "too-big", nodes[1], 8192)
    rsv.wait_all(custom, ns, 4)
    rsv.create(custom, ns, "waiter", nodes[1], 2048, wait="2m")
    rsv.wait_for(custom, ns, "waiter", phases=("Queued",))
    time.sleep(1.5)  # a scrape that sees it queued
    rsv.delete(custom, ns, "b1")
    assert rsv.wait_for(custom, ns, "waiter")["status"]["phase"] == "Admitted"
    return nodes


def test_dashboard_and_alert_queries_on_a_live_prometheus(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
    accounts: Accounts,
    tmp_path: Path,
) -> None:
    """Prometheus scrapes as a ServiceAccount granted the chart's metrics-reader role."""
    operator = run_operator({"sweepPeriod": "200ms", **SECURE})
    token = tmp_path / "token"
    token.write_text(accounts.token("prometheus"))
    accounts.grant("prometheus")
    scrape = scrape_config(JOB, operator, token)
    with PrometheusServer([scrape], rule_files=[RULES]) as prom:
        prom.wait_for(f'up{{job="{JOB}"}} == 1')
        prom.wait_for("headroom_active_entries")  # scraped once before the load
        nodes = demo_load(make_node, custom, namespace)
        # Rates need two scrapes of each counter after it moved.
        prom.wait_for('sum(rate(headroom_decisions_total{phase="Admitted"}[5m])) > 0')
        prom.wait_for("sum(rate(headroom_queue_wait_seconds_count[5m])) > 0")
        time.sleep(1.5)
        check_dashboard(prom, nodes)
        check_alerts(prom, served_metrics(prom))


def check_dashboard(prom: PrometheusServer, nodes: list[str]) -> None:
    """Every query of the dashboard (its variables' too) evaluates; the core panels' return
    a finite sample."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {
        "node": "|".join(nodes),  # a multi-value variable: Grafana joins with |
        "quota": ".*",  # All, no quota in the load
        "datasource": "prometheus",
        "__rate_interval": "1m",
        "__interval": "1s",
        "__range": "5m",
    }
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query", "")
        found = re.fullmatch(r"label_values\((\w+), *(\w+)\)", query)
        if variable["type"] == "query":
            assert found, f"${variable['name']}: not a label_values query: {query}"
            metric, label = found.groups()
            prom.api(f"label/{label}/values", **{"match[]": metric})

    returned: dict[str, bool] = {}
    for panel in panels(dashboard):
        title = panel.get("title", "")
        for target in panel.get("targets", []):
            expr = grafana_substitute(target["expr"], variables)
            samples = prom.query(expr)  # PrometheusError if Prometheus refuses it
            returned[title] = returned.get(title, True) and finite(samples)
    missing = [t for t in CORE_PANELS if t not in returned]
    assert missing == [], f"core panels not in the dashboard: {missing}"
    empty = [t for t in CORE_PANELS if not returned[t]]
    assert empty == [], f"core panels without data after the load: {empty}"


def check_alerts(prom: PrometheusServer, served: set[str]) -> None:
    """Every alert expression evaluates and every rule is healthy; on this healthy operator,
    no alert whose metrics are all served is pending or firing."""
    rules = yaml.safe_load(RULES.read_text())["groups"]
    alerts = [r for g in rules for r in g["rules"] if "alert" in r]
    for alert in alerts:
        prom.query(alert["expr"])
    evaluated = _rules_evaluated(prom, {a["alert"] for a in alerts})
    unhealthy = {n: r.get("lastError") for n, r in evaluated.items() if r["health"] != "ok"}
    assert unhealthy == {}, unhealthy

    checked = {a["alert"] for a in alerts if set(METRIC.findall(a["expr"])) <= served}
    assert {"HeadroomStatusWritesFailing", "HeadroomManyStaleEntries"} <= checked
    active = {(a["labels"]["alertname"], a["state"]) for a in prom.api("alerts")["alerts"]}
    assert {(name, state) for name, state in active if name in checked} == set()


def served_metrics(prom: PrometheusServer) -> set[str]:
    """The metric names Prometheus has scraped from the operator (a counter's ``_total``,
    a histogram's series)."""
    names: list[str] = prom.api("label/__name__/values", **{"match[]": f'{{job="{JOB}"}}'})
    return set(names)


def _rules_evaluated(prom: PrometheusServer, names: set[str]) -> dict[str, dict[str, Any]]:
    """The loaded alerting rules, once each has been evaluated at least once."""
    deadline = time.monotonic() + 15
    while True:
        groups = prom.api("rules", type="alert")["groups"]
        loaded = {r["name"]: r for g in groups for r in g["rules"]}
        assert set(loaded) == names, (set(loaded), names)
        if all(r["health"] != "unknown" for r in loaded.values()):
            return loaded
        assert time.monotonic() < deadline, f"rules never evaluated: {loaded}"
        time.sleep(0.5)
