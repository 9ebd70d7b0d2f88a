"""bench/gpu/acceptance.py end to end on the fake driver + NVML (--fake): every check of the real-GPU
run is in its JSON and passes, except what a fake cannot do (PTX JIT, PyTorch), which is skipped
with its reason; with a library that enforces nothing in LD_PRELOAD the memory checks fail and the
script exits 1. Plus the pure rules that judge the figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu import verdict
from bench.gpu.acceptance import parse
from bench.gpu.target import module_flavour
from tests.support import REPO, built

SCRIPT = REPO / "bench" / "gpu" / "acceptance.py"
GIB = 1 << 30
DOORS = ("cuMemAlloc_v2", "cuGetProcAddress_v2", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemCreate")
TORCH = ("torch[default]", "torch[expandable_segments:True]", "torch[backend:cudaMallocAsync]")
PASSING = (
    "build",
    "memory_views",
    *(f"alloc_{d}" for d in DOORS),
    "two_processes",
    "core_unlimited",
    "core_30",
    "core_60",
    "overhead",
    "duration",
)
SKIPPED = ("ptx_jit", *TORCH)


def acceptance(tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    built("fakecuda/libcuda.so.1"), built("fakenvml/libnvidia-ml.so.1"), built("libvgpu/libvgpu-control.so")
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--fake", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return proc.returncode, json.loads(out.read_text()), proc.stderr


@pytest.mark.needs_build
def test_fake_run_passes_every_check(tmp_path: Path) -> None:
    rc, report, log = acceptance(tmp_path)
    checks = {c["name"]: c for c in report["checks"]}
    assert sorted(checks) == sorted(PASSING + SKIPPED), log
    failing = {n: checks[n]["detail"] for n in PASSING if checks[n]["status"] != "pass"}
    assert not failing, log
    for name in SKIPPED:
        assert checks[name]["status"] == "skip" and checks[name]["detail"], checks[name]
    assert rc == 0 and report["ok"] is True, log

    assert set(checks["memory_views"]["totals"].values()) == {4 * GIB}
    for door in DOORS:
        check = checks[f"alloc_{door}"]
        assert check["error"] == 2 and 0 < check["total"] <= 4 * GIB, check
        assert check["owner"].endswith("libvgpu-control.so"), check
    assert (checks["two_processes"]["first"], checks["two_processes"]["second"]) == (0, 2)
    core = report["figures"]["core"]
    assert core["core_unlimited"]["utilization"]["n"] > 0
    assert core["core_unlimited"]["grid"] == 4 * 132  # 4 blocks per SM of the H200-like profile
    assert abs(checks["core_30"]["ratio"] - 0.3) <= 0.15 and abs(checks["core_60"]["ratio"] - 0.6) <= 0.15
    assert set(report["figures"]["overhead"]["added_ns"]) == {"launch", "alloc_free"}
    env = report["environment"]
    assert env["name"] == "NVIDIA H200" and env["sms"] == 132
    assert env["libcuda"].endswith("fakecuda/libcuda.so.1")


@pytest.mark.needs_build
def test_the_gpu_path_over_a_fake_driver_found_by_soname(tmp_path: Path) -> None:
    """Without --fake the script finds libcuda.so.1 / libnvidia-ml.so.1 as an application does (here
    the fakes, through LD_LIBRARY_PATH) and GPU 0's UUID through NVML: the path a GPU machine takes,
    with its 100,000 launches (core runs shortened)."""
    fakecuda = built("fakecuda/libcuda.so.1").parent
    fakenvml = built("fakenvml/libnvidia-ml.so.1").parent
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "MANAGER_", "VGPU_", "FAKE_"))},
        "LD_LIBRARY_PATH": f"{fakecuda}:{fakenvml}",
        "FAKE_NVML_PROFILE": str(REPO / "vgpud" / "gpu" / "profiles" / "a100-40gb-x2.yaml"),
        "FAKE_GPU_STATE": str(tmp_path / "gpu.state"),
        "FAKE_GPU_NS_PER_BLOCK": "4000",
    }
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--core-seconds", "3", "--no-build", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = json.loads(out.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert proc.returncode == 0 and report["mode"] == "gpu", proc.stderr
    assert sorted(checks) == sorted(PASSING + SKIPPED), proc.stderr
    assert checks["ptx_jit"]["status"] == "pass"  # no skip on this path (the fake loads any image)
    assert report["environment"]["uuid"] == "GPU-2db41dd2-f9b4-4c97-9654-9baa4a150479"  # NVML index 0
    assert report["environment"]["libcuda"] == str(fakecuda / "libcuda.so.1")
    assert report["figures"]["core"]["core_unlimited"]["grid"] == 4 * 108
    assert report["figures"]["overhead"]["launches"] == 100_000


@pytest.mark.needs_build
def test_a_library_that_enforces_nothing_fails(tmp_path: Path) -> None:
    """The fake NVML preloaded in the library's place: no limited views, no OOM; exit 1."""
    rc, report, log = acceptance(
        tmp_path, "--library", str(built("fakenvml/libnvidia-ml.so.1")), "--phases", "memory", "--no-build"
    )
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 1 and report["ok"] is False, log
    assert checks["memory_views"]["status"] == "fail"
    for door in DOORS:
        assert checks[f"alloc_{door}"]["status"] == "fail", checks[f"alloc_{door}"]
    assert checks["two_processes"]["status"] == "fail"
    assert checks["build"]["status"] == "skip"


