"""Every launch hook charges its grid's blocks to the device's bucket, in a real process under
LD_PRELOAD=libvgpu-control.so on the fake libcuda: the program reads the shared bucket
(CUDA_SM_SHARED_BUCKET, sm_node.config in a temp dir) around each launch, a refill in between
making it measure again, and prints what each call took from the bucket. Also through the pointer
cuGetProcAddress_v2 hands out for the per-thread-stream variant, and for a graph of two kernel nodes
and a child graph (the sum cached at instantiation, charged per cuGraphLaunch). A launch on a
capturing stream is not charged; the launch of the graph it was captured into is."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import built
from tests.unit.libvgpu.cbuild import CUDA_DECLS, compile_on_fake_cuda, fake_env, gpu_profile

UUID = "GPU-0c0c0c0c-1111-4222-8333-444444444444"
PROFILE = gpu_profile(UUID)

PROGRAM = (
    r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
"""
    + CUDA_DECLS
    + r"""
typedef unsigned U;
typedef struct { CUfunction func; U gx, gy, gz, bx, by, bz, shmem; void **params, **extra; } NodeParams;
typedef struct { U gx, gy, gz, bx, by, bz, shmem; CUstream s; void *attrs; U nattrs; } LaunchConfig;
typedef struct { CUfunction f; U gx, gy, gz, bx, by, bz, shmem; CUstream s; void **params; } LaunchParams;
typedef CUresult (*launch_fn)(CUfunction, U, U, U, U, U, U, U, CUstream, void **, void **);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
CUresult cuLaunchKernelEx(const LaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const LaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, CUstream, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, U, U, U, U, U, U, U, CUstream, void **);
CUresult cuLaunchCooperativeKernelMultiDevice(LaunchParams *, unsigned, unsigned);
CUresult cuLaunch(CUfunction);
CUresult cuLaunchGrid(CUfunction, int, int);
CUresult cuLaunchGridAsync(CUfunction, int, int, CUstream);
CUresult cuGraphCreate(CUgraph *, unsigned int);
CUresult cuGraphAddKernelNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const NodeParams *);
CUresult cuGraphAddChildGraphNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);

static volatile int64_t *tokens;
static volatile uint64_t *last_refill;

#define OK(call) \
    do { CUresult rc_ = (call); if (rc_) { fprintf(stderr, "%s: %d\n", #call, rc_); exit(1); } } while (0)
/* What `call` took from the bucket, measured again when a refill came in between. */
#define CHARGED(name, call)                                                      \
    do {                                                                         \
        for (;;) {                                                               \
            uint64_t r0 = *last_refill; int64_t t0 = *tokens;                    \
            OK(call);                                                            \
            int64_t t1 = *tokens; uint64_t r1 = *last_refill;                    \
            if (r0 == r1) { printf("%s %lld\n", name, (long long)(t0 - t1)); break; } \
        }                                                                        \
    } while (0)

int main(int argc, char **argv) {
    CUfunction f;
    OK(load_kernel("k", &f));
    OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)); /* sets the device's bucket up */
    int fd = open(argv[1], O_RDWR);
    char *map = fd < 0 ? MAP_FAILED : mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) { perror(argv[1]); return 1; }
    tokens = (volatile int64_t *)(map + 128);     /* device 0: tokens @0, last_refill_ns @8 */
    last_refill = (volatile uint64_t *)(map + 136);
    LaunchConfig cfg = {5, 1, 1, 1, 1, 1, 0, NULL, NULL, 0};
    LaunchParams multi = {f, 3, 3, 1, 1, 1, 1, 0, NULL, NULL};
    CHARGED("cuLaunchKernel", cuLaunchKernel(f, 3, 2, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CHARGED("cuLaunchKernel_ptsz", cuLaunchKernel_ptsz(f, 7, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CHARGED("cuLaunchKernelEx", cuLaunchKernelEx(&cfg, f, NULL, NULL));
    CHARGED("cuLaunchKernelEx_ptsz", cuLaunchKernelEx_ptsz(&cfg, f, NULL, NULL));
    CHARGED("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel(f, 9, 1, 1, 1, 1, 1, 0, NULL, NULL));
    CHARGED("cuLaunchCooperativeKernel_ptsz",
            cuLaunchCooperativeKernel_ptsz(f, 1, 10, 1, 1, 1, 1, 0, NULL, NULL));
    CHARGED("cuLaunchCooperativeKernelMultiDevice", cuLaunchCooperativeKernelMultiDevice(&multi, 1, 0));
    CHARGED("cuLaunch", cuLaunch(f));
    CHARGED("cuLaunchGrid", cuLaunchGrid(f, 4, 3));
    CHARGED("cuLaunchGridAsync", cuLaunchGridAsync(f, 2, 2, NULL));
    void *p = NULL; int status = -1;
    OK(cuGetProcAddress_v2("cuLaunchKernel", &p, 12000, 2, &status)); /* per-thread default stream */
    Dl_info info;
    printf("proc_owner %s\n", p && dladdr(p, &info) && info.dli_fname ? info.dli_fname : "?");
    CHARGED("proc_ptsz", ((launch_fn)p)(f, 8, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CUgraph g, child; CUgraphNode a, b, c, inner; CUgraphExec exec;
    NodeParams pa = {f, 10, 1, 1, 1, 1, 1, 0, NULL, NULL}, pb = {f, 11, 1, 1, 1, 1, 1, 0, NULL, NULL};
    NodeParams pc = {f, 5, 1, 1, 1, 1, 1, 0, NULL, NULL};
    OK(cuGraphCreate(&child, 0));
    OK(cuGraphAddKernelNode(&inner, child, NULL, 0, &pc));
    OK(cuGraphCreate(&g, 0));
    OK(cuGraphAddKernelNode(&a, g, NULL, 0, &pa));
    OK(cuGraphAddKernelNode(&b, g, &a, 1, &pb));
    OK(cuGraphAddChildGraphNode(&c, g, &b, 1, child));
    OK(cuGraphInstantiateWithFlags(&exec, g, 0));
    CHARGED("cuGraphLaunch", cuGraphLaunch(exec, NULL));
    CUstream cs; CUgraph captured; CUgraphExec cexec;
    OK(cuStreamCreate(&cs, 0));
    OK(cuStreamBeginCapture_v2(cs, 0));
    CHARGED("captured_launch", cuLaunchKernel(f, 13, 1, 1, 1, 1, 1, 0, cs, NULL, NULL));
    OK(cuStreamEndCapture(cs, &captured));
    OK(cuGraphInstantiateWithFlags(&cexec, captured, 0));
    CHARGED("captured_graph_launch", cuGraphLaunch(cexec, cs));
    OK(cuStreamBeginCapture_v2(cs, 0));
    /* into a capturing stream: a child graph node (the fake refuses it; the hook must not charge) */
    CHARGED("graph_launch_into_capture", (cuGraphLaunch(cexec, cs), 0));
    OK(cuStreamEndCapture(cs, &captured));
    return 0;
}
"""
)

