"""The dlsym hook in real processes under LD_PRELOAD: hook names resolve to the library whatever
the handle, other names keep glibc's answer, RTLD_NEXT stays relative to the real caller, and a
process that never calls CUDA/NVML (a shell) does nothing, not even in client mode."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import built
from tests.unit.libvgpu.cbuild import compile_c, library_dirs, preload_env

OWNERSHIP = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
static const char *owner(void *p) {
    Dl_info i;
    if (p == NULL) return "NULL";
    return dladdr(p, &i) && i.dli_fname ? i.dli_fname : "?";
}
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);  /* any other library: its handle must not matter */
    const char *names[] = {"cuMemAlloc_v2", "cuGetProcAddress", "cuGetProcAddress_v2",
                           "nvmlDeviceGetMemoryInfo", NULL};
    for (int k = 0; names[k]; k++) {
        printf("%s default %s\n", names[k], owner(dlsym(RTLD_DEFAULT, names[k])));
        printf("%s next %s\n", names[k], owner(dlsym(RTLD_NEXT, names[k])));
        printf("%s handle %s\n", names[k], owner(dlsym(h, names[k])));
    }
    printf("puts default %s\n", owner(dlsym(RTLD_DEFAULT, "puts")));
    printf("cuNotAFunction default %s\n", owner(dlsym(RTLD_DEFAULT, "cuNotAFunction")));
    (void)argc;
    return 0;
}
"""


@pytest.fixture(scope="module")
def lib() -> Path:
    return built("libvgpu/libvgpu-control.so")


def test_hook_names_resolve_to_the_library_for_every_handle(lib: Path, tmp_path: Path) -> None:
    prog = compile_c(tmp_path / "owner", OWNERSHIP)
    other = built("fakenvml/libnvidia-ml.so.1")
    out = subprocess.run(
        [str(prog), str(other)], env=preload_env(lib), capture_output=True, text=True, check=True, timeout=30
    ).stdout
    lines = dict(line.rsplit(" ", 1) for line in out.splitlines())
    for name in ("cuMemAlloc_v2", "cuGetProcAddress", "cuGetProcAddress_v2", "nvmlDeviceGetMemoryInfo"):
        for how in ("default", "next", "handle"):
            assert lines[f"{name} {how}"] == str(lib), (name, how, out)
    assert "libc.so" in lines["puts default"]
    assert lines["cuNotAFunction default"] == "NULL"


LIB_A = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
int probe(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "probe");
    return next == probe ? -1 : next ? 10 + next() : 1;
}
"""
LIB_B = "int probe(void) { return 2; }\n"
MAIN = r"""
#include <stdio.h>
int probe(void);
int main(void) { printf("%d\n", probe()); return 0; }
"""


def test_rtld_next_stays_relative_to_the_caller(lib: Path, tmp_path: Path) -> None:
    """libA's dlsym(RTLD_NEXT, "probe") must find libB's, not libA's own: glibc resolves RTLD_NEXT
    from its caller's address, so the hook must hand the call on as a tail call."""
    compile_c(tmp_path / "libpa.so", LIB_A, shared=True)
    compile_c(tmp_path / "libpb.so", LIB_B, shared=True)
    link = (f"-L{tmp_path}", "-Wl,--no-as-needed", "-lpa", "-lpb", f"-Wl,-rpath,{tmp_path}")
    prog = compile_c(tmp_path / "main", MAIN, *link)
    plain = subprocess.run([str(prog)], capture_output=True, text=True, check=True, timeout=30).stdout
    assert plain.strip() == "12"
    hooked = subprocess.run(
        [str(prog)], check=False, env=preload_env(lib), capture_output=True, text=True, timeout=30
    )
    assert hooked.returncode == 0, hooked.stderr
    assert hooked.stdout.strip() == "12"


def test_a_shell_never_registers(lib: Path, tmp_path: Path) -> None:
    """Client mode registers at the first CUDA/NVML entry, never at load: a shell in the
    container must not start a register client."""
    marker = tmp_path / "registered"
    client = tmp_path / "client.sh"
    client.write_text(f"#!/bin/sh\necho $PPID >> {tmp_path}/pids.config\ntouch {marker}\n")
    client.chmod(0o755)
    env = preload_env(
        lib,
        MANAGER_COMPATIBILITY_MODE="236",
        VGPU_POD_UID="uid",
        VGPU_CONTAINER_NAME="c",
        VGPU_REGISTER_CLIENT=str(client),
        VGPU_PIDS_CONFIG=str(tmp_path / "pids.config"),
        **library_dirs(tmp_path),
    )
    subprocess.run(["/bin/sh", "-c", "ls / > /dev/null; true"], env=env, check=True, timeout=30)
    assert not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client.sh"]  # nothing created either
    # The first NVML entry does register (the same environment, so the test can fail).
    nvml = built("fakenvml/libnvidia-ml.so.1")
    code = f"import ctypes; l = ctypes.CDLL({str(nvml)!r}); print(l.nvmlInit_v2())"
    profile = {"FAKE_NVML_PROFILE": os.environ.get("FAKE_NVML_PROFILE", "")}
    out = subprocess.run(
        ["python3", "-c", code],
        check=False,
        env={**env, **profile},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert marker.exists(), out.stderr
