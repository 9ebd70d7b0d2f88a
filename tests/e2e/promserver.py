"""A real Prometheus (built from its Go module, tests/prometheus.py) for the e2e: scraping vgpud and the
webhook every second, evaluating the chart's alert rules every second, answering PromQL over its HTTP
API on a loopback port. Stopped by its PID."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.kubeapi import free_port
from tests.prometheus import prometheus_bins

#: how often Prometheus scrapes and evaluates: the alerts' shortened `for` windows are a few of these
INTERVAL_S = 1
READY_TIMEOUT_S = 30


@dataclass
class Target:
    """One scrape job: its targets, extra labels on every series, and TLS for an HTTPS endpoint."""

    job: str
    address: str
    labels: dict[str, str] = field(default_factory=dict)
    #: the CA that signed the target's serving certificate; None: plain HTTP
    ca_file: Path | None = None


class PrometheusServer:
    """`prometheus` with one scrape job per target and the given rule files, in `workdir`."""

    def __init__(self, workdir: Path, targets: list[Target], rule_files: list[Path]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.log = workdir / "prometheus.log"
        config = {
            "global": {
                "scrape_interval": f"{INTERVAL_S}s",
                "scrape_timeout": f"{INTERVAL_S}s",
                "evaluation_interval": f"{INTERVAL_S}s",
            },
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [_scrape_config(t) for t in targets],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        prometheus, _ = prometheus_bins()
        argv = [
            str(prometheus),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {timeout}s:\n{self.output()}")

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; its `data`, or AssertionError with Prometheus's error."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result: [{metric: {labels}, value: [t, "v"]}] (a scalar as one entry)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def targets_up(self) -> dict[str, str]:
        """job -> health of its target (up, down, unknown)."""
        return {t["labels"]["job"]: t["health"] for t in self.api("targets")["activeTargets"]}

    def alerts(self) -> list[dict[str, Any]]:
        """Every pending or firing alert: [{labels: {alertname, ...}, state, activeAt, ...}]."""
        return self.api("alerts")["alerts"]

    def rules(self) -> list[dict[str, Any]]:
        """Every alerting rule with its evaluation health (ok, err, unknown) and last error."""
        return [r for g in self.api("rules")["groups"] for r in g["rules"] if r["type"] == "alerting"]

    def firing(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _scrape_config(target: Target) -> dict[str, Any]:
    static: dict[str, Any] = {"targets": [target.address]}
    if target.labels:
        static["labels"] = target.labels
    config: dict[str, Any] = {"job_name": target.job, "static_configs": [static]}
    if target.ca_file is not None:
        config["scheme"] = "https"
        config["tls_config"] = {"ca_file": str(target.ca_file)}
    return config
