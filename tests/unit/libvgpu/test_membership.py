"""Which processes on the GPU are the container's, per MANAGER_COMPATIBILITY_MODE (reference §2),
in real processes: an outsider holds 512 MiB of the fake GPU, the container's limit is 1 GiB, so
a 128 MiB fill gets 8 chunks when the outsider is excluded and 4 when it is counted. The host
/proc view (VGPU_HOST_PROC) is a temp dir written by the test: a wrapper shell records the
container process's cgroup line under its PID and then execs the probe (same PID)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.unit.libvgpu.conftest import MIB, Container, client_mode, read_result


def _fill_in_cgroup(container: Container, host_proc: Path, line: str, **env: str) -> str:
    wrapper = container.root / "enter.sh"
    wrapper.write_text(
        f'#!/bin/sh\nmkdir -p {host_proc}/$$ && printf "{line}\\n" > {host_proc}/$$/cgroup\nexec "$@"\n'
    )
    wrapper.chmod(0o755)
    probe = container.probe
    container.probe = wrapper
    try:
        return container.run(str(probe), "fill", "direct", str(128 * MIB), **env)["count"]
    finally:
        container.probe = probe


@pytest.mark.parametrize("mode", ["2", "102"])
@pytest.mark.parametrize(("outsider_line", "expected"), [("0::/../other", "8"), ("0::/", "4")])
def test_cgroup_v2_same_cgroup_reads_root(
    container: Container, mode: str, outsider_line: str, expected: str
) -> None:
    """NVML's host PIDs are looked up in the host's /proc, with the open kernel bit too (102 is what
    vgpud injects on a v2 node): the cgroup rule comes first."""
    procs = container.root / "procs"
    outsider = container.start("take", str(512 * MIB), preload=False)
    try:
        assert read_result(outsider, ("rc",))["rc"] == "0"
        (procs / str(outsider.pid)).mkdir(parents=True)
        (procs / str(outsider.pid) / "cgroup").write_text(outsider_line + "\n")
        env = {"MANAGER_COMPATIBILITY_MODE": mode, "VGPU_HOST_PROC": str(procs), "CUDA_MEM_LIMIT_0": "1g"}
        assert _fill_in_cgroup(container, procs, "0::/", **env) == expected
    finally:
        outsider.communicate(timeout=30)


@pytest.mark.parametrize("mode", ["101", "102"])
@pytest.mark.parametrize(("outsider_preloaded", "expected"), [(False, "8"), (True, "4")])
def test_cgroup_mode_with_open_kernel_bit_falls_back_to_namespaces(
    container: Container, tmp_path: Path, mode: str, outsider_preloaded: bool, expected: str
) -> None:
    """No PID is found by cgroup in the host's /proc (here: empty), as when NVML gives our
    namespace's PIDs (open kernel module): the open kernel rule counts the processes in our mount
    and cgroup namespaces that map the driver. A preloaded outsider maps the fake libnvidia-ml (the
    library loads NVML), an unpreloaded one does not."""
    host_proc = tmp_path / "host_proc"
    host_proc.mkdir()
    outsider = container.start("take", str(512 * MIB), preload=outsider_preloaded)
    try:
        assert read_result(outsider, ("rc",))["rc"] == "0"
        maps = Path(f"/proc/{outsider.pid}/maps").read_text()
        assert ("nvidia" in maps) == outsider_preloaded
        env = {"MANAGER_COMPATIBILITY_MODE": mode, "VGPU_HOST_PROC": str(host_proc), "CUDA_MEM_LIMIT_0": "1g"}
        assert container.run("fill", "direct", str(128 * MIB), **env)["count"] == expected
    finally:
        outsider.communicate(timeout=30)


@pytest.mark.parametrize("mode", ["1", "101"])
@pytest.mark.parametrize(("outsider_path", "expected"), [("/pod/other", "8"), ("/pod/c1", "4")])
def test_cgroup_v1_memory_path(container: Container, mode: str, outsider_path: str, expected: str) -> None:
    host_proc = container.root / "host_proc"
    proc = container.root / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("5:cpu,cpuacct:/pod/c1\n4:memory:/pod/c1\n")
    outsider = container.start("take", str(512 * MIB), preload=False)
    try:
        assert read_result(outsider, ("rc",))["rc"] == "0"
        (host_proc / str(outsider.pid)).mkdir(parents=True)
        (host_proc / str(outsider.pid) / "cgroup").write_text(f"4:memory:{outsider_path}\n")
        env = {
            "MANAGER_COMPATIBILITY_MODE": mode,
            "VGPU_HOST_PROC": str(host_proc),
            "VGPU_PROC": str(proc),
            "CUDA_MEM_LIMIT_0": "1g",
        }
        assert _fill_in_cgroup(container, host_proc, "4:memory:/pod/c1", **env) == expected
    finally:
        outsider.communicate(timeout=30)


def test_open_kernel_module_mode_needs_the_driver_mapped(container: Container) -> None:
    """Mode 100: NVML reports our namespace's PIDs; a process that maps no NVIDIA library (the
    outsider links only the fake libcuda) is not one of the container's GPU processes."""
    outsider = container.start("take", str(512 * MIB), preload=False)
    try:
        assert read_result(outsider, ("rc",))["rc"] == "0"
        maps = Path(f"/proc/{outsider.pid}/maps").read_text()
        assert "nvidia" not in maps
        got = container.run(
            "fill", "direct", str(128 * MIB), MANAGER_COMPATIBILITY_MODE="100", CUDA_MEM_LIMIT_0="1g"
        )
    finally:
        outsider.communicate(timeout=30)
    assert got["count"] == "8"


