"""Stream-ordered allocations are charged to the stream's device, not the current context's: a
driver double with two devices whose stream handles are their contexts (smaller than a two-GPU fake
driver state), NVML from the fake."""

from __future__ import annotations

from pathlib import Path

from tests.unit.libvgpu.cbuild import run_on_own_driver
from tests.unit.libvgpu.conftest import PROFILE, UUIDS


def _bytes(uuid: str) -> str:
    hexed = uuid[4:].replace("-", "")
    return ", ".join(f"0x{hexed[i : i + 2]}" for i in range(0, 32, 2))


# Contexts are the pointers ctx0/ctx1; a stream is a pointer to the context it belongs to.
DRIVER = (
    """
#include <string.h>
static int ctx0, ctx1;
static int *current = &ctx0, *saved;
void *stream1 = &ctx1;
int cuInit(unsigned int f) { (void)f; return 0; }
int cuCtxGetDevice(int *d) { *d = current == &ctx1; return 0; }
int cuCtxPushCurrent_v2(void *c) { saved = current; current = c; return 0; }
int cuCtxPopCurrent_v2(void **c) { *c = current; current = saved; return 0; }
int cuStreamGetCtx(void *s, void **c) { *c = *(void **)&s; return 0; }
int cuDeviceGetUuid_v2(char *u, int d) {
    static const unsigned char b[2][16] = {{"""
    + _bytes(UUIDS[0])
    + "}, {"
    + _bytes(UUIDS[1])
    + """}};
    memcpy(u, b[d], 16); return 0;
}
int cuMemAllocAsync(unsigned long long *p, size_t n, void *s) { (void)n; (void)s; *p = 0x1000; return 0; }
"""
)

CALLER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
typedef int (*async_t)(unsigned long long *, size_t, void *);
int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    ((int (*)(unsigned))dlsym(cuda, "cuInit"))(0);
    async_t alloc = (async_t)dlsym(cuda, "cuMemAllocAsync");
    void *stream1 = *(void **)dlsym(cuda, "stream1");
    unsigned long long p;
    printf("default %d\n", alloc(&p, 512 << 20, NULL));
    printf("stream1 %d\n", alloc(&p, 512 << 20, stream1));
    int dev = -1;
    ((int (*)(int *))dlsym(cuda, "cuCtxGetDevice"))(&dev);
    printf("current %d\n", dev);
    return 0;
}
"""


def test_async_allocation_is_charged_to_the_streams_device(tmp_path: Path) -> None:
    out = run_on_own_driver(
        tmp_path,
        DRIVER,
        CALLER,
        PROFILE,
        MANAGER_VISIBLE_DEVICES=",".join(UUIDS),
        CUDA_MEM_LIMIT_1="256m",  # device 0 (the current one) is not limited
    )
    got = dict(line.split() for line in out.splitlines())
    assert got == {"default": "0", "stream1": "2", "current": "0"}
