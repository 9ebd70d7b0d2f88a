"""A driver that calls its own exported functions through the PLT (cuMemAlloc -> cuMemAlloc_v2, as
the fake NVML's nvmlInit_v2 -> nvmlInitWithFlags does) re-enters the library's hooks inside a hooked
call: the inner call must pass straight through (no second lock, no second charge), not deadlock."""

from __future__ import annotations

from pathlib import Path

from tests.unit.libvgpu.cbuild import run_on_own_driver
from tests.unit.libvgpu.conftest import PROFILE, UUIDS

UUID_BYTES = ", ".join(f"0x{UUIDS[0][4:].replace('-', '')[i : i + 2]}" for i in range(0, 32, 2))

DRIVER = (
    """
#include <string.h>
int cuInit(unsigned int f) { (void)f; return 0; }
int cuCtxGetDevice(int *d) { *d = 0; return 0; }
int cuDeviceGetUuid_v2(char *u, int d) {
    static const unsigned char b[16] = {"""
    + UUID_BYTES
    + """};
    (void)d; memcpy(u, b, 16); return 0;
}
int calls_v2;
int cuMemAlloc_v2(unsigned long long *p, size_t n) { (void)n; calls_v2++; *p = 0x1000; return 0; }
/* The v1 entry forwards to the exported v2 one: a PLT call, interposed by the preload. */
int cuMemAlloc(unsigned int *p, unsigned int n) {
    unsigned long long q; int r = cuMemAlloc_v2(&q, n); *p = (unsigned int)q; return r;
}
"""
)

CALLER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
    int (*alloc1)(unsigned *, unsigned) = (int (*)(unsigned *, unsigned))dlsym(cuda, "cuMemAlloc");
    unsigned p = 0;
    init(0);
    printf("rc %d\n", alloc1(&p, 1 << 20));
    printf("v2_calls %d\n", *(int *)dlsym(cuda, "calls_v2"));
    return 0;
}
"""


def test_nested_hook_calls_pass_through(tmp_path: Path) -> None:
    out = run_on_own_driver(
        tmp_path,
        DRIVER,
        CALLER,
        PROFILE,
        MANAGER_VISIBLE_DEVICES=UUIDS[0],
        CUDA_MEM_LIMIT_0="1g",
    )
    assert out.split() == ["rc", "0", "v2_calls", "1"]
