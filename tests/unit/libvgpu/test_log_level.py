"""LOGGER_LEVEL (reference §4: 0..5, vgpu-manager's fatal, error, warning, info, verbose, detail;
`debug` for verbose), in real processes under the library on the fake driver: the lines of each level
appear from that level on and not below it, the default is warning, and a value that is no level is
named in one warning line and changes nothing else."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import built
from tests.unit.libvgpu.cbuild import CUDA_DECLS, compile_on_fake_cuda, fake_env, gpu_profile, library_dirs
from tests.unit.libvgpu.conftest import MIB, UUIDS, Container


@pytest.fixture(autouse=True)
def mounted_dirs(tmp_path: Path) -> None:
    """The partition directories exist, as vgpud mounts them (else the loader warns)."""
    for path in library_dirs(tmp_path).values():
        Path(path).mkdir()


def level_lines(stderr: str) -> dict[str, list[str]]:
    """The library's lines by the level word after "vgpu: "."""
    out: dict[str, list[str]] = {}
    for line in stderr.splitlines():
        if line.startswith("vgpu: "):
            word = line.split(" ", 2)[1].rstrip(":").lower()
            out.setdefault(word, []).append(line)
    return out


def fill(container: Container, **env: str) -> dict[str, list[str]]:
    """Four 256 MiB allocations fit a 1 GiB limit, the fifth is refused."""
    out = container.attempt("fill", "direct", str(256 * MIB), CUDA_MEM_LIMIT_0="1g", **env)
    assert out.returncode == 0 and out.lines["count"] == "4", out
    return level_lines(out.stderr)


@pytest.mark.parametrize("value", ["", "2", "warning", "WARN"])
def test_default_and_warning_show_no_info(container: Container, value: str) -> None:
    env = {"LOGGER_LEVEL": value} if value else {}
    assert fill(container, **env) == {}


@pytest.mark.parametrize("value", ["3", "info", "Info"])
def test_info_shows_the_limits_and_each_refusal(container: Container, value: str) -> None:
    lines = fill(container, LOGGER_LEVEL=value)
    assert set(lines) == {"info"}
    assert lines["info"][0] == (
        f"vgpu: info: device 0 {UUIDS[0]}: memory limit 1073741824 bytes, 1073741824 of them device memory "
        "(compatibility mode 0)"
    )
    refusals = [line for line in lines["info"] if ": refused " in line]
    assert len(refusals) == 1
    assert refusals[0].startswith(
        "vgpu: info: device 0: refused 268435456 bytes: the container uses 1073741824 ("
    )
    assert refusals[0].endswith("of 1073741824")


@pytest.mark.parametrize("value", ["4", "verbose", "debug"])
def test_verbose_shows_each_admitted_allocation(container: Container, value: str) -> None:
    lines = fill(container, LOGGER_LEVEL=value)
    assert set(lines) == {"info", "verbose"}
    admitted = [line.split(": the container")[0] for line in lines["verbose"]]
    assert admitted == ["vgpu: verbose: device 0: admitted 268435456 bytes"] * 4


@pytest.mark.parametrize(("value", "shown"), [("1", False), ("error", False), ("0", False), ("", True)])
def test_warnings_hidden_below_warning(container: Container, value: str, shown: bool) -> None:
    """A refused device (the container has GPU 1 only, the probe opens GPU 0) is a warning."""
    env = {"LOGGER_LEVEL": value} if value else {}
    out = container.attempt("info", MANAGER_VISIBLE_DEVICES=f",{UUIDS[1]}", **env)
    assert out.refused, out
    expected = [f"vgpu: warning: refused device {UUIDS[0]}: not one of this container's devices"]
    assert level_lines(out.stderr).get("warning", []) == (expected if shown else [])


def test_a_value_that_is_no_level_is_named_once(container: Container) -> None:
    lines = fill(container, LOGGER_LEVEL="loud")
    assert lines == {
        "warning": [
            "vgpu: warning: LOGGER_LEVEL=loud is not a level (0..5, or fatal, error, warning, info, verbose, "
            "detail); using warning"
        ]
    }


