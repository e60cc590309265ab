"""The Grafana dashboard parses, and every metric it queries is one the operator exports,
under its current name (bytes, not the deprecated MiB names)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess

DASHBOARD = Path(__file__).resolve().parents[2] / "charts/headroom/dashboards/headroom.json"
METRIC = re.compile(r"\bheadroom_[a-z_]+")
#: Operations panels the alerts' readers look at (issue 23, item 3).
OPERATIONS = {
    "headroom_leader",
    "headroom_api_errors_total",
    "headroom_watch_restarts_total",
    "headroom_undecided_reservations",
}


def queried_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    names: set[str] = set()
    for panel in dashboard["panels"]:
        assert panel.get("datasource"), panel["title"]
        assert panel.get("targets"), panel["title"]
        for target in panel["targets"]:
            names |= {
                re.sub(r"_(bucket|count|sum)$", "", m) for m in METRIC.findall(target["expr"])
            }
    for variable in dashboard["templating"]["list"]:
        names |= set(METRIC.findall(variable.get("query", "")))
    return names


def test_every_queried_metric_is_exported(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    node = f"dash-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="4Gi")
    operator = run_operator()
    rsv.create(custom, namespace, "ok", node, 1024)
    rsv.create(custom, namespace, "no", node, 8192)
    rsv.wait_all(custom, namespace, 2)
    status, text = operator.get("/metrics")
    assert status == 200
    exported = set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))
    exported |= {f"{name}_total" for name in exported}  # counters: TYPE x, sample x_total
    queried = queried_metrics()
    assert len(queried) >= 10
    assert queried - exported == set(), f"queried but not exported: {queried - exported}"
    deprecated = {name for name in queried if re.search(r"_mb(_total)?$", name)}
    assert deprecated == set(), f"deprecated names queried: {deprecated}"
    assert queried >= OPERATIONS
