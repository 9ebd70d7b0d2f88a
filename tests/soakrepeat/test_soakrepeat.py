"""The repetitions' list, plugin and runner, without a node: the scenario IDs against the e2e suite as
pytest collects it, and the runner on a small test module of its own (a real pytest run each)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.soakrepeat import __main__ as runner
from tests.soakrepeat import scenarios
from tests.soakrepeat.plugin import split_nodeid
from tests.soakrepeat.report import Row, table
from tests.soakrepeat.scenarios import SCENARIOS, Scenario
from tests.support import REPO


def collected_e2e_ids() -> set[str]:
    """The node IDs of tests/e2e as `pytest --collect-only` lists them."""
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/e2e"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_every_scenario_is_a_collected_e2e_test() -> None:
    collected = collected_e2e_ids()
    assert len(collected) > 50  # the e2e suite, not an empty collection
    assert [s.test for s in SCENARIOS if s.test not in collected] == []


def test_names_and_tests_are_unique() -> None:
    assert len({s.name for s in SCENARIOS}) == len(SCENARIOS)
    assert len({s.test for s in SCENARIOS}) == len(SCENARIOS)
    assert not [s.name for s in SCENARIOS if "," in s.name]  # SOAK_SCENARIOS splits at commas


def test_select_by_parts_of_names() -> None:
    assert scenarios.select([]) == SCENARIOS
    nri = scenarios.select(["[nri]"])
    assert nri and all(s.name.endswith("[nri]") for s in nri)
    both = scenarios.select(["kubelet SIGKILL", "containerd restart [eager]"])
    assert [s.name for s in both] == [
        "containerd restart [eager]",
        "kubelet SIGKILL once the claim is prepared [nri]",
        "kubelet SIGKILL once the claim is prepared [eager]",
        "kubelet SIGKILL with the sandbox up [nri]",
        "kubelet SIGKILL with the sandbox up [eager]",
    ]
    with pytest.raises(ValueError, match="'no such'"):
        scenarios.select(["[nri]", "no such"])


@pytest.mark.parametrize(
    ("nodeid", "split"),
    [
        ("t.py::f[rep2of3-nri-cd2]", ("t.py::f[nri-cd2]", 2)),
        ("t.py::f[nri-prepared-rep10of20]", ("t.py::f[nri-prepared]", 10)),
        ("t.py::f[rep1of1]", ("t.py::f", 1)),
        ("t.py::f[nri]", ("t.py::f[nri]", None)),
        ("t.py::f", ("t.py::f", None)),
    ],
)
def test_split_nodeid(nodeid: str, split: tuple[str, int | None]) -> None:
    assert split_nodeid(nodeid) == split


#: a session fixture (as the node is) counted at each set-up, and a test failing at its second run
FLAKY = """
from pathlib import Path
import pytest

@pytest.fixture(scope="session")
def node():
    setups = Path("setups")
    setups.write_text(setups.read_text() + "x" if setups.exists() else "x")
    return Path("runs")

@pytest.mark.parametrize("track", ["a", "a-b"])
def test_flaky(node, track):
    runs = int(node.read_text()) + 1 if node.exists() else 1
    node.write_text(str(runs))
    assert runs != 2, "the second run\\nfails"
"""


def test_the_runner_repeats_one_test_with_one_session_and_reports_each_run(tmp_path: Path) -> None:
    (tmp_path / "test_flaky.py").write_text(FLAKY)
    scenario = Scenario("flaky [a-b]", "test_flaky.py::test_flaky[a-b]")
    row = runner.run_scenario(scenario, 3, tmp_path, 1, lock=tmp_path / "lock", cwd=tmp_path)
    assert [(r.repetition, r.outcome) for r in row.runs] == [(1, "passed"), (2, "failed"), (3, "passed")]
    assert row.runs[1].error == "call: AssertionError: the second run"
    assert (tmp_path / "setups").read_text() == "x"  # one session for the three runs
    assert (tmp_path / "runs").read_text() == "3"  # and only the selected track ran
    text = table([row], 12.0)
    assert "flaky [a-b]" in text and " 2/3 " in text
    assert "failures:\n  flaky [a-b] run 2: failed: call: AssertionError: the second run" in text
    assert "2/3 runs passed, 1 scenarios, 12 s in all" in text


def test_a_test_id_pytest_cannot_select_fails_every_run(tmp_path: Path) -> None:
    (tmp_path / "test_flaky.py").write_text(FLAKY)
    scenario = Scenario("renamed", "test_flaky.py::test_flaky[c]")
    row = runner.run_scenario(scenario, 2, tmp_path, 7, lock=tmp_path / "lock", cwd=tmp_path)
    assert row.passes == 0 and len(row.runs) == 2
    assert row.runs[0].error == f"not run: pytest exited 4 (log: {tmp_path / '07.log'})"
    assert "no collected test has the ID test_flaky.py::test_flaky[c]" in (tmp_path / "07.log").read_text()


def test_a_row_without_failures_lists_none() -> None:
    assert "failures" not in table([Row("s", (), 0.0)], 0.0)


@pytest.mark.parametrize("value", ["0", "-1", "x", "2.5"])
def test_a_bad_repeat_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SOAK_REPEAT", value)
    with pytest.raises(SystemExit, match=f"SOAK_REPEAT={value!r} is not a positive integer"):
        runner.main([])


def test_an_unknown_scenario_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOAK_SCENARIOS", "containerd restart,no such thing")
    with pytest.raises(SystemExit, match="no scenario name contains 'no such thing'"):
        runner.main([])


#: a test that runs until interrupted; its session fixture's teardown takes a second (as a node's
#: does: a killed pytest would not get to its mark)
SLOW = """
import time
from pathlib import Path
import pytest

@pytest.fixture(scope="session")
def node():
    yield
    time.sleep(1)
    Path("torn-down").write_text("yes")

def test_slow(node):
    Path("running").write_text("yes")
    time.sleep(60)
"""

#: first, Ctrl-C delivered and raising KeyboardInterrupt whatever the test process made of SIGINT (an
#: ignored disposition and a blocked mask are inherited across exec: a CI run once got a child that
#: slept through the Ctrl-C, 62 s); the scenario's pytest inherits that
INTERRUPTED = """
import signal
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
signal.signal(signal.SIGINT, signal.default_int_handler)
import sys
from pathlib import Path
from tests.soakrepeat import __main__ as runner
from tests.soakrepeat.scenarios import Scenario
here = Path(sys.argv[1])
try:
    runner.run_scenario(Scenario("slow", "test_slow.py::test_slow"), 1, here, 1, lock=here / "lock", cwd=here)
except KeyboardInterrupt:
    print("interrupted", (here / "torn-down").exists())
"""


def test_ctrl_c_lets_the_scenarios_pytest_tear_its_node_down(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text(SLOW)
    argv = [sys.executable, "-c", INTERRUPTED, str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True) as proc:
        deadline = time.monotonic() + 30
        while not (tmp_path / "running").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the test never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground process group
        out, _ = proc.communicate(timeout=30)
    assert out.strip() == "interrupted True"
