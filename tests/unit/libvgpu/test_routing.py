"""cuGetProcAddress routing when the driver hands out a pointer the library does not know (not an
exported symbol of libcuda): the exact-name index cannot say which function it is, so the
library matches by name, except where the name alone does not fix the ABI."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import built
from tests.unit.libvgpu.cbuild import compile_c, library_dirs, preload_env

# A driver whose cuGetProcAddress answers every symbol with one internal (unexported) function.
DRIVER = r"""
static int internal(void) { return 0; }
int cuInit(unsigned int flags) { (void)flags; return 0; }
int cuGetProcAddress(const char *s, void **p, int v, unsigned long long f) {
    (void)s; (void)v; (void)f; *p = (void *)internal; return 0;
}
int cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, int *st) {
    (void)s; (void)v; (void)f; *p = (void *)internal; if (st) *st = 0; return 0;
}
"""

CALLER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
typedef int (*gpa2_t)(const char *, void **, int, unsigned long long, int *);
int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    gpa2_t gpa2 = (gpa2_t)dlsym(cuda, "cuGetProcAddress_v2");
    const char *names[] = {"cuMemAllocAsync", "cuMemAllocAsync", "cuMemAlloc", "cuInit", "cuCtxCreate",
                           "cuDeviceGet", "cuDeviceGetName", NULL};
    unsigned long long flags[] = {0, 2, 0, 0, 0, 0, 0};
    for (int i = 0; names[i]; i++) {
        void *p = NULL;
        int st;
        Dl_info info;
        gpa2(names[i], &p, 12000, flags[i], &st);
        dladdr(p, &info);
        printf("%s.%llu %s:%s\n", names[i], flags[i], info.dli_fname, info.dli_sname ? info.dli_sname : "?");
    }
    return 0;
}
"""


def test_unknown_driver_pointers_are_matched_by_name_only_when_unambiguous(tmp_path: Path) -> None:
    lib = built("libvgpu/libvgpu-control.so")
    driver = compile_c(tmp_path / "libcuda.so.1", DRIVER, "-Wl,-soname,libcuda.so.1", shared=True)
    caller = compile_c(tmp_path / "caller", CALLER)
    env = preload_env(lib, LD_LIBRARY_PATH=str(tmp_path), **library_dirs(tmp_path))
    out = subprocess.run(
        [str(caller)], env=env, capture_output=True, text=True, check=True, timeout=30
    ).stdout
    got = dict(line.split(" ", 1) for line in out.splitlines())
    assert got["cuMemAllocAsync.0"] == f"{lib}:cuMemAllocAsync"
    assert got["cuMemAllocAsync.2"] == f"{lib}:cuMemAllocAsync_ptsz"  # the per-thread-stream flag
    assert got["cuInit.0"] == f"{lib}:cuInit"
    # One ABI under one name: the hook.
    assert got["cuDeviceGet.0"] == f"{lib}:cuDeviceGet"
    # cuMemAlloc has a 32-bit and a size_t ABI: the base name does not say which one it is; nor does
    # cuCtxCreate's (four variants, two signatures).
    assert got["cuMemAlloc.0"].startswith(f"{driver}:")
    assert got["cuCtxCreate.0"].startswith(f"{driver}:")
    assert got["cuDeviceGetName.0"].startswith(f"{driver}:")  # not hooked


VERSIONED_CALLER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
typedef int (*gpa2_t)(const char *, void **, int, unsigned long long, int *);
int main(int argc, char **argv) {
    void *cuda = dlopen(argv[1], RTLD_NOW);
    gpa2_t gpa2 = (gpa2_t)dlsym(cuda, "cuGetProcAddress_v2");
    void *p = NULL;
    int st;
    printf("rc %d\n", gpa2("cuDeviceGet", &p, 12000, 0, &st));
    (void)argc;
    return 0;
}
"""

NVRM = {
    "proprietary": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
    "open": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build",
}


def test_the_real_driver_is_the_version_the_kernel_module_names(tmp_path: Path) -> None:
    """Only libcuda.so.550.54.15 exists (no libcuda.so.1): the library must load the version the
    NVRM line names, for both kernel module flavours, or it finds no real cuGetProcAddress."""
    lib = built("libvgpu/libvgpu-control.so")
    compile_c(tmp_path / "libcuda.so.550.54.15", DRIVER, "-Wl,-soname,libcuda.so.550.54.15", shared=True)
    caller = compile_c(tmp_path / "caller", VERSIONED_CALLER)
    env = preload_env(lib, LD_LIBRARY_PATH=str(tmp_path), **library_dirs(tmp_path))
    version_file = tmp_path / "version"
    for flavour, text in NVRM.items():
        version_file.write_text(text + "\nGCC version:  gcc version 12.2.0\n")
        env["VGPU_DRIVER_VERSION_FILE"] = str(version_file)
        out = subprocess.run(
            [str(caller), "libcuda.so.550.54.15"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        assert out.split() == ["rc", "0"], flavour
    # Without the version file the library looks for libcuda.so.1, which is not there.
    env["VGPU_DRIVER_VERSION_FILE"] = str(tmp_path / "absent")
    out = subprocess.run(
        [str(caller), "libcuda.so.550.54.15"], env=env, capture_output=True, text=True, check=True, timeout=30
    ).stdout
    assert out.split() == ["rc", "500"]  # CUDA_ERROR_NOT_FOUND: no real driver