def _rewrite_in_place(path: Path, text: str) -> None:
    """As the registry writes pids.config: at offset 0 over the old text, then ftruncate."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, text.encode(), 0)
        os.ftruncate(fd, len(text))
    finally:
        os.close(fd)


def _step(probe: subprocess.Popen[str]) -> str:
    """One more allocation by a `steps` memprobe: its CUresult."""
    assert probe.stdin is not None
    probe.stdin.write("go\n")
    probe.stdin.flush()
    return read_result(probe, ("rc",))["rc"]


@pytest.mark.parametrize("settle", [0.0, 0.3])
def test_client_mode_sees_pids_config_rewritten_between_decisions(
    container: Container, tmp_path: Path, settle: float
) -> None:
    """The library reuses the pids.config text it read while a stat shows the file unchanged (and
    its timestamps had settled, 100 ms, when read): a same-size rewrite in place between two
    allocations of one process must still count the newly listed outsider at the next decision.
    settle=0.3 ages the file past that window before the reads, so the second allocation runs on
    the reused text; 0.0 rewrites right after a read, where timestamps may not have moved."""
    outsider = container.start("take", str(512 * MIB), preload=False)
    probe = None
    try:
        assert read_result(outsider, ("rc",))["rc"] == "0"
        env = client_mode(tmp_path)
        pids = Path(env["VGPU_PIDS_CONFIG"])
        probe = container.start("steps", str(256 * MIB), **env)
        read_result(probe, ("ready",))
        placeholder = "9" * len(str(outsider.pid))  # the outsider's PID's size: the rewrite keeps it
        _rewrite_in_place(pids, f"{probe.pid}\n{placeholder}\n")
        time.sleep(settle)
        assert _step(probe) == "0"  # 256 MiB of 1 GiB: the outsider is not listed
        assert _step(probe) == "0"  # 512 MiB
        size = pids.stat().st_size
        _rewrite_in_place(pids, f"{probe.pid}\n{outsider.pid}\n")
        assert pids.stat().st_size == size
        assert _step(probe) == "2"  # 512 MiB + the outsider's 512 MiB + 256 MiB > 1 GiB
    finally:
        if probe is not None:
            probe.communicate(timeout=30)
        outsider.communicate(timeout=30)


def test_the_first_rule_that_matched_holds_for_the_rest_of_the_list(
    container: Container, tmp_path: Path
) -> None:
    """Mode 102: the probe (first in NVML's list) is found by cgroup, so the list holds host PIDs and
    the open kernel rule is not tried for the rest: a preloaded outsider in our namespaces that maps
    the driver, but is in another cgroup, is not counted (4 steps of 256 MiB fit in 1 GiB, not 2)."""
    host_proc = tmp_path / "host_proc"
    env = {"MANAGER_COMPATIBILITY_MODE": "102", "VGPU_HOST_PROC": str(host_proc), "CUDA_MEM_LIMIT_0": "1g"}
    probe = container.start("steps", str(256 * MIB), **env)
    outsider = None
    try:
        read_result(probe, ("ready",))  # its context is the list's first entry
        outsider = container.start("take", str(512 * MIB))
        assert read_result(outsider, ("rc",))["rc"] == "0"
        assert "nvidia" in Path(f"/proc/{outsider.pid}/maps").read_text()
        for pid, line in ((probe.pid, "0::/"), (outsider.pid, "0::/../other")):
            (host_proc / str(pid)).mkdir(parents=True)
            (host_proc / str(pid) / "cgroup").write_text(line + "\n")
        assert [_step(probe) for _ in range(5)] == ["0", "0", "0", "0", "2"]
    finally:
        probe.communicate(timeout=30)
        if outsider is not None:
            outsider.communicate(timeout=30)