@pytest.mark.needs_build
def test_client_mode_registers_every_phase_process(tmp_path: Path) -> None:
    """--mode 236: the stub register client puts each phase process into pids.config; limits hold."""
    rc, report, log = acceptance(tmp_path, "--mode", "236", "--phases", "memory", "--no-build")
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 0, log
    # info, five doors, the holder and the second process: one registration each
    assert checks["registration"]["pids"] == 8, checks["registration"]
    assert checks["two_processes"]["status"] == "pass"


@pytest.mark.needs_build
def test_a_missing_library_fails(tmp_path: Path) -> None:
    rc, report, log = acceptance(tmp_path, "--library", str(tmp_path / "nope.so"), "--no-build")
    assert rc == 1, log
    assert [c["name"] for c in report["checks"] if c["status"] == "fail"] == ["library"]


def test_unknown_phase_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--fake", "--phases", "memory,burn", "--out", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "burn" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def _run(rate: float, mean: float) -> dict:
    return {"rate": rate, "launches": int(rate), "utilization": {"mean": mean, "p95": mean, "n": 10}}


def test_core_rule_flags_a_miss_beyond_the_tolerance() -> None:
    unlimited = _run(1000, 99)
    assert verdict.core_limited(30, _run(440, 31), unlimited)["status"] == "pass"
    assert verdict.core_limited(30, _run(460, 31), unlimited)["status"] == "fail"  # ratio 0.46
    assert verdict.core_limited(60, _run(600, 44), unlimited)["status"] == "fail"  # utilization 0.44
    assert verdict.core_unlimited(_run(1000, 79))["status"] == "fail"


def test_door_rule() -> None:
    ok = {"door": "cuMemAlloc_v2", "owner": "/x/libvgpu-control.so", "error": 2, "count": 7, "total": 7 << 29}
    assert verdict.door(ok, 4 * GIB)["status"] == "pass"
    assert verdict.door({**ok, "error": 0}, 4 * GIB)["status"] == "fail"
    assert verdict.door({**ok, "total": 9 << 29}, 4 * GIB)["status"] == "fail"
    assert verdict.door({**ok, "total": 1 << 29}, 4 * GIB)["status"] == "fail"  # far below the limit
    assert verdict.door({**ok, "owner": "/usr/lib/libcuda.so.1"}, 4 * GIB)["status"] == "fail"


def test_torch_results_are_read_and_judged() -> None:
    """A PyTorch run that stopped with OutOfMemoryError is a result, not a failed phase."""
    line = json.dumps(
        {
            "mem_get_info": {"free": 3 * GIB, "total": 4 * GIB},
            "stopped_by": "OutOfMemoryError",
            "count": 13,
            "total": 13 << 28,
            "reserved": 13 << 28,
            "torch": "2.5.1",
        }
    )
    result = parse(0, "warning from torch\n" + line + "\n", "", ["torch"])
    assert verdict.torch_run("", result, 4 * GIB)["status"] == "pass"
    assert verdict.torch_run("", {**result, "stopped_by": None}, 4 * GIB)["status"] == "fail"
    wide = {**result, "mem_get_info": {"free": 0, "total": 140 * GIB}}
    assert verdict.torch_run("", wide, 4 * GIB)["status"] == "fail"


def test_a_failed_phase_keeps_its_reason() -> None:
    crashed = parse(1, '{"exception": "CudaError: cuInit returned 3"}\n', "trace", ["info", "GPU-x"])
    assert crashed == {"phase_error": "info GPU-x: CudaError: cuInit returned 3; stderr: trace"}
    assert "exit -11" in parse(-11, "", "Segmentation fault", ["spin"])["phase_error"]
    assert "phase_error" in parse(0, "not json\n", "", ["once"])


def test_summary_mean_and_p95() -> None:
    got = verdict.summary([float(v) for v in range(1, 101)])
    assert got == {"mean": 50.5, "p95": 95.0, "n": 100}
    assert verdict.summary([]) == {"mean": 0.0, "p95": 0.0, "n": 0}


@pytest.mark.parametrize(
    ("version", "license_", "flavour"),
    [
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build", "", "open"),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20", "NVIDIA\n", "proprietary"),
        ("", "Dual MIT/GPL\n", "open"),
        ("", "", "unknown"),
    ],
)
def test_module_flavour(version: str, license_: str, flavour: str) -> None:
    assert module_flavour(version, license_) == flavour
