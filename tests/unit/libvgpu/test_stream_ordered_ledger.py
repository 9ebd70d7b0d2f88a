"""Stream-ordered allocations in the vmem_node.config ledger, in real processes under the library
over the fake driver, whose NVML shows such an allocation only when its stream's earlier work has
ended (csrc/fakecuda/README.md, "Memory"):

- ASYNC_BRIDGE: the hook charges the ledger right after the driver call, synchronizes the stream off
  the lock and retires the charge, so another process allocating in between counts the bytes;
- CAPTURE: an allocation on a capturing stream is admitted against the limit and charged until
  cuStreamEndCapture, or until its cuMemFreeAsync before that."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.support import built
from tests.unit.libvgpu.cbuild import CUDA_DECLS, compile_on_fake_cuda, fake_env, gpu_profile, library_dirs
from vgpud.partition.libfiles import VMEM_NODE_FILE, LibFileError, parse_vmem_node

UUID = "GPU-5e5e5e5e-1111-4222-8333-444444444444"
MIB = 1 << 20

PROGRAM = (
    r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
"""
    + CUDA_DECLS
    + r"""
typedef unsigned long long CUdeviceptr;
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);

#define OK(call) \
    do { CUresult rc_ = (call); if (rc_) { fprintf(stderr, "%s: %d\n", #call, rc_); return 1; } } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* This process's usedGpuMemory in NVML's compute list of device 0 (v1 structs). */
static unsigned long long nvml_mine(void) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    int (*init)(void) = nvml ? dlsym(nvml, "nvmlInit_v2") : NULL;
    int (*by_index)(unsigned, void **) = nvml ? dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    int (*procs)(void *, unsigned *, void *) =
        nvml ? dlsym(nvml, "nvmlDeviceGetComputeRunningProcesses") : NULL;
    struct { unsigned pid; unsigned long long used; } list[64];
    unsigned n = 64;
    void *dev;
    if (!init || !by_index || !procs || init() || by_index(0, &dev) || procs(dev, &n, list)) return ~0ull;
    for (unsigned i = 0; i < n; i++)
        if (list[i].pid == (unsigned)getpid()) return list[i].used;
    return 0;
}

int main(int argc, char **argv) {
    CUfunction f;
    CUstream s;
    CUdeviceptr p;
    char line[16];
    OK(load_kernel("k", &f));
    if (strcmp(argv[1], "alloc") == 0) {           /* B: one plain allocation */
        printf("rc %d\n", cuMemAlloc_v2(&p, strtoull(argv[2], NULL, 0)));
        return 0;
    }
    OK(cuStreamCreate(&s, 0));
    if (strcmp(argv[1], "bridge") == 0) {          /* A: ~2 s of kernels, then the allocation */
        OK(cuLaunchKernel(f, 2000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        double t0 = now_s();
        CUresult rc = cuMemAllocAsync(&p, strtoull(argv[2], NULL, 0), s);
        printf("rc %d\nhook_s %.3f\nnvml %llu\n", rc, now_s() - t0, nvml_mine());
        fflush(stdout);
        return fgets(line, sizeof line, stdin) == NULL ? 0 : 0; /* hold the memory until told */
    }
    OK(cuStreamBeginCapture_v2(s, 0));             /* capture: N allocations, a free, then the end */
    CUdeviceptr first = 0;
    for (int i = 0; i < atoi(argv[3]); i++) {
        printf("rc%d %d\n", i, cuMemAllocAsync(&p, strtoull(argv[2], NULL, 0), s));
        first = first ? first : p;
    }
    printf("captured 1\n");
    fflush(stdout);
    if (fgets(line, sizeof line, stdin) == NULL) return 1;
    printf("freed %d\n", cuMemFreeAsync(first, s));
    fflush(stdout);
    if (fgets(line, sizeof line, stdin) == NULL) return 1;
    CUgraph g;
    OK(cuStreamEndCapture(s, &g));
    printf("ended 1\n");
    fflush(stdout);
    return fgets(line, sizeof line, stdin) == NULL ? 0 : 0;
}
"""
)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    program = compile_on_fake_cuda(tmp_path / "ordered", PROGRAM)
    (tmp_path / "profile.yaml").write_text(gpu_profile(UUID))
    env = fake_env(
        tmp_path / "profile.yaml",
        tmp_path / "gpu.state",
        LD_PRELOAD=str(built("libvgpu/libvgpu-control.so")),
        **library_dirs(tmp_path),
        MANAGER_VISIBLE_DEVICES=UUID,
        MANAGER_COMPATIBILITY_MODE="0",
        CUDA_MEM_LIMIT_0="1024m",
        FAKE_GPU_NS_PER_BLOCK="1000000",  # 2000 blocks: two seconds (room for B to start under load)
    )
    return program, env


def ledger(root: Path) -> dict[int, int]:
    path = root / "vmem" / VMEM_NODE_FILE
    try:
        parsed = parse_vmem_node(path.read_bytes())
    except (FileNotFoundError, LibFileError):  # not there yet, or the library is creating it
        return {}
    return {e.pid: e.used for e in parsed.devices[0] if e.pid > 0}


def lines(proc: subprocess.Popen[str], until: str) -> dict[str, str]:
    """The process's `key value` lines up to (and with) the key `until`."""
    assert proc.stdout is not None
    got: dict[str, str] = {}
    while until not in got:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        key, value = line.split(" ", 1)
        got[key] = value.strip()
    return got


def start(program: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(program), *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.needs_build
def test_bridge_charges_the_ledger_until_the_stream_got_there(
    tmp_path: Path, setup: tuple[Path, dict[str, str]]
) -> None:
    program, env = setup
    a = start(program, env, "bridge", str(600 * MIB))
    try:
        deadline = time.monotonic() + 5
        while ledger(tmp_path) != {a.pid: 600 * MIB}:  # A is inside its hook, waiting for its stream
            assert time.monotonic() < deadline, f"no ledger charge: {ledger(tmp_path)}"
            time.sleep(0.005)
        b = subprocess.run(
            [str(program), "alloc", str(600 * MIB)],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert b.stdout.split() == ["rc", "2"], b.stderr  # 600 + 600 MiB > 1 GiB
        got = lines(a, "nvml")
        assert got["rc"] == "0"
        assert float(got["hook_s"]) > 0.5  # the hook waited for the stream's earlier work
        assert got["nvml"] == str(600 * MIB)  # NVML shows it now ...
        assert ledger(tmp_path) == {}  # ... and the ledger no longer carries it
    finally:
        a.communicate(timeout=30)
    assert a.returncode == 0


@pytest.mark.needs_build
def test_capture_charges_the_ledger_until_the_capture_ends(
    tmp_path: Path, setup: tuple[Path, dict[str, str]]
) -> None:
    program, env = setup
    proc = start(program, env, "capture", str(400 * MIB), "3")
    assert proc.stdin is not None
    try:
        got = lines(proc, "captured")
        assert got == {"rc0": "0", "rc1": "0", "rc2": "2", "captured": "1"}  # 3 x 400 MiB > 1 GiB
        assert ledger(tmp_path) == {proc.pid: 800 * MIB}
        proc.stdin.write("free\n")
        proc.stdin.flush()
        assert lines(proc, "freed") == {"freed": "0"}
        assert ledger(tmp_path) == {proc.pid: 400 * MIB}  # a free before the end retires its charge
        proc.stdin.write("end\n")
        proc.stdin.flush()
        lines(proc, "ended")
        assert ledger(tmp_path) == {}
    finally:
        proc.communicate(timeout=30)
    assert proc.returncode == 0
