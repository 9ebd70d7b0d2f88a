"""Prometheus and promtool as hack/install-prometheus.sh installs them, and the chart's alerting rules
as a plain Prometheus rules file.

The chart's PrometheusRule template is the one source of the rules: `render_rules` renders it with
the real helm (tests.chart.chart) and writes the object's `spec` (`groups: [...]`), which is exactly
the rules-file format `promtool` and a plain Prometheus read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from tests.chart.chart import merge, one, render
from tests.kubeapi import cache_env
from tests.support import require

PROMETHEUS_HINT = "run hack/install-prometheus.sh (make test does)"
#: the name `render_rules` gives the rules file, which the unit-test files' `rule_files` name
RULES_FILE = "vgpud-rules.yaml"


def prometheus_env() -> dict[str, str]:
    """`<cache>/prometheus.env` as a dict (PROMETHEUS_VERSION, PROMETHEUS_BIN, PROMTOOL_BIN); {} if absent."""
    return cache_env("prometheus.env")


def prometheus_bins() -> tuple[Path, Path]:
    """(prometheus, promtool); skips locally, fails under CI, when they are not installed."""
    env = prometheus_env()
    paths = [env.get(name, "") for name in ("PROMETHEUS_BIN", "PROMTOOL_BIN")]
    installed = all(path and os.access(path, os.X_OK) for path in paths)
    require(installed, "prometheus and promtool", PROMETHEUS_HINT)
    return Path(paths[0]), Path(paths[1])


def render_rules(out_dir: Path, values: dict[str, Any] | None = None) -> Path:
    """Render the chart with `values` and prometheusRule.enabled=true; write its PrometheusRule's spec
    to `out_dir`/vgpud-rules.yaml as a Prometheus rules file and return that path."""
    manifests = render(merge(values or {}, {"prometheusRule": {"enabled": True}}))
    spec = one(manifests, "PrometheusRule")["spec"]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RULES_FILE
    path.write_text(yaml.safe_dump(spec, sort_keys=False, width=1000))
    return path
