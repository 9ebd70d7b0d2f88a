"""numba-cuda (0.30, on NVIDIA's cuda-bindings and cuda.core: kernels compiled by libnvvm, linked by
nvJitLink, loaded with cuLibraryLoadData and launched with cuLaunchKernelEx) over the fake driver, in
a simulated container with libvgpu-control.so preloaded, CUDA_MEM_LIMIT_0=1g and CUDA_CORE_LIMIT_0=30,
and the same program without the library.

Under the library the context's memory info is the limit, device_array runs out of memory at it
(numba's CudaAPIError, CUDA_ERROR_OUT_OF_MEMORY), and a @cuda.jit kernel launched as fast as numba
can is held to the core limit: the fake GPU's utilisation, sampled through the fake NVML by a process
of its own as tests/unit/libvgpu/test_core_loop.py does, averages to the limit after a second of
start-up. Without it the 40 GiB are there and the launches keep the GPU busy. The kernels compute
nothing (the fake runs none): what is checked is that numba's whole path loads and launches them,
and the simulated SM time they take. One probe run each (tests/conformance/cudaclients/numba_probe.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pytest

from tests.cudaclients import ClientContainer, clients_python
from tests.unit.libvgpu.conftest import MIB, PHYSICAL

LIMIT = 1024 * MIB
CORE_LIMIT = 30
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
WARMUP_S = 1.0
WINDOW_S = 3.0
#: the window's mean utilisation within this many points of the limit (the core loop test's 10 s
#: window holds 3; this one is shorter)
TOLERANCE = 4
#: 4 blocks per SM of the A100's 108, each 5 us of simulated time: about 2 ms per launch, far more than
#: numba takes to launch one, so without the library the GPU never waits for Python
GRID = 4 * 108
NS_PER_BLOCK = 5000


@dataclass(frozen=True)
class Run:
    lines: dict[str, str]
    samples: list[int]  # the device's utilisation, % every 100 ms from the first launch after JIT

    @property
    def share(self) -> float:
        return statistics.fmean(self.samples[int(WARMUP_S * 10) :])


def run(container: ClientContainer, preload: bool) -> Run:
    """The probe for WARMUP_S + WINDOW_S of launches, the sampler started once the kernel is compiled."""
    seconds = WARMUP_S + WINDOW_S
    probe = container.start(
        "numba_probe.py",
        str(seconds + 0.5),
        str(GRID),
        preload=preload,
        CUDA_MEM_LIMIT_0="1g",
        CUDA_CORE_LIMIT_0=str(CORE_LIMIT),
        FAKE_GPU_NS_PER_BLOCK=str(NS_PER_BLOCK),
    )
    assert probe.stdout is not None
    lines: dict[str, str] = {}
    while "ready" not in lines:
        line = probe.stdout.readline()
        if not line:
            _, err = probe.communicate(timeout=30)
            raise AssertionError(
                f"numba_probe.py exited {probe.returncode} before its launches: {lines}\n{err}"
            )
        key, _, value = line.rstrip("\n").partition(" ")
        lines[key] = value
    sampler = container.sample_utilization(int(seconds * 10))
    out, err = probe.communicate(timeout=60)
    assert probe.returncode == 0, err
    lines.update(line.split(" ", 1) for line in out.splitlines() if " " in line)
    samples, sampler_err = sampler.communicate(timeout=30)
    assert sampler.returncode == 0, sampler_err
    return Run(lines, [int(s) for s in samples.split()])


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run(ClientContainer(tmp_path_factory.mktemp("numba-limited"), clients_python()), preload=True)


@pytest.fixture(scope="module")
def unlimited(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The same probe and env (the limits' variables included), the library not preloaded."""
    return run(ClientContainer(tmp_path_factory.mktemp("numba-plain"), clients_python()), preload=False)


def test_numba_sees_the_limited_memory(limited: Run) -> None:
    assert limited.lines["devices"] == "2"
    assert limited.lines["info"] == f"{LIMIT} {LIMIT}"  # free, total of the current context
    assert limited.lines["fill"] == f"4 {OOM}"  # 4 device_arrays of 256 MiB, the 5th raised
    assert limited.lines["info_after"] == f"{LIMIT} {LIMIT}"  # freed, and nothing counted
    assert limited.lines["copy"] == "1"  # to_device, then copy_to_host gives the same bytes


def test_a_jit_kernel_is_held_to_the_core_limit(limited: Run, unlimited: Run) -> None:
    print(
        f"numba launches, limit {CORE_LIMIT}: share {limited.share:.1f}% ({limited.lines['launches']}); "
        f"no library: {unlimited.share:.1f}% ({unlimited.lines['launches']})"
    )
    assert abs(limited.share - CORE_LIMIT) <= TOLERANCE, limited.samples
    assert unlimited.share >= 90, unlimited.samples
    done, unlimited_done = (int(r.lines["launches"].split()[0]) for r in (limited, unlimited))
    assert done < unlimited_done / 2  # throttled launches, not merely idle time between them


def test_without_the_library_numba_sees_the_whole_gpu(unlimited: Run) -> None:
    assert unlimited.lines["info"] == f"{PHYSICAL} {PHYSICAL}"
    assert unlimited.lines["fill"] == "8 0"  # 2 GiB, past the 1 GiB the library would allow
    assert unlimited.lines["info_after"] == f"{PHYSICAL} {PHYSICAL}"
    assert unlimited.lines["copy"] == "1"
