"""`make soak-repeat`: each named chaos scenario (scenarios.py) run SOAK_REPEAT times, then the table
scenario x passes/N with the failures; exit 1 when any run failed.

Environment: SOAK_REPEAT (runs of each scenario, default 20), SOAK_SCENARIOS (parts of scenario names,
joined by commas: the scenarios whose name contains one; default all). `--list` prints the names.

One pytest run per scenario (CI=true: a missing component fails, it is not skipped), its test
parametrized SOAK_REPEAT times by plugin.py, so the node starts once for all of them. Each pytest run
holds the local node's lock (/tmp/vgpud-e2e.lock) while it runs and only then, so whoever else needs the
node takes turns between scenarios. Its output and its runs (JSON lines) are in build/soak-repeat/.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.soakrepeat import scenarios
from tests.soakrepeat.report import Row, complete, read_runs, table
from tests.soakrepeat.scenarios import Scenario
from tests.support import REPO

DEFAULT_REPEAT = 20
LOCK = Path("/tmp/vgpud-e2e.lock")
OUT = REPO / "build" / "soak-repeat"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold flock(2) on `path` (as `flock PATH cmd` does), saying so when it has to wait."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"soak-repeat: waiting for {path}", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pytest_argv(scenario: Scenario, repeat: int, results: Path) -> list[str]:
    """The pytest command of one scenario: its test function collected, its one ID kept, repeated."""
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "--capture=tee-sys",  # the tests' own lines (node start time, where a kill landed) in the log
        "-p",
        "no:cacheprovider",
        "-p",
        "tests.soakrepeat.plugin",
        "--randomly-dont-reorganize",
        f"--soak-repeat={repeat}",
        f"--soak-select={scenario.test}",
        f"--soak-results={results}",
        scenario.test.partition("[")[0],
    ]


def run_scenario(
    scenario: Scenario, repeat: int, out: Path, index: int, *, lock: Path, cwd: Path = REPO
) -> Row:
    """Run one scenario's pytest under `lock`; its row, with every run it did not report failed."""
    results, log = out / f"{index:02d}.jsonl", out / f"{index:02d}.log"
    results.unlink(missing_ok=True)
    env = {
        **os.environ,
        "CI": "true",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    with locked(lock):
        started = time.monotonic()
        with log.open("w") as output:
            argv = pytest_argv(scenario, repeat, results)
            pytest = subprocess.Popen(argv, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT)
            try:
                rc = pytest.wait()
            except KeyboardInterrupt:
                # Ctrl-C reached pytest too (one process group): let it tear its node down, unlike
                # subprocess.run, which kills it a quarter of a second later
                pytest.wait()
                raise
        wall = time.monotonic() - started
    runs = complete(scenario, read_runs(results), repeat, f"pytest exited {rc} (log: {log})")
    return Row(scenario.name, tuple(runs), wall)


def _repeat() -> int:
    value = os.environ.get("SOAK_REPEAT") or str(DEFAULT_REPEAT)
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"soak-repeat: SOAK_REPEAT={value!r} is not a positive integer")
    return int(value)


def main(args: list[str]) -> int:
    if args == ["--list"]:
        print("\n".join(s.name for s in scenarios.SCENARIOS))
        return 0
    if args:
        raise SystemExit(
            f"soak-repeat: unknown arguments {args}; the settings are SOAK_REPEAT, SOAK_SCENARIOS"
        )
    repeat = _repeat()
    try:
        chosen = scenarios.select([p for p in (os.environ.get("SOAK_SCENARIOS") or "").split(",") if p])
    except ValueError as error:
        raise SystemExit(
            f"soak-repeat: SOAK_SCENARIOS: {error} (python -m tests.soakrepeat --list)"
        ) from None
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"soak-repeat: {len(chosen)} scenarios x {repeat} runs; logs in {OUT}", flush=True)
    began, rows = time.monotonic(), []
    try:
        for index, scenario in enumerate(chosen, 1):
            row = run_scenario(scenario, repeat, OUT, index, lock=LOCK)
            rows.append(row)
            print(
                f"[{index}/{len(chosen)}] {row.scenario}: {row.passes}/{len(row.runs)} passed, "
                f"{row.median_s:.1f} s/run, {row.wall_s:.0f} s",
                flush=True,
            )
    except KeyboardInterrupt:
        print(f"soak-repeat: interrupted: the {len(rows)} scenarios done of {len(chosen)}", flush=True)
        print(table(rows, time.monotonic() - began))
        return 130
    print(table(rows, time.monotonic() - began))
    return 0 if all(r.passes == len(r.runs) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
