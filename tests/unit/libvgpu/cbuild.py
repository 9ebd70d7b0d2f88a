"""Compile and run the small C programs and libraries the library tests and bench/libvgpu.py run
(gcc, into a temp dir), on the fake driver and NVML of csrc/fakecuda and csrc/fakenvml."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.support import BUILD, REPO, built

#: the prefixes of the variables the library and the fakes read: a run starts without any of the
#: caller's, so only what the run sets counts
OWN_PREFIXES = ("CUDA_", "MANAGER_", "VGPU_", "FAKE_")

#: the C declarations of the driver calls the programs share (the driver's types reduced to what
#: the fake and the library need), and load_kernel, their common set-up (after <stdio.h>)
CUDA_DECLS = r"""
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUgraph, *CUgraphNode, *CUgraphExec;
CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream, void **, void **);

/* Device 0's primary context made current and the kernel `name` of a one-entry PTX module in *f:
 * CUDA_SUCCESS, or the first failing call's result (named on stderr). */
__attribute__((unused)) static CUresult load_kernel(const char *name, CUfunction *f) {
    static char ptx[256];
    snprintf(ptx, sizeof ptx,
             ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry %s()\n{\n ret;\n}\n", name);
    CUdevice dev; CUcontext ctx; CUmodule mod; CUresult rc;
#define LOAD_STEP(call) if ((rc = (call)) != 0) { fprintf(stderr, "%s: %d\n", #call, rc); return rc; }
    LOAD_STEP(cuInit(0));
    LOAD_STEP(cuDeviceGet(&dev, 0));
    LOAD_STEP(cuDevicePrimaryCtxRetain(&ctx, dev));
    LOAD_STEP(cuCtxSetCurrent(ctx));
    LOAD_STEP(cuModuleLoadData(&mod, ptx));
    LOAD_STEP(cuModuleGetFunction(f, mod, name));
#undef LOAD_STEP
    return 0;
}
"""


def compile_c(out: Path, source: str, *flags: str, shared: bool = False) -> Path:
    """Build `source` into `out` (a program, or a shared library when `shared`)."""
    src = out.with_suffix(".c")
    src.write_text(source)
    argv = ["gcc", "-std=gnu11", "-O1", "-g", "-Wall", "-Werror", "-o", str(out), str(src)]
    if shared:
        argv[1:1] = ["-shared", "-fPIC"]
    subprocess.run([*argv, *flags, "-ldl", "-lpthread"], check=True, capture_output=True, text=True)
    return out


def compile_on_fake_cuda(out: Path, source: str, *flags: str) -> Path:
    """Build the program `source` linked against the fake libcuda of build/fakecuda."""
    fakecuda = built("fakecuda/libcuda.so.1").parent
    return compile_c(out, source, f"-L{fakecuda}", "-l:libcuda.so.1", *flags)


def gpu_profile(
    uuid: str,
    name: str = "NVIDIA H100 80GB HBM3",
    arch: str = "Hopper",
    cc: str = "9.0",
    memory: int = 85520809984,
) -> str:
    """A fake NVML profile of one GPU (the fake derives SMs / threads per SM from `cc`)."""
    return f"""driverVersion: 550.54.15
cudaDriverVersion: "12.4"
gpus:
  - uuid: {uuid}
    index: 0
    minor: 0
    productName: {name}
    brand: Nvidia
    architecture: {arch}
    memoryTotal: {memory}
    pciBusId: "00000000:18:00.0"
    computeCapability: "{cc}"
"""


def fake_env(profile: Path, state: Path, library_path: str = "", **extra: str) -> dict[str, str]:
    """This process's environment without the library's and the fakes' variables, on the fake driver
    and NVML (or `library_path`) with the GPU of `profile` and its shared state in `state`; `extra`
    last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(OWN_PREFIXES)}
    env.update(
        LD_LIBRARY_PATH=library_path or f"{BUILD / 'fakecuda'}:{BUILD / 'fakenvml'}",
        FAKE_NVML_PROFILE=str(profile),
        FAKE_GPU_STATE=str(state),
    )
    env.update(extra)
    return env