EXPECTED = {
    "cuLaunchKernel": 6,
    "cuLaunchKernel_ptsz": 7,
    "cuLaunchKernelEx": 5,
    "cuLaunchKernelEx_ptsz": 5,
    "cuLaunchCooperativeKernel": 9,
    "cuLaunchCooperativeKernel_ptsz": 10,
    "cuLaunchCooperativeKernelMultiDevice": 9,
    "cuLaunch": 1,
    "cuLaunchGrid": 12,
    "cuLaunchGridAsync": 4,
    "proc_ptsz": 8,
    "cuGraphLaunch": 26,
    "captured_launch": 0,  # a node of the graph being captured: charged when the graph runs
    "captured_graph_launch": 13,
    "graph_launch_into_capture": 0,
}


@pytest.mark.needs_build
def test_each_launch_hook_charges_its_grid(tmp_path: Path) -> None:
    program = compile_on_fake_cuda(tmp_path / "charges", PROGRAM)
    (tmp_path / "profile.yaml").write_text(PROFILE)
    env = fake_env(
        tmp_path / "profile.yaml",
        tmp_path / "gpu.state",
        LD_PRELOAD=str(built("libvgpu/libvgpu-control.so")),
        MANAGER_VISIBLE_DEVICES=UUID,
        MANAGER_COMPATIBILITY_MODE="0",
        CUDA_CORE_LIMIT_0="90",
        CUDA_SM_SHARED_BUCKET="true",
        VGPU_SM_NODE_DIR=str(tmp_path / "sm"),
    )
    result = subprocess.run(
        [str(program), str(tmp_path / "sm" / "sm_node.config")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines.pop("proc_owner").endswith("libvgpu-control.so")
    assert {name: int(value) for name, value in lines.items()} == EXPECTED
