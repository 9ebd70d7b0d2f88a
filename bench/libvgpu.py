"""libvgpu-control.so overhead: ns per driver call with the library (LD_PRELOAD, limits set) and
without it, on the fake libcuda (csrc/fakecuda) and fake NVML.

A C program, compiled here against the fake driver, times in rounds:
  - launch: cuLaunchKernel of a one-block grid on the null stream, with CUDA_CORE_LIMIT_0=50 and the
    bucket never empty (a fake block costs no simulated time, so the run stays under the limit): the
    hooked cost is the device lookup and one atomic charge;
  - alloc/free: cuMemAlloc_v2(1 MiB) + cuMemFree_v2 with CUDA_MEM_LIMIT_0=4096m: the hooked cost is the
    device lock, the NVML usage read and the bookkeeping around the driver's allocation. The NVML
    usage read is two process-list calls into the fake NVML (about 0.75 us each here, its lock and
    slot scan): they count in "added" although they are the simulated driver's cost, not the
    library's; a real NVML call costs more (the reference reports 1-3 ms for vgpu-manager's
    allocation critical section with its two enumerations).
Each round's ns per call is its wall time over its calls; the unhooked and hooked processes alternate
(--pairs), so a change in the machine's load hits both alike; p50/p99 over all rounds of each side,
the ratio hooked/unhooked and the ns the library adds (p50 - p50). Goals: launch adds <= 100 ns,
alloc/free <= 5 us (printed as met or not; the machine's load moves them, so they do not decide the
exit status).

Correctness checks (exit 1 when one fails): in the hooked run cuLaunchKernel and cuMemAlloc_v2 resolve
into libvgpu-control.so and an allocation past the 4 GiB limit fails with CUDA_ERROR_OUT_OF_MEMORY
(2); in the unhooked run they resolve into the fake libcuda and the same allocation succeeds.

    .venv/bin/python bench/libvgpu.py [--pairs P] [--rounds R] [--launches N] [--allocs N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.stats import percentile
from tests.support import BUILD
from tests.unit.libvgpu.cbuild import CUDA_DECLS, compile_on_fake_cuda, fake_env, gpu_profile, library_dirs

UUID = "GPU-0b0b0b0b-1111-4222-8333-444444444444"
PROFILE = gpu_profile(UUID)

PROGRAM = (
    r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
"""
    + CUDA_DECLS
    + r"""
typedef unsigned long long CUdeviceptr;
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static const char *owner(void *fn) {
    Dl_info i;
    return dladdr(fn, &i) && i.dli_fname ? i.dli_fname : "?";
}

#define OK(call) \
    do { CUresult rc_ = (call); if (rc_) { fprintf(stderr, "%s: %d\n", #call, rc_); return 1; } } while (0)

int main(int argc, char **argv) {
    int rounds = atoi(argv[1]), launches = atoi(argv[2]), allocs = atoi(argv[3]);
    CUfunction f;
    OK(load_kernel("nop", &f));
    printf("owner cuLaunchKernel %s\n", owner((void *)cuLaunchKernel));
    printf("owner cuMemAlloc_v2 %s\n", owner((void *)cuMemAlloc_v2));
    OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)); /* first call: lazy set-up */
    CUdeviceptr p;
    OK(cuMemAlloc_v2(&p, 1 << 20));
    OK(cuMemFree_v2(p));
    printf("launch_ns");
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        for (int i = 0; i < launches; i++)
            OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        printf(" %.1f", (now() - t0) / launches);
    }
    printf("\nalloc_free_ns");
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        for (int i = 0; i < allocs; i++) {
            OK(cuMemAlloc_v2(&p, 1 << 20));
            OK(cuMemFree_v2(p));
        }
        printf(" %.1f", (now() - t0) / allocs);
    }
    CUresult big = cuMemAlloc_v2(&p, (size_t)5 << 30); /* past a 4 GiB limit */
    printf("\nbig_alloc %d\n", big);
    if (big == 0)
        cuMemFree_v2(p);
    return 0;
}
"""
)


@dataclass(frozen=True)
class Run:
    owners: dict[str, str]
    launch: list[float]
    alloc_free: list[float]
    big_alloc: int


def parse(out: str) -> Run:
    owners, series, big = {}, {}, -1
    for line in out.splitlines():
        words = line.split()
        if words[0] == "owner":
            owners[words[1]] = words[2]
        elif words[0] in {"launch_ns", "alloc_free_ns"}:
            series[words[0]] = [float(v) for v in words[1:]]
        elif words[0] == "big_alloc":
            big = int(words[1])
    return Run(owners, series["launch_ns"], series["alloc_free_ns"], big)


