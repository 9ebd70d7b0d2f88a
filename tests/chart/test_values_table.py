"""hack/chart-values-table.py: the chart README's values table is what values.yaml says, and the
generator's rules on small values files (nested keys, continued comments, lists, undocumented keys)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import REPO

SCRIPT = REPO / "hack" / "chart-values-table.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_values_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gen = _load()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_chart_readme_table_is_current() -> None:
    done = run("--check")
    assert done.returncode == 0, f"run make chart-docs:\n{done.stdout}{done.stderr}"


def test_every_value_of_the_chart_has_a_row() -> None:
    """The keys a user sets, as the table names them, are the values.yaml's leaves or documented maps."""
    keys = [row.key for row in gen.rows((REPO / "helm" / "vgpud" / "values.yaml").read_text())]
    assert len(keys) == len(set(keys))
    for key in ("driverName", "node.logFormat", "webhook.logFormat", "metrics.serviceMonitor.enabled"):
        assert key in keys


VALUES = """\
# Section header: not a description.
# -- Name of it.
name: x
image:
  # -- The repository,
  # continued on a second line.
  #
  # and a third.
  repository: r
  # -- Tag.
  tag: ""
metrics:
  serviceMonitor:
    # -- Make one.
    enabled: false
# -- Probe settings, one row.
probe:
  periodSeconds: 5
# -- Tolerations.
tolerations:
  - key: nvidia.com/gpu
    operator: Exists
# -- Inline map: {a: 1}, and a | pipe.
label: {key: "a|b", value: "<v>"}
# -- A long one.
long: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
# -- Nothing set: <none>, `<kept>`.
nothing: null
# -- Ratio.
ratio: 1.5
"""


def test_rows_of_a_small_values_file() -> None:
    assert [(r.key, r.type, r.default) for r in gen.rows(VALUES)] == [
        ("name", "string", '"x"'),
        ("image.repository", "string", '"r"'),
        ("image.tag", "string", '""'),
        ("metrics.serviceMonitor.enabled", "bool", "false"),
        ("probe", "object", '{"periodSeconds":5}'),
        ("tolerations", "list", '[{"key":"nvidia.com/gpu","operator":"Exists"}]'),
        ("label", "object", '{"key":"a|b","value":"<v>"}'),
        ("long", "string", '"' + "a" * 56 + "..."),
        ("nothing", "null", "null"),
        ("ratio", "float", "1.5"),
    ]
    described = {r.key: r.description for r in gen.rows(VALUES)}
    assert described["name"] == "Name of it."
    assert described["image.repository"] == "The repository, continued on a second line. and a third."


def test_the_table_escapes_what_markdown_would_misread() -> None:
    table = gen.table(gen.rows(VALUES))
    lines = table.splitlines()
    assert lines[:2] == ["| key | type | default | description |", "|---|---|---|---|"]
    assert (
        '| `label` | object | `{"key":"a\\|b","value":"<v>"}` | Inline map: {a: 1}, and a \\| pipe. |'
        in lines
    )
    assert "| `nothing` | null | `null` | Nothing set: &lt;none&gt;, `<kept>`. |" in lines
    assert all(len(line.split(" | ")[2]) <= gen.MAX_DEFAULT + 2 for line in lines[2:])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("# -- Documented.\na: 1\nb: 2\n", "b (line 3) has no `# --` comment"),
        ("# A plain comment only.\na: 1\n", "a (line 2) has no `# --` comment"),
        ("# -- Separated by a blank line.\n\na: 1\n", "a (line 3) has no `# --` comment"),
        ("outer:\n  # -- Inner.\n  x: 1\n  y: 2\n", "outer.y (line 4) has no `# --` comment"),
        ("outer:\n  z: 1\n", "outer (line 1) has no `# --` comment saying what it does (a map: above it, or"),
        (
            "# -- Both.\nouter:\n  # -- Inner.\n  x: 1\n",
            "outer has a `# --` comment and so do keys under it (line 4)",
        ),
        (
            "# -- A list.\nitems:\n  - name: a\n    # -- Inside.\n    x: 1\n",
            "items: `# --` comments inside a list (line 5)",
        ),
        ("# -- One.\n# -- Two.\na: 1\n", "a: line 3: two `# --` comments above one key"),
        ("# --\na: 1\n", "a: line 2: an empty `# --` comment"),
    ],
)
def test_what_is_not_documented_is_refused_naming_the_key(values: str, message: str) -> None:
    with pytest.raises(gen.ValuesDocError) as info:
        gen.rows(values)
    assert message in str(info.value)


def test_every_undocumented_key_is_named_at_once() -> None:
    with pytest.raises(gen.ValuesDocError) as info:
        gen.rows("a: 1\nb:\n  c: 2\n")
    assert str(info.value).splitlines() == [
        "a (line 1) has no `# --` comment saying what it does",
        "b (line 2) has no `# --` comment saying what it does (a map: above it, or above each of its keys)",
    ]


README = "# chart\n\nintro\n\n<!-- values-table:start -->\nold table\n<!-- values-table:end -->\n\nafter\n"


def test_write_then_check_and_a_stale_readme_fails_the_check(tmp_path: Path) -> None:
    values, readme = tmp_path / "values.yaml", tmp_path / "README.md"
    values.write_text("# -- The port.\nport: 80\n")
    readme.write_text(README)
    paths = ("--values", str(values), "--readme", str(readme))
    stale = run("--check", *paths)
    assert stale.returncode == 1 and readme.read_text() == README  # --check writes nothing
    assert "-old table" in stale.stdout and "+| `port` | int | `80` | The port. |" in stale.stdout
    assert "run make chart-docs" in stale.stderr
    assert run(*paths).returncode == 0
    written = readme.read_text()
    assert written.startswith("# chart\n\nintro\n\n<!-- values-table:start -->\n| key |")
    assert written.endswith("| `port` | int | `80` | The port. |\n<!-- values-table:end -->\n\nafter\n")
    assert run("--check", *paths).returncode == 0
    assert run(*paths).returncode == 0 and readme.read_text() == written  # the same values, the same file


def test_an_undocumented_key_fails_the_generator_with_its_name(tmp_path: Path) -> None:
    values, readme = tmp_path / "values.yaml", tmp_path / "README.md"
    values.write_text("# -- The port.\nport: 80\nhost: a\n")
    readme.write_text(README)
    done = run("--values", str(values), "--readme", str(readme))
    assert done.returncode == 2 and readme.read_text() == README
    assert (
        done.stderr.strip()
        == "chart-values-table: error: host (line 3) has no `# --` comment saying what it does"
    )


def test_a_readme_without_its_markers_is_an_error(tmp_path: Path) -> None:
    values, readme = tmp_path / "values.yaml", tmp_path / "README.md"
    values.write_text("# -- The port.\nport: 80\n")
    readme.write_text("# chart\n<!-- values-table:end -->\n<!-- values-table:start -->\n")
    done = run("--values", str(values), "--readme", str(readme))
    assert done.returncode == 2 and "needs one <!-- values-table:start --> line" in done.stderr
