"""The runs of the repetitions read back (the plugin's JSON lines), and what the runner prints: one row
per scenario (passes/N, the median seconds of one run, the wall time of its pytest run) and one line per
failed run with the first line of its error."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from tests.soakrepeat.scenarios import Scenario


@dataclass(frozen=True)
class Run:
    """One run of a scenario's test."""

    test: str
    repetition: int
    outcome: str
    seconds: float
    error: str

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"


def read_runs(path: Path) -> list[Run]:
    """The plugin's lines in `path` (none when pytest never got to write one)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Run(**json.loads(line)) for line in lines if line.strip()]


def complete(scenario: Scenario, runs: list[Run], repeat: int, why: str) -> list[Run]:
    """The scenario's runs 1..repeat: the recorded ones, and a failed run saying `why` for each missing
    one (pytest stopped early, or never collected it)."""
    recorded = {r.repetition: r for r in runs if r.test == scenario.test}
    return [
        recorded.get(i) or Run(scenario.test, i, "failed", 0.0, f"not run: {why}")
        for i in range(1, repeat + 1)
    ]


@dataclass(frozen=True)
class Row:
    """A scenario's line of the table."""

    scenario: str
    runs: tuple[Run, ...]
    wall_s: float

    @property
    def passes(self) -> int:
        return sum(r.passed for r in self.runs)

    @property
    def median_s(self) -> float:
        """The median seconds of one run: the first run also starts the node, the last one stops it."""
        return statistics.median(r.seconds for r in self.runs) if self.runs else 0.0


def table(rows: list[Row], total_s: float) -> str:
    """scenario | passes/N | s per run (median) | pytest wall s, then the failures, then the total."""
    width = max([len("scenario"), *(len(r.scenario) for r in rows)])
    lines = [f"{'scenario':<{width}}  {'passes':>7}  {'s/run':>6}  {'wall s':>7}"]
    lines += [
        f"{r.scenario:<{width}}  {f'{r.passes}/{len(r.runs)}':>7}  {r.median_s:>6.1f}  {r.wall_s:>7.1f}"
        for r in rows
    ]
    failed = [(r.scenario, run) for r in rows for run in r.runs if not run.passed]
    runs = sum(len(r.runs) for r in rows)
    lines.append(f"{runs - len(failed)}/{runs} runs passed, {len(rows)} scenarios, {total_s:.0f} s in all")
    if failed:
        lines.append("failures:")
        lines += [f"  {name} run {run.repetition}: {run.outcome}: {run.error}" for name, run in failed]
    return "\n".join(lines)
