"""From-pool allocations are charged to the pool's device, not the stream's (reference §1 "alloc",
HAMi-core #93): with peer access a stream on GPU 0 may allocate from a pool on GPU 1, and that memory
is GPU 1's. Real processes over the fake driver and NVML, two GPUs; each run learns its pool one way
(the library records a pool's device when the driver hands the pool out)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import built
from tests.unit.libvgpu.cbuild import compile_on_fake_cuda, fake_env, library_dirs
from tests.unit.libvgpu.conftest import PROFILE, UUIDS

OOM = "2"
#: every way the library learns a pool's device
SOURCES = ("create", "default", "current", "mem_default", "mem_current")

# argv: how to get the pool (create, default, current, mem_default, mem_current), the pool's device,
# the stream's device, a size in MiB. Allocates that twice from the pool on the stream; prints both
# results.
CALLER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
typedef void *CUcontext, *CUstream, *CUmemoryPool;
typedef struct { int type, id; } CUmemLocation;
typedef struct {
    int allocType, handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, int);
CUresult cuDeviceGetMemPool(CUmemoryPool *, int);
CUresult cuMemGetDefaultMemPool(CUmemoryPool *, CUmemLocation *, int);
CUresult cuMemGetMemPool(CUmemoryPool *, CUmemLocation *, int);
CUresult cuMemAllocFromPoolAsync(unsigned long long *, size_t, CUmemoryPool, CUstream);

static CUresult get_pool(const char *how, int dev, CUmemoryPool *pool) {
    CUmemLocation loc = {1 /* CU_MEM_LOCATION_TYPE_DEVICE */, dev};
    CUmemPoolProps props = {.allocType = 1 /* PINNED */, .location = loc};
    if (!strcmp(how, "create")) return cuMemPoolCreate(pool, &props);
    if (!strcmp(how, "default")) return cuDeviceGetDefaultMemPool(pool, dev);
    if (!strcmp(how, "current")) return cuDeviceGetMemPool(pool, dev);
    if (!strcmp(how, "mem_default")) return cuMemGetDefaultMemPool(pool, &loc, 1);
    if (!strcmp(how, "mem_current")) return cuMemGetMemPool(pool, &loc, 1);
    return -1;
}

int main(int argc, char **argv) {
    if (argc != 5) return 2;
    CUcontext ctx;
    CUstream stream;
    CUmemoryPool pool;
    CUresult rc;
    if ((rc = cuInit(0)) || (rc = cuDevicePrimaryCtxRetain(&ctx, atoi(argv[3]))) ||
        (rc = cuCtxSetCurrent(ctx)) || (rc = cuStreamCreate(&stream, 0)) ||
        (rc = get_pool(argv[1], atoi(argv[2]), &pool))) {
        fprintf(stderr, "setup: %d\n", rc);
        return 3;
    }
    unsigned long long p;
    size_t bytes = (size_t)atoi(argv[4]) << 20;
    CUresult first = cuMemAllocFromPoolAsync(&p, bytes, pool, stream);
    CUresult second = cuMemAllocFromPoolAsync(&p, bytes, pool, stream);
    printf("%d %d\n", first, second);
    return 0;
}
"""


@pytest.fixture(scope="module")
def caller(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_on_fake_cuda(tmp_path_factory.mktemp("pool") / "poolprobe", CALLER)


Run = tuple[str, int, int, int]  # pool source, pool device, stream device, MiB per allocation


def run_all(root: Path, caller: Path, runs: dict[str, Run], **extra: str) -> dict[str, tuple[str, str]]:
    """Each run in its own process, GPU state and library directories, all at once; by name, its
    "first second" results and its stderr."""
    lib = built("libvgpu/libvgpu-control.so")
    procs: dict[str, subprocess.Popen[str]] = {}
    for name, (how, pool_dev, stream_dev, mib) in runs.items():
        tmp = root / name
        tmp.mkdir()
        env = fake_env(
            PROFILE,
            tmp / "gpu.state",
            **library_dirs(tmp),
            LD_PRELOAD=str(lib),
            VGPU_PROC="/proc",
            **extra,
        )
        argv = [str(caller), how, str(pool_dev), str(stream_dev), str(mib)]
        procs[name] = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    got: dict[str, tuple[str, str]] = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, f"{name}: {err}"
        got[name] = (out.strip(), err)
    return got


def test_from_pool_allocation_is_charged_to_the_pools_device(tmp_path: Path, caller: Path) -> None:
    # Both GPUs are the container's, only GPU 1 limited: 600 MiB fits its 1 GiB once.
    runs: dict[str, Run] = {how: (how, 1, 0, 600) for how in SOURCES}
    # GPU 0's pool on a GPU 1 stream: GPU 0 is unlimited, so even more than GPU 1's limit, twice.
    runs["reverse"] = ("create", 0, 1, 1100)
    got = run_all(tmp_path, caller, runs, MANAGER_VISIBLE_DEVICES=",".join(UUIDS), CUDA_MEM_LIMIT_1="1g")
    want = {name: f"0 {OOM}" for name in runs}
    want["reverse"] = "0 0"
    assert {name: out for name, (out, _) in got.items()} == want


def test_pool_on_a_device_not_the_containers_gets_nothing(tmp_path: Path, caller: Path) -> None:
    # GPU 1 is not the container's: its pool gives no memory, even to a stream on GPU 0.
    got = run_all(tmp_path, caller, {"foreign": ("create", 1, 0, 1)}, MANAGER_VISIBLE_DEVICES=UUIDS[0])
    out, err = got["foreign"]
    assert out == f"{OOM} {OOM}"
    assert f"vgpu: warning: refused device {UUIDS[1]}: not one of this container's devices" in err
