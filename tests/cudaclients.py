"""NVIDIA's Python driver-API clients (cuda-bindings, numba-cuda) as hack/install-cuda-clients.sh
installs them, in a venv of their own, and runs of their probe scripts (tests/conformance/cudaclients)
in a simulated container: the fake driver and NVML over a GPU state of its own, with or without
libvgpu-control.so preloaded, as the library's own tests run memprobe (tests/unit/libvgpu)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.kubeapi import cache_env
from tests.support import REPO, built, require
from tests.unit.libvgpu.cbuild import fake_env, library_dirs
from tests.unit.libvgpu.conftest import PROFILE, UUIDS, parse

CLIENTS_HINT = "run hack/install-cuda-clients.sh (make cuda-clients; make test does)"
PROBES = Path(__file__).parent / "conformance" / "cudaclients"
TIMEOUT_S = 120

#: samples argv[1] x nvmlDeviceGetUtilizationRates (the last second) every 100 ms, summed over the
#: argv[2] GPUs (one is busy), one per line: the fakes' own ctypes NVML client, no library
SAMPLER = """
import os, sys, time
from tests.unit.fakes.gpu import Nvml
nvml = Nvml(os.environ["FAKE_NVML_LIB"])
for _ in range(int(sys.argv[1])):
    time.sleep(0.1)
    print(sum(nvml.utilization(i) for i in range(int(sys.argv[2]))), flush=True)
"""


def clients_python() -> Path:
    """The cuda-clients venv's python; skips locally, fails under CI, when it is not installed."""
    path = cache_env("cuda-clients.env").get("CUDA_CLIENTS_PYTHON", "")
    require(
        bool(path) and os.access(path, os.X_OK),
        "the cuda-clients venv (NVIDIA's cuda-bindings and numba-cuda)",
        CLIENTS_HINT,
    )
    return Path(path)


@dataclass(frozen=True)
class ClientContainer:
    """One simulated container: a fake GPU state and the library's directories under `root`."""

    root: Path
    python: Path

    def environ(self, preload: bool, **extra: str) -> dict[str, str]:
        """The probe's env: the fakes, the library's directories, the library when `preload`."""
        cuda = built("fakecuda/libcuda.so.1").parent
        nvml = built("fakenvml/libnvidia-ml.so.1").parent
        env = fake_env(
            PROFILE,
            self.root / "gpu.state",
            library_path=f"{cuda}:{nvml}",
            **library_dirs(self.root),
            VGPU_PROC="/proc",
            MANAGER_VISIBLE_DEVICES=",".join(UUIDS),
            **extra,
        )
        if preload:
            env["LD_PRELOAD"] = str(built("libvgpu/libvgpu-control.so"))
        return env

    def run(self, probe: str, *args: str, preload: bool, **extra: str) -> dict[str, str]:
        """Run probes/`probe` to completion, which must succeed; its `key value...` lines."""
        done = subprocess.run(
            [str(self.python), str(PROBES / probe), *args],
            env=self.environ(preload, **extra),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return parse(done.stdout)

    def start(self, probe: str, *args: str, preload: bool, **extra: str) -> subprocess.Popen[str]:
        """Start probes/`probe`, its output piped, for a test that reads it while it runs."""
        return subprocess.Popen(
            [str(self.python), str(PROBES / probe), *args],
            env=self.environ(preload, **extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def sample_utilization(self, count: int) -> subprocess.Popen[str]:
        """Start SAMPLER on this container's GPU state (the test's Python, no library)."""
        env = fake_env(
            PROFILE, self.root / "gpu.state", FAKE_NVML_LIB=str(built("fakenvml/libnvidia-ml.so.1"))
        )
        return subprocess.Popen(
            [sys.executable, "-c", SAMPLER, str(count), str(len(UUIDS))],
            env={**env, "PYTHONPATH": str(REPO)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
