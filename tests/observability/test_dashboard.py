"""The Grafana dashboard (deploy/grafana/partkeeper.json) and the metrics the services export
stay in step: every query names only exported series, every exported metric is on some panel
(or in EXCLUDED, with the reason), and the ConfigMap Grafana's sidecar loads carries the JSON.

The exported set is read from the Prometheus registry the services register into, never from a
copied list, so a metric added to partkeeper/telemetry/metrics.py without a panel fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from partkeeper.telemetry import metrics
from tests_support.manifests import DEPLOY, render

DASHBOARD = DEPLOY / "grafana" / "partkeeper.json"
SERIES = re.compile(r"\bpartkeeper_[a-z_]+\b")
# Exported metric -> why no panel shows it. Empty today: every metric has a panel.
EXCLUDED: dict[str, str] = {}
# Panel queries filter and group by these labels; the PodMonitor's relabelings add them.
SCRAPE_LABELS = {"node", "container"}


def _exported() -> dict[str, set[str]]:
    """Metric family -> the series names it exports, for every partkeeper metric registered."""
    assert metrics.ALLOCATIONS  # the module declares them on import
    found: dict[str, set[str]] = {}
    for family in REGISTRY.collect():
        if not family.name.startswith("partkeeper_"):
            continue
        if family.type == "counter":
            found[family.name] = {f"{family.name}_total"}
        elif family.type == "histogram":
            found[family.name] = {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
        else:
            found[family.name] = {family.name}
    return found


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row keeps its panels inside
    return out


def _queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_every_query_names_exported_series(dashboard: dict[str, Any]) -> None:
    series = set().union(*_exported().values())
    queries = _queries(dashboard)
    assert queries
    for expr in queries:
        named = set(SERIES.findall(expr))
        assert named, f"query names no partkeeper metric: {expr}"
        assert named <= series, f"{expr} names what no service exports: {named - series}"


def test_every_exported_metric_is_on_a_panel_or_excluded(dashboard: dict[str, Any]) -> None:
    shown = {name for expr in _queries(dashboard) for name in SERIES.findall(expr)}
    for family, series in _exported().items():
        if family in EXCLUDED:
            assert not series & shown, f"{family} is excluded ({EXCLUDED[family]}) yet shown"
            continue
        assert series & shown, f"no panel shows {family}; add one or exclude it with a reason"
    assert set(EXCLUDED) <= set(_exported()), "EXCLUDED names a metric no longer exported"


def test_the_dashboard_is_importable(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "label_values(partkeeper_build_info, node)" in variables["node"]["definition"]
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["description"], f"panel {panel['title']!r} says nothing of what it shows"
        for target in panel["targets"]:
            assert 'node=~"$node"' in target["expr"], target["expr"]
            grouped = re.findall(r"by \(([^)]*)\)", target["expr"])
            for labels in grouped:
                for label in (x.strip() for x in labels.split(",")):
                    assert label in SCRAPE_LABELS | _labels() | {"le"}, (label, target["expr"])


def _labels() -> set[str]:
    """Every label name the partkeeper metrics declare."""
    declared = (m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase))
    return {label for m in declared for label in m._labelnames}


def test_the_configmap_carries_the_dashboard_for_the_sidecar() -> None:
    docs = render(DEPLOY)
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"
            and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert cm["metadata"]["namespace"] == "partkeeper"
    assert json.loads(cm["data"]["partkeeper.json"]) == json.loads(DASHBOARD.read_text())


def test_the_podmonitor_adds_the_labels_the_queries_group_by() -> None:
    monitor = Path(DEPLOY / "components" / "podmonitor" / "podmonitor.yaml").read_text()
    for label in SCRAPE_LABELS:
        assert f"targetLabel: {label}" in monitor
