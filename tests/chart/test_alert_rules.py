"""The chart's alerting rules (templates/prometheusrule.yaml) as Prometheus sees them: rendered with the
real helm, checked by `promtool check rules`, and exercised by the unit tests in tests/alerts/*.test.yaml
(`promtool test rules`: synthetic series, each alert firing after its `for` and staying quiet). Beside
that, what keeps the rules, their runbooks, their values and vgpud's metric names one set."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chart import CHART, RELEASE, merge, one, render
from tests.prometheus import RULES_FILE, prometheus_bins, render_rules
from tests.support import REPO
from vgpud import metrics_names

#: the runbookBaseUrl the unit tests' expected annotations are written for
RUNBOOKS = "https://vgpud.test/docs/alerts.md"
UNIT_TESTS = REPO / "tests" / "alerts"
RUNBOOK_DOC = REPO / "docs" / "alerts.md"
PROMTOOL_TIMEOUT_S = 60
#: labels every series gets from its scrape target (the ServiceMonitor's, `node` by its relabeling)
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "node"})
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")

Rule = dict[str, Any]


def load_rules(path: Path) -> list[Rule]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def chart_rules(values: dict[str, Any] | None = None) -> list[Rule]:
    manifests = render(merge(values or {}, {"prometheusRule": {"enabled": True}}))
    return [rule for group in one(manifests, "PrometheusRule")["spec"]["groups"] for rule in group["rules"]]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    _, tool = prometheus_bins()
    return subprocess.run(
        [str(tool), *args], cwd=cwd, capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S, check=False
    )


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart's rules with every default and the test runbook URL."""
    return render_rules(tmp_path_factory.mktemp("rules"), {"prometheusRule": {"runbookBaseUrl": RUNBOOKS}})


@pytest.fixture(scope="module")
def alerts(rules_file: Path) -> dict[str, Rule]:
    rules = load_rules(rules_file)
    by_name = {rule["alert"]: rule for rule in rules}
    assert len(by_name) == len(rules), "two rules share an alert name"
    return by_name


def test_promtool_check_rules_passes(rules_file: Path) -> None:
    done = promtool("check", "rules", rules_file.name, cwd=rules_file.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_check_rules_fails_on_a_broken_rule(rules_file: Path, tmp_path: Path) -> None:
    """The check can fail: the same file with one expression cut short is refused, naming the rule."""
    groups = yaml.safe_load(rules_file.read_text())
    broken = groups["groups"][0]["rules"][0]
    broken["expr"] = broken["expr"].replace("}", "", 1)
    (tmp_path / RULES_FILE).write_text(yaml.safe_dump(groups, sort_keys=False))
    done = promtool("check", "rules", RULES_FILE, cwd=tmp_path)
    assert done.returncode != 0
    assert broken["alert"] in done.stdout + done.stderr


def unit_test_files() -> list[Path]:
    return sorted(UNIT_TESTS.glob("*.test.yaml"))


def run_unit_tests(rules_file: Path, test_file: Path, directory: Path) -> subprocess.CompletedProcess[str]:
    """promtool reads `rule_files` relative to the test file: both go into `directory`."""
    shutil.copy(rules_file, directory / RULES_FILE)
    shutil.copy(test_file, directory / test_file.name)
    return promtool("test", "rules", test_file.name, cwd=directory)


@pytest.mark.parametrize("test_file", unit_test_files(), ids=lambda path: path.name)
def test_promtool_unit_tests_pass(rules_file: Path, test_file: Path, tmp_path: Path) -> None:
    done = run_unit_tests(rules_file, test_file, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_test_fails_on_a_wrong_expectation(rules_file: Path, tmp_path: Path) -> None:
    """The unit tests can fail: VgpudDown expected one evaluation before its `for` is up is refused."""
    case = {
        "rule_files": [RULES_FILE],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'up{job="vgpud-metrics", instance="i", node="n"}', "values": "0x10"}
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "4m",
                        "alertname": "VgpudDown",
                        "exp_alerts": [
                            {"exp_labels": {"severity": "critical", "instance": "i", "node": "n"}}
                        ],
                    }
                ],
            }
        ],
    }
    test_file = tmp_path / "source" / "early.test.yaml"
    test_file.parent.mkdir()
    test_file.write_text(yaml.safe_dump(case))
    done = run_unit_tests(rules_file, test_file, tmp_path)
    assert done.returncode != 0
    assert "VgpudDown" in done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test(alerts: dict[str, Rule]) -> None:
    firing: dict[str, int] = defaultdict(int)
    quiet: dict[str, int] = defaultdict(int)
    for path in unit_test_files():
        document = yaml.safe_load(path.read_text())
        assert document["rule_files"] == [RULES_FILE], path.name
        for case in document["tests"]:
            for check in case.get("alert_rule_test", []):
                name = check["alertname"]
                assert name in alerts, f"{path.name}: {name} is not an alert of the chart"
                (firing if check.get("exp_alerts") else quiet)[name] += 1
    assert set(alerts) - set(firing) == set(), "alerts without a unit test where they fire"
    assert set(alerts) - set(quiet) == set(), "alerts without a unit test where they stay quiet"


def runbook_sections() -> dict[str, str]:
    """docs/alerts.md's `## ` sections: GitHub's anchor of the heading -> the section's text."""
    sections: dict[str, str] = {}
    anchor = ""
    for line in RUNBOOK_DOC.read_text().splitlines():
        if line.startswith("## "):
            anchor = re.sub(r"[^a-z0-9 _-]", "", line[3:].strip().lower()).replace(" ", "-")
            sections[anchor] = ""
        elif anchor:
            sections[anchor] += line + "\n"
    return sections


