"""The core limit closed-loop with a soft limit and two containers, and big synchronous kernels after
idle (the reference's "GAP path"), in real processes on the fake driver and NVML.

Soft limit: container A (hard 30, soft 70) and container B (hard 30) on one fake GPU, each in client
mode with a pids.config of its own, so each counts only its own process and the other is external.
A runs alone, then B too, then A alone again; a probe reads each PID's SM share from
nvmlDeviceGetProcessUtilization(dev, now - 1 s) every 100 ms, the signal the library's controller
and a user's monitoring see.

GAP path: a program alternating one big kernel + cuStreamSynchronize with 250 ms of sleep, so each
launch comes after more than 200 ms of idle, at CUDA_CORE_LIMIT_0=30; the probe reads the device's
nvmlDeviceGetUtilizationRates every 100 ms. The reference times such launches with events and sleeps
gpu_ms x (100 / limit - 1) after them; our bucket keeps the debt of a big charge, so the next launch
waits for it to be repaid, and the controller learns the GPU's rate from the tokens that have run
(a charge drains at the learned full rate), so kernels as long as NVML's window are held too. The
share held is measured over whole periods, from the launch times the program prints.

All scenarios run at once from one module fixture (their kernels are simulated time on GPUs of their
own, so they do not compete for the CPU); the figures are printed."""

from __future__ import annotations

import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import built
from tests.unit.libvgpu.cbuild import (
    CUDA_DECLS,
    NVML_PROBE,
    compile_c,
    compile_on_fake_cuda,
    fake_env,
    gpu_profile,
    library_dirs,
)
from tests.unit.libvgpu.conftest import client_mode

pytestmark = pytest.mark.needs_build

SMS = 132
UUID = "GPU-0c0c0c0c-1111-4222-8333-444444444444"
HARD, SOFT, B_HARD = 30, 70, 30
#: the timeline, seconds from the start: A alone, A and B, A alone again
PHASES = ((0.0, 4.5), (4.5, 8.5), (8.5, 13.5))
#: seconds skipped at the start of each phase before its mean. Phase 1: 10 quiet cycles (1 s) before
#: the soft limit applies, the rise, then the probe's one-second window. Phase 2: B's first launches
#: reach A's watcher within a cycle; the probe's window lags 1 s. Phase 3: B's busy time stays in A's
#: one-second sample for 1 s, then 10 quiet cycles, the rise, then the probe's window.
SKIP = (2.5, 1.5, 3.0)
#: points a phase mean may be off: repeated runs stayed within 0.8 (the figures are printed); the
#: failures this catches are 40 points off (the soft limit ignored, or never given up)
SOFT_TOLERANCE = 3.0

GAP_SLEEP_MS = 250
GAP_KERNELS_MS = (300, 800, 1000)
GAP_NS_PER_BLOCK = 1000
GAP_WARMUP_S = 1.5
GAP_SECONDS = 12.0
#: points the GAP runs' share may be off: repeated runs stayed within 0.4 of 30 (the figures are
#: printed); before the controller learned from the tokens that had run, 800 ms kernels got 43-45 %
GAP_TOLERANCE = 3.0

