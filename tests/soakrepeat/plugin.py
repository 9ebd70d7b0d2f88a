"""The pytest plugin of the repetitions (`-p tests.soakrepeat.plugin`), for the runner.

`--soak-repeat N` parametrizes every collected test with a function-scoped `soak_repetition` (IDs
`rep1ofN` ... `repNofN`), so the session fixtures (the local node of a track) are set up once for all N
runs. `--soak-select ID` keeps the repetitions of the test whose node ID, without that repetition ID,
is ID (several allowed); an ID that selects nothing stops the run as a usage error. `--soak-results
PATH` appends one JSON line per run: the test ID, the repetition, the outcome (failed when any phase
failed, skipped when one skipped, else passed), its seconds (setup + call + teardown) and the first
line of the error.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

FIXTURE = "soak_repetition"
_REPETITION_ID = re.compile(r"rep(\d+)of(\d+)")


def repetition_id(index: int, count: int) -> str:
    return f"rep{index}of{count}"


def split_nodeid(nodeid: str) -> tuple[str, int | None]:
    """(the node ID without the repetition, the repetition) of a node ID; (nodeid, None) without one.

    The parameter IDs of a node ID are joined by `-`; the repetition is one whole part of them."""
    head, bracket, params = nodeid.partition("[")
    if not bracket:
        return nodeid, None
    parts = params.removesuffix("]").split("-")
    reps = [p for p in parts if _REPETITION_ID.fullmatch(p)]
    if not reps:
        return nodeid, None
    rest = [p for p in parts if not _REPETITION_ID.fullmatch(p)]
    match = _REPETITION_ID.fullmatch(reps[-1])
    assert match is not None
    return (f"{head}[{'-'.join(rest)}]" if rest else head), int(match.group(1))


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("soakrepeat", "chaos scenarios repeated (tests/soakrepeat)")
    group.addoption("--soak-repeat", type=_positive, default=1, help="runs of each test in this session")
    group.addoption("--soak-select", action="append", default=[], help="keep only this test ID (repeatable)")
    group.addoption("--soak-results", type=Path, default=None, help="append one JSON line per run here")


@pytest.fixture
def soak_repetition(request: pytest.FixtureRequest) -> int:
    """Which run of the test this is (1-based)."""
    return int(request.param)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    count = metafunc.config.getoption("soak_repeat")
    metafunc.fixturenames.append(FIXTURE)
    metafunc.parametrize(
        FIXTURE, range(1, count + 1), indirect=True, ids=lambda i: repetition_id(int(i), count)
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = set(config.getoption("soak_select"))
    if not wanted:
        return
    kept = [item for item in items if split_nodeid(item.nodeid)[0] in wanted]
    missing = wanted - {split_nodeid(item.nodeid)[0] for item in kept}
    if missing:
        raise pytest.UsageError(f"--soak-select: no collected test has the ID {', '.join(sorted(missing))}")
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


def first_error_line(report: pytest.TestReport) -> str:
    """The first line of what went wrong: the exception's message, or the reason of a skip."""
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        text = str(crash.message)
    elif isinstance(longrepr, tuple):
        text = str(longrepr[2])
    else:
        text = str(longrepr or "")
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


class Recorder:
    """Folds the phases of each run into one outcome and appends its JSON line after its teardown."""

    RANK: dict[str, int] = {"passed": 0, "skipped": 1, "failed": 2}

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        run = self.runs.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0, "error": ""})
        run["seconds"] += report.duration
        if self.RANK[report.outcome] > self.RANK[run["outcome"]]:
            run["outcome"] = report.outcome
            run["error"] = f"{report.when}: {first_error_line(report)}"
        if report.when != "teardown":
            return
        test, repetition = split_nodeid(report.nodeid)
        line = {"test": test, "repetition": repetition, **self.runs.pop(report.nodeid)}
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("soak_results")
    if path is not None:
        config.pluginmanager.register(Recorder(path), "soakrepeat-recorder")
