"""Configuration sources and container membership, in real processes over the fake GPU: the
environment of PID 1 when ours lacks a variable, the visible-device variables (NVIDIA's runtime
keywords included), bad values, and client mode where only the PIDs in pids.config count."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.unit.libvgpu.conftest import MIB, PHYSICAL, UUIDS, Container, client_mode, read_result


def test_pid1_environ_is_the_fallback(container: Container, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "environ").write_bytes(b"PATH=/bin\0CUDA_MEM_LIMIT_0=512m\0OTHER=1\0")
    got = container.run("fill", "direct", str(128 * MIB), VGPU_PROC=str(proc))
    assert got["count"] == "4"
    # Our own environment wins over PID 1's.
    got = container.run("fill", "direct", str(128 * MIB), VGPU_PROC=str(proc), CUDA_MEM_LIMIT_0="256m")
    assert got["count"] == "2"


def test_per_index_visible_device(container: Container) -> None:
    env = container.env
    del env["MANAGER_VISIBLE_DEVICES"]
    env["MANAGER_VISIBLE_DEVICE_1"] = UUIDS[1]
    limits = {"CUDA_MEM_LIMIT_1": "512m", "CUDA_MEM_LIMIT_0": "256m"}
    assert container.run("fill", "direct", str(128 * MIB), CUDA_VISIBLE_DEVICES="1", **limits)["count"] == "4"
    # Host GPU 0 is not named: not the container's, refused (its limit variable alone does not
    # make it one).
    assert container.attempt("info", CUDA_VISIBLE_DEVICES="0", **limits).refused


def test_nvidia_visible_devices_is_the_last_resort(container: Container) -> None:
    del container.env["MANAGER_VISIBLE_DEVICES"]
    got = container.run(
        "fill", "direct", str(128 * MIB), NVIDIA_VISIBLE_DEVICES=UUIDS[0], CUDA_MEM_LIMIT_0="384m"
    )
    assert got["count"] == "3"


@pytest.mark.parametrize("value", ["void", "none", "all", "", " All "])
def test_nvidia_runtime_keywords_name_no_device(container: Container, value: str) -> None:
    """NVIDIA's runtime keywords are not device lists: void, none and empty give no device, and all
    never means every GPU is ours. With nothing else naming a device the library is inert: the limit
    variable limits nothing and no GPU is refused."""
    del container.env["MANAGER_VISIBLE_DEVICES"]
    for visible in ("0", "1"):
        got = container.run(
            "fill",
            "direct",
            str(8192 * MIB),
            NVIDIA_VISIBLE_DEVICES=value,
            CUDA_VISIBLE_DEVICES=visible,
            CUDA_MEM_LIMIT="1024m",
        )
        assert int(got["count"]) == PHYSICAL // (8192 * MIB), (value, visible)


def test_void_next_to_the_device_list(container: Container) -> None:
    """What vgpud injects: NVIDIA_VISIBLE_DEVICES=void and the container's device list. GPU 0 is
    limited; GPU 1, not in the list, is refused."""
    env = {"NVIDIA_VISIBLE_DEVICES": "void", "MANAGER_VISIBLE_DEVICES": UUIDS[0], "CUDA_MEM_LIMIT_0": "384m"}
    assert container.run("fill", "direct", str(128 * MIB), **env)["count"] == "3"
    assert container.attempt("fill", "direct", str(128 * MIB), CUDA_VISIBLE_DEVICES="1", **env).refused


def test_a_bad_limit_is_fatal_at_the_first_cuda_call_only(container: Container) -> None:
    env = container.environ(CUDA_MEM_LIMIT_0="12x")
    subprocess.run(["/bin/sh", "-c", "true"], env=env, check=True, timeout=30)
    proc = subprocess.run(
        [str(container.probe), "fill", "direct", str(MIB)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode != 0
    assert "vgpu: FATAL: CUDA_MEM_LIMIT_0 (or CUDA_MEM_LIMIT)=12x is not a size like 8192m" in proc.stderr


def test_client_mode_counts_only_registered_pids(container: Container, tmp_path: Path) -> None:
    outsider = container.start("take", str(512 * MIB), preload=False)
    try:
        assert read_result(outsider, ("rc",))["rc"] == "0"
        # Host mode: every process on the GPU is ours, the outsider's 512 MiB included.
        assert container.run("fill", "direct", str(128 * MIB), CUDA_MEM_LIMIT_0="1024m")["count"] == "4"
        got = container.run("fill", "direct", str(128 * MIB), **client_mode(tmp_path))
        assert got["count"] == "8"
        # The forked child registered too, and shares the limit with its parent.
        got = container.run("fork", str(256 * MIB), **client_mode(tmp_path))
        assert (got["parent_rc"], got["count"]) == ("0", "3")
    finally:
        outsider.communicate(timeout=30)
    assert len((tmp_path / "pids.config").read_text().split()) == 3  # fill, fork parent, fork child