def preload_env(lib: Path, **extra: str) -> dict[str, str]:
    """This process's environment without the library's variables (the fakes' left as they are),
    with `lib` preloaded; `extra` last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "MANAGER_", "VGPU_"))}
    env["LD_PRELOAD"] = str(lib)
    env.update(extra)
    return env


def library_dirs(root: Path) -> dict[str, str]:
    """The library's file directories (config, lock, vmem, sm nodes) under `root`."""
    return {
        "VGPU_CONFIG_DIR": str(root / "config"),
        "VGPU_LOCK_DIR": str(root / "lock"),
        "VGPU_VMEM_NODE_DIR": str(root / "vmem"),
        "VGPU_SM_NODE_DIR": str(root / "sm"),
    }


def run_on_own_driver(tmp: Path, driver: str, caller: str, profile: Path, **extra: str) -> str:
    """Build `driver` as tmp/libcuda.so.1 and the program `caller`, run the caller under the library
    on that driver and the fake NVML (the GPUs of `profile`, the library's directories under `tmp`,
    `extra` last); its stdout (a failed run raises)."""
    lib = built("libvgpu/libvgpu-control.so")
    nvml = built("fakenvml/libnvidia-ml.so.1")
    compile_c(tmp / "libcuda.so.1", driver, "-Wl,-soname,libcuda.so.1", shared=True)
    program = compile_c(tmp / "caller", caller)
    env = fake_env(
        profile,
        tmp / "gpu.state",
        library_path=f"{tmp}:{nvml.parent}",
        LD_PRELOAD=str(lib),
        **library_dirs(tmp),
        **extra,
    )
    return subprocess.run(
        [str(program)], env=env, capture_output=True, text=True, check=True, timeout=30
    ).stdout


def makefile_tests(variable: str) -> list[str]:
    """The test list `variable` (TESTS, CORE_TESTS) of csrc/libvgpu/Makefile, so a new C test is
    picked up without editing the Python side."""
    text = (REPO / "csrc" / "libvgpu" / "Makefile").read_text()
    match = re.search(rf"^{variable}\s*:=\s*(.+)$", text, re.MULTILINE)
    assert match, f"csrc/libvgpu/Makefile has no {variable} line"
    return match.group(1).split()


def check_c_test(name: str) -> None:
    """Run the C unit test build/libvgpu/tests/`name`: it must exit 0 and report no failed check."""
    binary = built(f"libvgpu/tests/{name}")
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert re.search(rf"^{name}: \d+ checks, 0 failed$", result.stdout, re.MULTILINE), output


#: probe N (linked to the fake libnvidia-ml): every 100 ms for N samples, one line: the device's
#: utilisation (nvmlDeviceGetUtilizationRates, the last second), then `pid:sm` for each process with
#: kernel time in the last second (nvmlDeviceGetProcessUtilization). The closed-loop tests' observer.
NVML_PROBE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int sm, mem, enc, dec; } Sample;
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
int nvmlDeviceGetUtilizationRates(nvmlDevice_t, nvmlUtilization_t *);
int nvmlDeviceGetProcessUtilization(nvmlDevice_t, Sample *, unsigned int *, unsigned long long);

/* probe N: every 100 ms for N samples, one line: the device's utilisation, then pid:sm for each
 * process with kernel time in the last second. */
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    nvmlDevice_t d;
    if (nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(0, &d)) return 1;
    struct timespec step = {0, 100000000L};
    for (int i = 0; i < n; i++) {
        nanosleep(&step, NULL);
        nvmlUtilization_t u;
        if (nvmlDeviceGetUtilizationRates(d, &u)) return 2;
        printf("%u", u.gpu);
        struct timeval tv;
        gettimeofday(&tv, NULL);
        Sample s[16];
        unsigned int count = 16;
        unsigned long long since = tv.tv_sec * 1000000ull + tv.tv_usec - 1000000ull;
        int rc = nvmlDeviceGetProcessUtilization(d, s, &count, since);
        for (unsigned int j = 0; rc == 0 && j < count; j++)
            printf(" %u:%u", s[j].pid, s[j].sm);
        printf("\n");
        fflush(stdout);
    }
    return 0;
}
"""