def test_every_alert_has_a_runbook_section_its_url_points_to(alerts: dict[str, Rule]) -> None:
    sections = runbook_sections()
    for name, rule in alerts.items():
        anchor = name.lower()
        assert anchor in sections, f"docs/alerts.md has no section `## {name}`"
        assert rule["annotations"]["runbook_url"] == f"{RUNBOOKS}#{anchor}"
        for part in ("**Means**", "**Likely causes**", "**Check**", "**Do**"):
            assert part in sections[anchor], f"docs/alerts.md, {name}: no {part}"
    assert set(sections) <= {name.lower() for name in alerts}, "a runbook section of no alert"


def test_without_a_runbook_base_url_the_alerts_have_no_runbook_url() -> None:
    rules = chart_rules()
    assert rules and all("runbook_url" not in rule["annotations"] for rule in rules)
    assert all({"summary", "description"} <= rule["annotations"].keys() for rule in rules)


def test_every_alert_is_named_and_labelled_alike(alerts: dict[str, Rule]) -> None:
    for name, rule in alerts.items():
        assert re.fullmatch(r"Vgpud[A-Z][A-Za-z]+", name), name
        assert rule["labels"] == {"severity": rule["labels"]["severity"]}, name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name


def test_for_values_are_exactly_the_alerts(alerts: dict[str, Rule]) -> None:
    """Each `for` value names an alert (the schema refuses any other key), and each alert takes its
    `for` from there: a value can neither do nothing nor be missing."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["for"]
    schema = json.loads((CHART / "values.schema.json").read_text())
    declared = schema["properties"]["prometheusRule"]["properties"]["for"]
    assert declared["additionalProperties"] is False
    assert set(values) == set(alerts) == set(declared["properties"])
    for name, rule in alerts.items():
        assert rule["for"] == values[name], name


def test_a_for_value_reaches_its_alert_only() -> None:
    changed = {
        rule["alert"]: rule["for"] for rule in chart_rules({"prometheusRule": {"for": {"VgpudDown": "1m"}}})
    }
    default = {rule["alert"]: rule["for"] for rule in chart_rules()}
    assert changed.pop("VgpudDown") == "1m" and default.pop("VgpudDown") == "5m"
    assert changed == default


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """Every `metric{matchers}` of a PromQL expression: the metric and the label names it matches on."""
    return [
        (metric, set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", matchers)))
        for metric, matchers in re.findall(r"([a-zA-Z_:][\w:]*)\{([^}]*)\}", expr)
    ]


def test_rules_use_only_vgpuds_metric_names_and_labels(alerts: dict[str, Rule]) -> None:
    """Every metric a rule reads is declared in vgpud/metrics_names.py (or is Prometheus's `up`), and
    every label it matches on is that metric's, or its target's."""
    declared = {metric.name: metric for metric in metrics_names.ALL}
    for name, rule in alerts.items():
        used = selectors(rule["expr"])
        assert used, f"{name}: no metric selector in {rule['expr']!r}"
        assert set(re.findall(r"\bvgpud_\w+", rule["expr"])) <= {metric for metric, _ in used}, name
        for metric, labels in used:
            if metric == "up":
                assert labels <= TARGET_LABELS, name
                continue
            base, extra = metric, set()
            if metric not in declared and metric.endswith(HISTOGRAM_SUFFIXES):
                base, extra = metric.rsplit("_", 1)[0], {"le"}
            assert base in declared, f"{name}: {metric} is not in vgpud/metrics_names.py"
            assert labels <= TARGET_LABELS | set(declared[base].labels) | extra, f"{name}: {metric}{labels}"


def test_jobs_default_to_the_scraped_services_and_can_be_set() -> None:
    """What a ServiceMonitor gives as `job` (the Service's name) is what the rules select by default."""
    manifests = render({"prometheusRule": {"enabled": True}})
    node_job = one(manifests, "Service", "-metrics")["metadata"]["name"]
    webhook_job = one(manifests, "Service", "-webhook")["metadata"]["name"]
    assert (node_job, webhook_job) == (f"{RELEASE}-metrics", f"{RELEASE}-webhook")
    jobs = {"nodeJob": "kubernetes-pods", "webhookJob": "vgpud-admission"}
    for values, node, webhook in (({}, node_job, webhook_job), (jobs, *jobs.values())):
        for rule in chart_rules({"prometheusRule": values}):
            job = webhook if rule["alert"].startswith("VgpudWebhook") else node
            matchers = re.findall(r'job="([^"]*)"', rule["expr"])
            assert matchers and set(matchers) == {job}, rule["alert"]


def test_alerts_follow_the_parts_that_are_on() -> None:
    everything = {rule["alert"] for rule in chart_rules()}
    webhook = {name for name in everything if name.startswith("VgpudWebhook")}
    assert webhook and webhook < everything
    assert {rule["alert"] for rule in chart_rules({"metrics": {"enabled": False}})} == webhook
    assert {rule["alert"] for rule in chart_rules({"webhook": {"enabled": False}})} == everything - webhook
    assert not [m for m in render() if m["kind"] == "PrometheusRule"]


def test_prometheus_rule_object_carries_the_extra_labels() -> None:
    manifests = render({"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}})
    rule = one(manifests, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert [group["name"] for group in rule["spec"]["groups"]] == ["vgpud"]
