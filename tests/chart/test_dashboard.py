"""The Grafana dashboard the chart ships: rendered into its ConfigMap only when switched on, byte for byte
the chart's dashboards/vgpud.json, and every query names only metrics vgpud exports (so a renamed
metric fails here, not on an operator's screen). That each query answers against a real Prometheus is
the Prometheus e2e's job (tests/e2e/test_node_prometheus.py)."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.chart.chart import CHART, NAMESPACE, find, one, render
from vgpud import metrics_names as names

DASHBOARD = CHART / "dashboards" / "vgpud.json"
#: suffixes Prometheus adds to a histogram's series
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that queries (rows carry none)."""
    return [p for p in board["panels"] if p["type"] != "row"]


def metric_names(expr: str) -> set[str]:
    """The vgpud metric names a PromQL expression reads."""
    found = set(re.findall(r"\bvgpud_[a-z0-9_]+", expr))
    return {next((n.removesuffix(s) for s in HISTOGRAM_SERIES if n.endswith(s)), n) for n in found}


def test_the_configmap_carries_the_dashboard_with_the_sidecar_label_only_when_enabled() -> None:
    assert find(render(), "ConfigMap", "-dashboard") == []
    values = {"grafanaDashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"f": "vgpu"}}}
    config_map = one(render(values), "ConfigMap", "-dashboard")
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"f": "vgpu"}
    assert json.loads(config_map["data"]["vgpud.json"]) == dashboard()


def test_the_configmap_defaults_to_the_release_namespace() -> None:
    config_map = one(render({"grafanaDashboard": {"enabled": True}}), "ConfigMap", "-dashboard")
    assert config_map["metadata"]["namespace"] == NAMESPACE


def test_every_query_reads_metrics_vgpud_exports() -> None:
    exported = {n.name.removesuffix("_total") for n in names.ALL} | {n.name for n in names.ALL}
    for panel in panels(dashboard()):
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            read = metric_names(target["expr"])
            assert read, f"panel {panel['title']!r}: {target['expr']!r} reads no vgpud metric"
            assert read <= exported, f"panel {panel['title']!r} reads unknown metrics {read - exported}"


def test_panels_have_unique_ids_titles_and_fit_the_grid() -> None:
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in panels(board)]
    assert len(titles) == len(set(titles))
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    node_filtered = [p["title"] for p in panels(board) if "Webhook" not in p["title"]]
    for panel in panels(board):
        if panel["title"] in node_filtered:
            assert all('node=~"$node"' in t["expr"] for t in panel["targets"]), panel["title"]