LAUNCHER = (
    r"""
#include <stdio.h>
#include <time.h>
"""
    + CUDA_DECLS
    + r"""
CUresult cuStreamSynchronize(CUstream);
int main(void) {
    CUfunction f;
    if (load_kernel("k", &f)) return 1;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do { /* 0.4 s of launches: a few watcher cycles */
        for (int i = 0; i < 8; i++)
            if (cuLaunchKernel(f, 64, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL)) return 2;
        if (cuStreamSynchronize(NULL)) return 3;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 400000000L);
    return 0;
}
"""
)


def run_launcher(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """LAUNCHER under the library with CUDA_CORE_LIMIT_0=50; `extra` last."""
    program = compile_on_fake_cuda(tmp_path / "launch", LAUNCHER)
    (tmp_path / "profile.yaml").write_text(gpu_profile(UUIDS[0]))
    env = fake_env(
        tmp_path / "profile.yaml",
        tmp_path / "gpu.state",
        LD_PRELOAD=str(built("libvgpu/libvgpu-control.so")),
        MANAGER_VISIBLE_DEVICES=UUIDS[0],
        MANAGER_COMPATIBILITY_MODE="0",
        CUDA_CORE_LIMIT_0="50",
        **library_dirs(tmp_path),
        **extra,
    )
    result = subprocess.run([str(program)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize("value", ["info", "detail", "5"])
def test_core_limit_lines(tmp_path: Path, value: str) -> None:
    """info: the device's core limit once; detail: each watcher cycle's utilisation and refill."""
    result = run_launcher(tmp_path, LOGGER_LEVEL=value)
    lines = level_lines(result.stderr)
    core = [line for line in lines.get("info", []) if "core limit" in line]
    assert len(core) == 1 and core[0].startswith("vgpu: info: device 0: core limit 50%, "), core
    cycles = lines.get("detail", [])
    if value == "info":
        assert cycles == []
    else:
        assert len(cycles) >= 2, result.stderr
        assert all(line.startswith("vgpu: detail: device 0: core utilisation ") for line in cycles), cycles


def test_the_reference_controller_settings_are_named_unused(tmp_path: Path) -> None:
    """CUDA_SM_CONTROLLER and the aimd / delta tuning variables of vgpu-manager change nothing here:
    each one set is named in a warning (an empty one is unset)."""
    result = run_launcher(
        tmp_path, CUDA_SM_CONTROLLER="aimd", CUDA_SM_AIMD_BETA="3", CUDA_SM_USAGE_THRESHOLD=""
    )
    unused = ": this library has one core limit controller of its own"
    assert level_lines(result.stderr) == {
        "warning": [
            f"vgpu: warning: CUDA_SM_CONTROLLER=aimd is not used{unused}",
            f"vgpu: warning: CUDA_SM_AIMD_BETA=3 is not used{unused}",
        ]
    }


@pytest.mark.parametrize("legacy", [True, False])
def test_the_core_limit_samples_through_either_nvml_call(tmp_path: Path, legacy: bool) -> None:
    """A driver whose nvmlDeviceGetProcessUtilization is not supported (the fake's knob) still feeds the
    controller, through nvmlDeviceGetProcessesUtilizationInfo: its cycles (LOGGER_LEVEL detail) see the
    launcher's utilisation, not -1 (no sample)."""
    knob = {} if legacy else {"FAKE_NVML_NO_PROCESS_UTILIZATION": "1"}
    result = run_launcher(tmp_path, LOGGER_LEVEL="detail", **knob)
    utilisations = [
        float(line.split("core utilisation ")[1].split("%")[0])
        for line in level_lines(result.stderr)["detail"]
    ]
    assert utilisations and all(u >= 0 for u in utilisations), result.stderr
    assert max(utilisations) > 5, result.stderr
