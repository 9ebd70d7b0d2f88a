"""Fixtures for the control library tests: the built library, the fake driver + NVML (csrc/
fakecuda, csrc/fakenvml) sharing one simulated GPU state, and the memprobe driver program."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import REPO, built
from tests.unit.libvgpu.cbuild import compile_c, fake_env, library_dirs

PROFILE = REPO / "vgpud" / "gpu" / "profiles" / "a100-40gb-x2.yaml"
UUIDS = ("GPU-2db41dd2-f9b4-4c97-9654-9baa4a150479", "GPU-bdad1e16-755f-41d4-985c-16737eb6e907")
PHYSICAL = 42949672960
MIB = 1 << 20


@dataclass
class Outcome:
    """A memprobe run that may have failed: its exit status, `key value` lines and stderr."""

    returncode: int
    lines: dict[str, str]
    stderr: str

    @property
    def refused(self) -> bool:
        """memprobe could not set up CUDA device 0 because the library refused it (exit 3,
        CUDA_ERROR_INVALID_DEVICE)."""
        return self.returncode == 3 and self.lines.get("setup_error") == "101"


@dataclass
class Container:
    """One simulated container: its env (library paths in a temp dir) over a shared fake GPU."""

    root: Path
    lib: Path
    probe: Path
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, preload: bool = True, timeout: float = 60, **extra: str) -> dict[str, str]:
        """Run memprobe to completion, which must succeed; its `key value` lines as a dict."""
        out = self.attempt(*args, preload=preload, timeout=timeout, **extra)
        assert out.returncode == 0, f"{out.lines}\n{out.stderr}"
        return out.lines

    def attempt(self, *args: str, preload: bool = True, timeout: float = 60, **extra: str) -> Outcome:
        """Run memprobe to completion, whatever its exit status."""
        proc = subprocess.run(
            [str(self.probe), *args],
            env=self.environ(preload, **extra),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Outcome(proc.returncode, parse(proc.stdout), proc.stderr)

    def start(self, *args: str, preload: bool = True, **extra: str) -> subprocess.Popen[str]:
        """Start memprobe (a HOLD command waits for its stdin to close)."""
        return subprocess.Popen(
            [str(self.probe), *args],
            env=self.environ(preload, **extra),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def environ(self, preload: bool = True, **extra: str) -> dict[str, str]:
        env = dict(self.env)
        if preload:
            env["LD_PRELOAD"] = str(self.lib)
        env.update(extra)
        return env


def parse(text: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def read_result(proc: subprocess.Popen[str], keys: tuple[str, ...] = ("total",)) -> dict[str, str]:
    """Read a holding memprobe's lines until every key is there (it then waits for EOF)."""
    assert proc.stdout is not None
    got: dict[str, str] = {}
    while not all(k in got for k in keys):
        line = proc.stdout.readline()
        assert line, f"memprobe exited early: {proc.stderr.read() if proc.stderr else ''}"
        got.update(parse(line))
    return got


@pytest.fixture(scope="session")
def fakes() -> tuple[Path, Path]:
    return built("fakecuda/libcuda.so.1"), built("fakenvml/libnvidia-ml.so.1")


def build_probe(factory: pytest.TempPathFactory, fakes: tuple[Path, Path], name: str) -> Path:
    """c/<name>.c built against the fake libcuda.so.1, as a CUDA program links the driver."""
    source = (Path(__file__).parent / "c" / f"{name}.c").read_text()
    cuda_dir = fakes[0].parent
    out = factory.mktemp(name) / name
    return compile_c(out, source, f"-L{cuda_dir}", "-l:libcuda.so.1", f"-Wl,-rpath,{cuda_dir}")


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory, fakes: tuple[Path, Path]) -> Path:
    return build_probe(tmp_path_factory, fakes, "memprobe")


@pytest.fixture
def container(tmp_path: Path, fakes: tuple[Path, Path], probe: Path) -> Container:
    lib = built("libvgpu/libvgpu-control.so")
    base = fake_env(
        PROFILE,
        tmp_path / "gpu.state",
        library_path=f"{fakes[0].parent}:{fakes[1].parent}",
        **library_dirs(tmp_path),
        VGPU_PROC="/proc",
        MANAGER_VISIBLE_DEVICES=",".join(UUIDS),
        PROBE_NVML_UUID=UUIDS[0],
    )
    return Container(root=tmp_path, lib=lib, probe=probe, env=base)


def client_mode(tmp_path: Path) -> dict[str, str]:
    """Mode 236 (client): the register client appends its parent's PID, as vgpu-register would."""
    client = tmp_path / "client.sh"
    pids = tmp_path / "pids.config"
    client.write_text(f"#!/bin/sh\necho $PPID >> {pids}\n")
    client.chmod(0o755)
    return {
        "MANAGER_COMPATIBILITY_MODE": "236",
        "VGPU_POD_UID": "uid",
        "VGPU_CONTAINER_NAME": "c",
        "VGPU_REGISTER_CLIENT": str(client),
        "VGPU_PIDS_CONFIG": str(pids),
        "CUDA_MEM_LIMIT_0": "1024m",
    }
