"""What an operator's Prometheus sees of a real node (issue 34): a real Prometheus (tests/prometheus.py)
scrapes vgpud and a `vgpud webhook` every second and evaluates the chart's own alert rules (rendered by
helm, each `for` shortened to FOR) while vGPU pods run on the fake GPUs.

- Every dashboard panel's query answers with data, except the panels whose empty answer is the healthy
  one (EXPECTED_EMPTY); every alert rule evaluates without error and none fires on the healthy node;
  every vgpud metric a panel or a rule reads has series (a renamed metric cannot hide behind an empty
  answer). The panels' values are printed as text (`pytest -s`).
- Injected faults fire their alerts within FIRE_WITHIN_S: an XID 79 (VgpudGPUUnhealthy), vgpud stopped
  (VgpudDown), a vGPU container created while vgpud was stopped (VgpudContainersNotInjected); each
  resolves once the fault is gone.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.test_dashboard import dashboard, metric_names, panels
from tests.e2e import fakegpu
from tests.e2e import workload as w
from tests.e2e.admission import registered
from tests.e2e.node import HEALTH_RECOVERY_S, LocalNode
from tests.e2e.promserver import PrometheusServer, Target
from tests.e2e.test_node_containers import start_while_vgpud_stopped
from tests.e2e.test_node_health import XID_FALLEN_OFF_THE_BUS, faulty_gpu
from tests.kubeapi import free_port
from tests.prometheus import render_rules
from tests.unit.webhook.process import WebhookProcess

pytestmark = pytest.mark.parametrize("node", ["nri-fakegpu"], indirect=True)

NODE_JOB, WEBHOOK_JOB = "vgpud-node", "vgpud-webhook"
#: every alert's `for` here (the chart's defaults are minutes)
FOR = "2s"
#: `for`, plus a scrape and an evaluation each second, plus slack for two busy cores
FIRE_WITHIN_S = 30.0
#: Grafana's variables, as the dashboard's "All" and a rate window over a few scrapes
VARIABLES = {"$node": ".*", "$__rate_interval": "1m"}
#: panels whose empty answer is the healthy one
EXPECTED_EMPTY = {
    "Components not healthy": "every component is healthy",
    "Top containers by SM utilization": "the probes launch no kernel: no bucket has an SM sample",
}
#: vgpud metrics that have no series on a healthy node, and why
ABSENT_WHILE_HEALTHY = {
    "vgpud_nri_eager_fallback_info": "a series only after NRI fell back to eager mode at start",
    # the series from a bucket the C library wrote: tests/unit/observe/test_usage.py
    "vgpud_container_sm_utilization_ratio": "the probes launch no kernel: no bucket has an SM sample",
}
MiB, GiB = 1 << 20, 1 << 30
CHUNK = 256 * MiB


@dataclass
class Monitored:
    node: LocalNode
    ns: str
    prometheus: PrometheusServer
    #: the rendered alerting rules: [{alert, expr, for, labels, annotations}]
    alerts: list[dict[str, Any]]


def alerting_rules(path: Path) -> list[dict[str, Any]]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


@pytest.fixture(scope="module")
def monitored(node: LocalNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    """A webhook reviewing one namespace, and Prometheus over it, vgpud and the chart's rules."""
    assert node.api is not None
    tmp = tmp_path_factory.mktemp("prometheus")
    names = [r["alert"] for r in alerting_rules(render_rules(tmp_path_factory.mktemp("defaults")))]
    values = {
        "prometheusRule": {"nodeJob": NODE_JOB, "webhookJob": WEBHOOK_JOB, "for": dict.fromkeys(names, FOR)}
    }
    rules = render_rules(tmp, values)
    ns = w.namespace(node, "prom")
    webhook = WebhookProcess(
        tmp_path_factory.mktemp("webhook"), port=free_port(), kubeconfig=node.api.kubeconfig
    )
    prometheus = None
    try:
        webhook.wait_serving()
        with registered(node.api, "vgpud-prom", ns, webhook.url, webhook.ca_bundle()):
            targets = [
                Target(NODE_JOB, f"127.0.0.1:{node.metrics_port}", {"node": node.name}),
                Target(WEBHOOK_JOB, f"127.0.0.1:{webhook.port}", ca_file=webhook.tls_dir / "ca.crt"),
            ]
            prometheus = PrometheusServer(tmp, targets, [rules])
            prometheus.wait_ready()
            w.wait_for(
                lambda: prometheus.targets_up() == {NODE_JOB: "up", WEBHOOK_JOB: "up"},
                timeout=30,
                what="Prometheus scraping vgpud and the webhook",
            )
            yield Monitored(node, ns, prometheus, alerting_rules(rules))
    finally:
        if prometheus is not None:
            prometheus.stop()
        webhook.kill()


