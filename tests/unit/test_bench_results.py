"""The benches' result lines and `make bench`'s summary (bench/lib/results.py, bench/summary.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.lib.results import RESULTS_ENV, Figure, emit, load

SUMMARY = Path(__file__).resolve().parents[2] / "bench" / "summary.py"


def summary(results: Path, *expect: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(SUMMARY), str(results), "--expect", *expect]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def test_emit_appends_one_line_per_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "r.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(target))
    emit(
        "a", [Figure("x p99", 12.5, "ms", reference="floor", ratio=1.25, goal="<= 50 ms", met=True)], ok=True
    )
    emit("b", [], ok=False)
    rows = load(target)
    assert [r["bench"] for r in rows] == ["a", "b"]
    assert rows[0]["figures"][0]["ratio"] == 1.25 and rows[1]["ok"] is False


def test_emit_without_the_variable_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    emit("a", [], ok=True)
    assert list(tmp_path.iterdir()) == []


def test_a_line_that_is_not_a_result_is_named(tmp_path: Path) -> None:
    target = tmp_path / "r.jsonl"
    target.write_text('{"bench": "a", "ok": true, "figures": []}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"r.jsonl:2: not a bench result line"):
        load(target)


def test_summary_prints_every_figure_and_fails_on_a_failed_or_missing_bench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "r.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(target))
    emit("prepare", [Figure("Prepare 64 claims p99", 42.0, "ms", "floor", 1.1, "<= 50 ms", True)], ok=True)
    good = summary(target, "prepare")
    assert good.returncode == 0, good.stderr
    assert "Prepare 64 claims p99" in good.stdout and "1.10x" in good.stdout and "yes" in good.stdout
    quiet = subprocess.run(
        [sys.executable, str(SUMMARY), str(target), "--ran", "prepare", "registry"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert quiet.returncode == 0 and "registry     (no result line" in quiet.stdout
    missing = summary(target, "prepare", "footprint")
    assert missing.returncode == 1 and "footprint: wrote no result line" in missing.stderr
    emit("stream", [], ok=False)
    failed = summary(target, "prepare")
    assert failed.returncode == 1 and "stream: its correctness check failed" in failed.stderr


def test_nri_latency_figures_hold_the_goals_of_the_issue() -> None:
    """The harness's JSON (plugin under test first, the Go stub second) -> ratios and goal verdicts:
    CreateContainer's p99 within 1.3x of the Go stub's, Synchronize within 1.5x."""
    from bench.nri_latency import summary_figures

    def row(c1_p99: float, c32_p99: float, sync: float) -> dict:
        return {"create_c1": {"p99_ms": c1_p99}, "create_c32": {"p99_ms": c32_p99}, "sync_ms": sync}

    c1, c32, sync = summary_figures([row(2.5, 30.0, 60.0), row(2.0, 25.0, 50.0)])
    assert (c1.ratio, c1.met) == (1.25, True)
    assert (c32.ratio, c32.met) == (1.2, True)
    assert (sync.ratio, sync.met) == (1.2, True)
    c1, c32, sync = summary_figures([row(1.4, 35.0, 80.0), row(1.0, 25.0, 50.0)])
    assert (c1.met, c32.met, sync.met) == (False, False, False)  # 1.4x, 1.4x, 1.6x