LAUNCHER = (
    r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
"""
    + CUDA_DECLS
    + r"""
CUresult cuStreamSynchronize(CUstream);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void pause_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* launcher DELAY SECONDS GRID BURST SLEEP_MS: after DELAY seconds, for SECONDS, launch BURST kernels of
 * GRID blocks, synchronize, sleep SLEEP_MS; prints the launches and, with SLEEP_MS, the seconds from
 * its start at which each burst's first launch returned (when its kernel started on the idle GPU). */
int main(int argc, char **argv) {
    if (argc != 6) return 2;
    double delay = atof(argv[1]), seconds = atof(argv[2]), sleep_ms = atof(argv[5]);
    unsigned grid = (unsigned)atoi(argv[3]);
    int burst = atoi(argv[4]);
    CUfunction f;
    if (load_kernel("spin", &f)) return 1;
    pause_s(delay);
    long launches = 0;
    int n = 0;
    static double starts[4096];
    double t0 = now();
    for (double end = t0 + seconds; now() < end;) {
        for (int i = 0; i < burst; i++, launches++) {
            if (cuLaunchKernel(f, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL)) return 1;
            if (i == 0 && n < 4096) starts[n++] = now() - t0;
        }
        if (cuStreamSynchronize(NULL)) return 1;
        if (sleep_ms > 0) pause_s(sleep_ms / 1000);
    }
    printf("launches %ld\n", launches);
    if (sleep_ms > 0) {
        printf("starts");
        for (int i = 0; i < n; i++) printf(" %.4f", starts[i]);
        printf("\n");
    }
    return 0;
}
"""
)


@dataclass(frozen=True)
class Samples:
    """The probe's lines: per 100 ms, the device's utilisation and each PID's SM share."""

    device: list[int]
    procs: list[dict[int, int]]

    def device_mean(self, start: float, end: float) -> float:
        return statistics.fmean(self.device[_index(start) : _index(end)])

    def proc_mean(self, pid: int, start: float, end: float) -> float:
        return statistics.fmean(p.get(pid, 0) for p in self.procs[_index(start) : _index(end)])


def _index(seconds: float) -> int:
    """The sample that covers the second up to `seconds` (sample i is taken at (i + 1) x 100 ms)."""
    return round(seconds * 10) - 1


def _parse(text: str) -> Samples:
    device, procs = [], []
    for line in text.splitlines():
        first, *rest = line.split()
        device.append(int(first))
        procs.append({int(p): int(s) for p, s in (item.split(":") for item in rest)})
    return Samples(device, procs)


@dataclass(frozen=True)
class Results:
    soft: Samples
    a_pid: int
    b_pid: int
    gap: dict[tuple[int, int | None], Samples]
    #: the GAP program's kernel start times, seconds from its start
    starts: dict[tuple[int, int | None], list[float]]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Results:
    out = tmp_path_factory.mktemp("coresoft")
    fakenvml = built("fakenvml/libnvidia-ml.so.1").parent
    launcher = compile_on_fake_cuda(out / "launcher", LAUNCHER)
    probe = compile_c(out / "probe", NVML_PROBE, f"-L{fakenvml}", "-l:libnvidia-ml.so.1")
    lib = str(built("libvgpu/libvgpu-control.so"))

    def gpu(name: str) -> tuple[Path, Path]:
        root = out / name
        root.mkdir()
        profile = root / "profile.yaml"
        profile.write_text(gpu_profile(UUID, memory=25769803776))
        return profile, root / "gpu.state"

    def container(name: str, profile: Path, state: Path, **env: str) -> dict[str, str]:
        root = out / name
        root.mkdir()
        return fake_env(
            profile,
            state,
            LD_PRELOAD=lib,
            MANAGER_VISIBLE_DEVICES=UUID,
            VGPU_PROC="/proc",
            **library_dirs(root),
            **client_mode(root),
            **env,
        )

    def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs: list[subprocess.Popen[str]] = []
    gap_procs: dict[tuple[int, int | None], subprocess.Popen[str]] = {}
    probes: dict[str, subprocess.Popen[str]] = {}
    total = PHASES[-1][1]
    profile, state = gpu("soft")
    a_env = container("a", profile, state, CUDA_CORE_LIMIT_0=str(HARD), CUDA_CORE_SOFT_LIMIT_0=str(SOFT))
    b_env = container("b", profile, state, CUDA_CORE_LIMIT_0=str(B_HARD))
    grid, burst = str(4 * SMS), "16"
    a = start([str(launcher), "0", str(total), grid, burst, "0"], a_env)
    b_start, b_end = PHASES[1]
    b = start([str(launcher), str(b_start), str(b_end - b_start), grid, burst, "0"], b_env)
    procs += [a, b]
    probes["soft"] = start([str(probe), str(int(total * 10))], fake_env(profile, state))
    for kernel_ms in GAP_KERNELS_MS:
        for limit in (30, None):
            name = f"gap-{kernel_ms}-{limit}"
            profile, state = gpu(name)
            env = {"FAKE_GPU_NS_PER_BLOCK": str(GAP_NS_PER_BLOCK)}
            if limit is not None:
                env["CUDA_CORE_LIMIT_0"] = str(limit)
            grid = str(kernel_ms * 1_000_000 // GAP_NS_PER_BLOCK)
            argv = [str(launcher), "0", str(GAP_SECONDS), grid, "1", str(GAP_SLEEP_MS)]
            gap_procs[(kernel_ms, limit)] = start(argv, container(name + "-c", profile, state, **env))
            probes[name] = start([str(probe), str(int(GAP_SECONDS * 10))], fake_env(profile, state))
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    starts = {}
    for key, proc in gap_procs.items():
        text, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        starts[key] = [float(t) for t in text.split("starts", 1)[1].split()]
    samples = {}
    for name, proc in probes.items():
        text, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        samples[name] = _parse(text)
    return Results(
        soft=samples["soft"],
        a_pid=a.pid,
        b_pid=b.pid,
        gap={(k, lim): samples[f"gap-{k}-{lim}"] for k in GAP_KERNELS_MS for lim in (30, None)},
        starts=starts,
    )


def test_soft_limit_gives_way_to_another_container(results: Results) -> None:
    """A alone bursts to its soft limit, gives way to its hard limit while B runs (B at its own hard
    limit), and bursts again once B has stopped."""
    soft = results.soft
    expected = ((SOFT, None), (HARD, B_HARD), (SOFT, None))
    failures = []
    for n, ((start, end), skip, (a_want, b_want)) in enumerate(zip(PHASES, SKIP, expected, strict=True), 1):
        a = soft.proc_mean(results.a_pid, start + skip, end)
        b = soft.proc_mean(results.b_pid, start + skip, end)
        line = f"phase {n} ({start + skip:.1f}-{end:.1f} s): A {a:.2f}% (want {a_want}), B {b:.2f}%"
        print(line + (f" (want {b_want})" if b_want else ""))
        if abs(a - a_want) > SOFT_TOLERANCE or (b_want is not None and abs(b - b_want) > SOFT_TOLERANCE):
            failures.append(line)
    assert not failures, failures


def _gap_means(results: Results, kernel_ms: int) -> tuple[float, float, float]:
    """The device's mean utilisation with 30 and without a limit (NVML, after the warm-up), and the
    share held at 30 over whole periods: kernel time over the time from the first start after the
    warm-up to the last start. The NVML mean depends on where its window cuts the periods (one is
    ~3.3 s for 1000 ms kernels) and holds the tail of the start-up, where the second kernel follows
    the first after only the idle (the first debt is repaid at the rate learned in the first
    second, from a kernel not yet run): 33.1-33.2 % for 1000 ms kernels, whose whole periods give
    30.3 %."""
    limited, free = (
        results.gap[(kernel_ms, lim)].device_mean(GAP_WARMUP_S, GAP_SECONDS) for lim in (30, None)
    )
    starts = [t for t in results.starts[(kernel_ms, 30)] if t >= GAP_WARMUP_S]
    assert len(starts) >= 2, results.starts[(kernel_ms, 30)]
    held = 100 * (len(starts) - 1) * kernel_ms / 1000 / (starts[-1] - starts[0])
    print(
        f"{kernel_ms} ms kernels, {GAP_SLEEP_MS} ms idle: limit 30 -> {held:.2f}% over "
        f"{len(starts) - 1} periods (NVML mean {limited:.2f}%), unlimited {free:.2f}%"
    )
    return held, limited, free


@pytest.mark.parametrize("kernel_ms", GAP_KERNELS_MS)
def test_big_kernels_after_idle_run_free_without_a_limit(results: Results, kernel_ms: int) -> None:
    """The control: unlimited, the device is busy kernel / (kernel + idle)."""
    _, _, free = _gap_means(results, kernel_ms)
    assert abs(free - 100 * kernel_ms / (kernel_ms + GAP_SLEEP_MS)) <= GAP_TOLERANCE


@pytest.mark.parametrize("kernel_ms", GAP_KERNELS_MS)
def test_big_kernels_after_idle_hold_the_limit(results: Results, kernel_ms: int) -> None:
    """At 30 %, the debt of each big charge holds the next launch until it is repaid at the rate
    learned from the tokens that have run, kernels as long as NVML's window included."""
    held, _, _ = _gap_means(results, kernel_ms)
    assert abs(held - 30) <= GAP_TOLERANCE
