"""The shipped alert rules, checked by the real promtool, and the chart that ships them.

``promtool check rules`` accepts the rules file; ``promtool test rules`` runs
tests/prometheus/headroom-alerts.test.yaml, which must fire every alert on one series
and leave it quiet on another near its threshold. Every alert links a section of
docs/operations/runbooks.md that exists, and the chart's PrometheusRule carries
exactly the rules file's groups. promtool comes from ``make prometheus``; a missing
one fails these tests, naming that command.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

from headroom_dev.prometheus import run_promtool
from tests.integration.test_chart import CHART, refused, render

ROOT = Path(__file__).resolve().parents[2]
RULES = CHART / "rules" / "headroom-alerts.yaml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "headroom-alerts.test.yaml"
RUNBOOKS = ROOT / "docs" / "operations" / "runbooks.md"
RUNBOOKS_PATH = "/docs/operations/runbooks.md"


def groups() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return found


def alerts() -> list[dict[str, Any]]:
    return [rule for group in groups() for rule in group["rules"] if "alert" in rule]


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings: lower case, punctuation dropped, spaces -."""
    headings = re.findall(r"^#{1,6} +(.+?) *$", markdown, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_promtool_accepts_the_rules() -> None:
    result = run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout, result.stdout


def test_promtool_unit_tests_of_every_alert_pass() -> None:
    result = run_promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    """Each alert is evaluated where it fires, and where a series of its own metrics is
    there but fires nothing: an eval expecting no alert, or a series whose labels no
    expected alert carries."""
    spec = yaml.safe_load(RULE_TESTS.read_text())
    assert spec["rule_files"] == [str(Path("../..") / RULES.relative_to(ROOT))]
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in spec["tests"]:
        series_labels = [_labels(s["series"]) for s in case["input_series"]]
        for check in case["alert_rule_test"]:
            name, expected = check["alertname"], check.get("exp_alerts") or []
            if expected:
                fires.add(name)
            fired = [e["exp_labels"] for e in expected]
            if not expected or any(not any(_within(f, s) for f in fired) for s in series_labels):
                quiet.add(name)
    names = {a["alert"] for a in alerts()}
    assert len(names) == 8
    assert names - fires == set(), f"never seen firing: {names - fires}"
    assert names - quiet == set(), f"never seen quiet: {names - quiet}"


def _labels(series: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', series))


def _within(fired: dict[str, str], series: dict[str, str]) -> bool:
    """The fired alert is about this series: they agree on every label they share
    (``le``, ``phase``, ``result`` and the like aside)."""
    shared = set(fired) & set(series) - {"severity", "alertname"}
    return bool(shared) and all(fired[k] == series[k] for k in shared)


def test_every_alert_says_what_and_links_its_runbook_section() -> None:
    runbooks = RUNBOOKS.read_text()
    anchors = github_anchors(runbooks)
    for alert in alerts():
        name, annotations = alert["alert"], alert["annotations"]
        assert alert["labels"]["severity"] in ("critical", "warning"), name
        assert annotations["summary"], name
        assert annotations["description"], name
        url = urllib.parse.urlsplit(annotations["runbook_url"])
        assert url.scheme == "https", (name, url)
        assert url.path.endswith(RUNBOOKS_PATH), (name, url)
        assert url.fragment == name.lower(), (name, url.fragment)
        assert url.fragment in anchors, f"{name}: no section #{url.fragment} in {RUNBOOKS}"
        row = f"| [{name}](#{url.fragment}) | {alert['labels']['severity']} |"
        assert row in runbooks, f"{name}: the table of {RUNBOOKS.name} lacks {row}"
    assert len({a["annotations"]["runbook_url"] for a in alerts()}) == len(alerts())


def prometheus_rules(*values: str) -> list[dict[str, Any]]:
    return [d for d in render(*values) if d["kind"] == "PrometheusRule"]


def test_the_prometheus_rule_is_off_by_default() -> None:
    assert prometheus_rules() == []


def test_the_prometheus_rule_carries_exactly_the_rules_files_groups() -> None:
    (rule,) = prometheus_rules('prometheusRule={"enabled": true}')
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "headroom-system"
    assert rule["spec"]["groups"] == groups()


def test_values_relabel_the_rule_and_its_alerts_and_move_the_runbooks() -> None:
    (rule,) = prometheus_rules(
        'prometheusRule={"enabled": true, "labels": {"release": "kube-prometheus-stack"},'
        ' "additionalAlertLabels": {"team": "ml", "severity": "page"},'
        ' "runbookBaseURL": "https://wiki.example.com/headroom/runbooks"}'
    )
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rendered = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    for shipped, alert in zip(alerts(), rendered, strict=True):
        assert alert["expr"] == shipped["expr"]
        assert alert["labels"] == {**shipped["labels"], "team": "ml"}  # severity stays
        section = shipped["annotations"]["runbook_url"].split("#")[1]
        assert alert["annotations"]["runbook_url"] == (
            f"https://wiki.example.com/headroom/runbooks#{section}"
        )


def test_the_schema_refuses_unknown_or_malformed_rule_values() -> None:
    for value, named in (
        ('prometheusRule={"enable": true}', "enable"),
        ('prometheusRule={"runbookBaseURL": "wiki#x"}', "runbookBaseURL"),
        ('prometheusRule={"additionalAlertLabels": {"team": 1}}', "team"),
    ):
        refused(value, named)
