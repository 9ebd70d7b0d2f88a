"""The core limit's closed-loop simulation (csrc/libvgpu/tests/test_core_sim.c): the real C bucket and
controller against a simulated GPU. Checks each case's achieved share and mean absolute error from the
figures the binary prints, so a regression names the GPU and target it broke."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support import built

CASE = re.compile(
    r"^sim: +(?P<sms>\d+) SMs, +(?P<ns>\d+) ns/block, grid +\d+, target (?P<target>\d+)%: "
    r"share +(?P<share>[\d.]+)% \(\|err\| [\d.]+\), MAE (?P<mae>[\d.]+)$",
    re.MULTILINE,
)


@pytest.fixture(scope="module")
def sim_output() -> str:
    binary = built("libvgpu/tests/test_core_sim")
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.needs_build
def test_every_gpu_and_target_within_three_points(sim_output: str) -> None:
    cases = [m.groupdict() for m in CASE.finditer(sim_output)]
    seen = {(int(c["sms"]), int(c["target"])) for c in cases}
    assert {(20, 30), (20, 60), (132, 30), (132, 60)} <= seen, sim_output
    for case in cases:
        target, share, mae = float(case["target"]), float(case["share"]), float(case["mae"])
        where = f"{case['sms']} SMs {case['ns']} ns/block target {target:.0f}%"
        print(f"{where}: share {share:.2f}%, MAE {mae:.2f}")
        assert abs(share - target) <= 3.0, case
        assert mae <= 3.0, case


@pytest.mark.needs_build
def test_soft_limit_and_demand_phases_reported(sim_output: str) -> None:
    soft = re.search(r"uncontended share ([\d.]+)%.*contended share ([\d.]+)%", sim_output)
    assert soft, sim_output
    assert abs(float(soft.group(1)) - 60) <= 3 and abs(float(soft.group(2)) - 30) <= 3
    demand = re.search(r"demand-limited 5 s then saturating, target 60%: share ([\d.]+)%", sim_output)
    assert demand, sim_output
    assert abs(float(demand.group(1)) - 60) <= 3