def panel_query(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def wait_series(prometheus: PrometheusServer, expr: str, count: int, what: str, timeout: float = 90) -> None:
    w.wait_for(lambda: len(prometheus.query(expr)) >= count, timeout=timeout, what=what)


def test_every_panel_and_rule_answers_while_vgpu_pods_run(node: LocalNode, monitored: Monitored) -> None:
    prometheus, ns = monitored.prometheus, monitored.ns
    for pod, memory, cores in (("big", "2Gi", "30"), ("small", "1Gi", "20")):
        w.create_claim(node, ns, pod, [w.vgpu_request("gpu", memory, cores)])
        probe = fakegpu.probe_container(node, "main", None, "fill", "direct", str(CHUNK), "hold")
        fakegpu.create_probe_pod(node, ns, pod, [probe], pod)
    for pod in ("big", "small"):
        w.wait_running(node, ns, pod)
    wait_series(
        prometheus, f'vgpud_container_memory_used_bytes{{namespace="{ns}"}} > 0', 2, "both pods' usage"
    )
    wait_series(prometheus, "vgpud_webhook_reviews_total", 1, "the webhook's reviews of the pods")
    used = {
        r["metric"]["pod"]: float(r["value"][1])
        for r in prometheus.query(f'vgpud_container_memory_used_bytes{{namespace="{ns}"}}')
    }
    assert used == {"big": 2 * GiB, "small": 1 * GiB}, used  # each filled to its limit

    board = dashboard()
    answers: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {}
    for panel in panels(board):
        results = []
        for target in panel["targets"]:
            result = prometheus.query(panel_query(target["expr"]))
            results.append((target.get("legendFormat", ""), result))
        answers[panel["title"]] = results
    print("\n" + "\n".join(render_panels(board, answers)))
    for title, results in answers.items():
        empty = all(not result for _, result in results)
        if title in EXPECTED_EMPTY:
            assert empty, f"panel {title!r} should be empty ({EXPECTED_EMPTY[title]}): {results}"
        else:
            assert not any(not result for _, result in results), (
                f"panel {title!r} has an empty query: {results}"
            )

    rules = w.wait_for(
        lambda: (r := prometheus.rules()) and all(x["health"] != "unknown" for x in r) and r,
        what="every rule evaluated once",
    )
    assert {r["name"] for r in rules} == {a["alert"] for a in monitored.alerts}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    for alert in monitored.alerts:
        result = prometheus.query(alert["expr"])
        assert result == [], f"{alert['alert']} holds on a healthy node: {result}"

    read = set(ABSENT_WHILE_HEALTHY)
    for expr in [t["expr"] for p in panels(board) for t in p["targets"]] + [
        a["expr"] for a in monitored.alerts
    ]:
        read |= metric_names(expr)
    missing = []
    for metric in sorted(read - set(ABSENT_WHILE_HEALTHY)):
        series = f'{{__name__=~"{metric}|{metric}_total|{metric}_bucket"}}'
        if not prometheus.query(series):
            missing.append(metric)
    assert not missing, f"read by a panel or a rule, but no series: {missing}"

    for pod in ("big", "small"):
        w.delete_pod(node, ns, pod)
        w.release_claim(node, ns, pod)


def wait_firing(prometheus: PrometheusServer, name: str, since: float, **labels: str) -> float:
    """Seconds from `since` until alert `name` fires (with `labels`)."""

    def firing() -> bool:
        return any(all(a["labels"].get(k) == v for k, v in labels.items()) for a in prometheus.firing(name))

    w.wait_for(firing, timeout=FIRE_WITHIN_S, interval=0.5, what=f"{name} firing")
    return time.monotonic() - since


def wait_resolved(prometheus: PrometheusServer, name: str, timeout: float = 90) -> None:
    w.wait_for(
        lambda: not [a for a in prometheus.alerts() if a["labels"]["alertname"] == name],
        timeout=timeout,
        what=f"{name} resolved",
    )


def test_an_xid_79_fires_the_gpu_alert_until_it_recovers(node: LocalNode, monitored: Monitored) -> None:
    prometheus = monitored.prometheus
    raised = time.monotonic()
    with faulty_gpu(node, 0, XID_FALLEN_OFF_THE_BUS):
        took = wait_firing(prometheus, "VgpudGPUUnhealthy", raised, index="0", node=node.name)
    print(f"\nVgpudGPUUnhealthy fired {took:.1f} s after the XID (for: {FOR})")
    wait_resolved(prometheus, "VgpudGPUUnhealthy", timeout=HEALTH_RECOVERY_S + 60)


def test_vgpud_stopped_and_a_container_created_meanwhile_fire_their_alerts(
    node: LocalNode, monitored: Monitored
) -> None:
    """vgpud stopped (SIGSTOP: its scrapes time out) fires VgpudDown; containerd drops the stalled plugin
    and creates the pod's container without the injection, which fires VgpudContainersNotInjected once
    vgpud is back (tests/e2e/test_node_containers.py has the runtime's side of this)."""
    prometheus, ns = monitored.prometheus, monitored.ns
    w.create_claim(node, ns, "late", [w.vgpu_request("gpu", "1Gi", "5")])
    down: list[float] = []

    def down_fires() -> None:
        stopped = time.monotonic()
        down.append(wait_firing(prometheus, "VgpudDown", stopped, node=node.name))

    start_while_vgpud_stopped(node, ns, "late", "late", while_stopped=down_fires)
    back = time.monotonic()
    took_missing = wait_firing(prometheus, "VgpudContainersNotInjected", back, node=node.name)
    print(
        f"\nVgpudDown fired {down[0]:.1f} s after vgpud stopped; VgpudContainersNotInjected "
        f"{took_missing:.1f} s after its Synchronize on resuming (for: {FOR})"
    )
    wait_resolved(prometheus, "VgpudDown")
    w.delete_pod(node, ns, "late")
    w.release_claim(node, ns, "late")
    wait_resolved(prometheus, "VgpudContainersNotInjected")


# -- the panels as text ---------------------------------------------------------------------------


def render_panels(
    board: dict[str, Any], answers: dict[str, list[tuple[str, list[dict[str, Any]]]]]
) -> list[str]:
    """Each panel's title and its series' current values, in the panel's unit: the dashboard as text."""
    lines = []
    for panel in panels(board):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        lines.append(f"[{panel['title']}]")
        shown = 0
        for legend, result in answers.get(panel["title"], []):
            for series in result:
                labels = series["metric"]
                name = legend_of(legend, labels) or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
                lines.append(f"  {name or '(value)'}: {formatted(float(series['value'][1]), unit)}")
                shown += 1
        if not shown:
            lines.append("  (no series)")
    return lines


def legend_of(legend: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), legend).strip()


def formatted(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / GiB:.2f} GiB" if value >= GiB else f"{value / MiB:.0f} MiB"
    if unit == "percentunit":
        return f"{value * 100:.1f}%"
    if unit == "s":
        return f"{value * 1000:.2f} ms"
    if unit == "reqps":
        return f"{value:.3f}/s"
    return f"{value:g}"