def run(program: Path, tmp: Path, hooked: bool, args: argparse.Namespace) -> Run:
    state = tmp / ("hooked.state" if hooked else "plain.state")
    env = fake_env(tmp / "profile.yaml", state, FAKE_GPU_NS_PER_BLOCK="0")
    if hooked:
        env.update(
            LD_PRELOAD=str(BUILD / "libvgpu" / "libvgpu-control.so"),
            MANAGER_VISIBLE_DEVICES=UUID,
            MANAGER_COMPATIBILITY_MODE="0",
            CUDA_CORE_LIMIT_0="50",
            CUDA_MEM_LIMIT_0="4096m",
            **library_dirs(tmp),
        )
    argv = [str(program), str(args.rounds), str(args.launches), str(args.allocs)]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{'hooked' if hooked else 'unhooked'} run failed:\n{result.stderr}")
    return parse(result.stdout)


def merge(into: Run, more: Run) -> Run:
    """`into` with `more`'s rounds added (the last run's owners and allocation result)."""
    return Run(more.owners, into.launch + more.launch, into.alloc_free + more.alloc_free, more.big_alloc)


def check(hooked: Run, plain: Run) -> list[str]:
    """The correctness failures (empty when the library was in the path and enforcing)."""
    problems = []
    for name in ("cuLaunchKernel", "cuMemAlloc_v2"):
        if not hooked.owners[name].endswith("libvgpu-control.so"):
            problems.append(f"hooked {name} resolves to {hooked.owners[name]}")
        if not plain.owners[name].endswith("libcuda.so.1"):
            problems.append(f"unhooked {name} resolves to {plain.owners[name]}")
    if hooked.big_alloc != 2:
        problems.append(f"hooked: 5 GiB past the 4 GiB limit returned {hooked.big_alloc}, not 2 (OOM)")
    if plain.big_alloc != 0:
        problems.append(f"unhooked: the 5 GiB allocation returned {plain.big_alloc}")
    return problems


def row(name: str, hooked: list[float], plain: list[float], goal_ns: float) -> str:
    h50, h99, p50, p99 = (
        percentile(hooked, 50),
        percentile(hooked, 99),
        percentile(plain, 50),
        percentile(plain, 99),
    )
    added = h50 - p50
    verdict = "met" if added <= goal_ns else "NOT met"
    return (
        f"{name:<11} {p50:>10.1f} {p99:>10.1f} {h50:>10.1f} {h99:>10.1f} {h50 / p50:>7.2f} {h99 / p99:>7.2f}"
        f" {added:>9.1f}  goal <= {goal_ns:.0f} ns: {verdict}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="unhooked/hooked process pairs, alternated")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per process")
    parser.add_argument("--launches", type=int, default=20000, help="launches per round")
    parser.add_argument("--allocs", type=int, default=500, help="alloc/free pairs per round")
    args = parser.parse_args()
    for artefact in ("libvgpu/libvgpu-control.so", "fakecuda/libcuda.so.1", "fakenvml/libnvidia-ml.so.1"):
        if not (BUILD / artefact).exists():
            raise SystemExit(f"build/{artefact} is missing: run `make build`")
    with tempfile.TemporaryDirectory(prefix="bench-libvgpu-") as name:
        tmp = Path(name)
        (tmp / "profile.yaml").write_text(PROFILE)
        program = compile_on_fake_cuda(tmp / "calls", PROGRAM, "-O2")
        plain, hooked = Run({}, [], [], -1), Run({}, [], [], -1)
        for _ in range(args.pairs):  # alternated, so a change in the machine's load hits both alike
            plain = merge(plain, run(program, tmp, False, args))
            hooked = merge(hooked, run(program, tmp, True, args))
    rounds = args.pairs * args.rounds
    print(f"libvgpu-control.so overhead, ns per call, {rounds} rounds per side (fake driver)")
    print(
        f"{'call':<11} {'plain p50':>10} {'plain p99':>10} {'hooked p50':>10} {'hooked p99':>10}"
        f" {'x p50':>7} {'x p99':>7} {'added ns':>9}"
    )
    print(row("launch", hooked.launch, plain.launch, 100))
    print(row("alloc+free", hooked.alloc_free, plain.alloc_free, 5000))
    problems = check(hooked, plain)
    for problem in problems:
        print(f"CHECK FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
