"""The real CUDA runtime (libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel) over the fake driver.

How far it gets: libcudart dlopens libcuda.so.1 (here the fake, by LD_LIBRARY_PATH), resolves every
driver entry point through cuGetProcAddress with (base name, the PFN typedef's version, flags 0 or
CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM), then asks cuGetExportTable for two private tables.
It carries on without the first; without the second its initialization fails and every call that
needs a device returns the driver's error (the fake's CUDA_ERROR_NOT_SUPPORTED, 801). Those tables
are undocumented, so the fake serves none: tests that need a runtime above the driver use the driver
API directly.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import require
from tests.unit.fakes.conftest import Env
from tests.unit.fakes.gpu import start

# The tables libcudart 12.9 asks for, in the order it asks (the CUuuid's 16 bytes in memory order).
EXPORT_TABLES = ["f8cff951-2146-8b4e-b9e2-fb469e7c0dd9", "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"]

CUDART = """
rt = ctypes.CDLL(os.environ["CUDART"])
v = ctypes.c_int()
runtime = [rt.cudaRuntimeGetVersion(ref(v)), v.value]
driver = [rt.cudaDriverGetVersion(ref(v)), v.value]
n = ctypes.c_int(-1)
count = [rt.cudaGetDeviceCount(ref(n)), n.value]
p = vp()
free, total = sz(), sz()
emit(runtime=runtime, driver=driver, count=count, malloc=rt.cudaMalloc(ref(p), sz(1 << 20)),
     info=rt.cudaMemGetInfo(ref(free), ref(total)), free=rt.cudaFree(None))
"""


def cudart() -> Path:
    try:
        import nvidia.cuda_runtime  # the wheel's namespace package
    except ImportError:
        paths: list[str] = []
    else:
        paths = list(nvidia.cuda_runtime.__path__)
    found = [
        Path(p) / "lib" / "libcudart.so.12" for p in paths if (Path(p) / "lib" / "libcudart.so.12").exists()
    ]
    require(
        bool(found), "libcudart.so.12", "the nvidia-cuda-runtime-cu12 wheel (a dev dependency: make setup)"
    )
    return found[0]


def run_cudart(env: dict[str, str]) -> tuple[dict, str]:
    lib_dir = str(Path(env["FAKE_CUDA_LIB"]).parent)
    child_env = {**env, "CUDART": str(cudart()), "LD_LIBRARY_PATH": lib_dir, "FAKE_CUDA_TRACE": "1"}
    child = start(CUDART, child_env)
    report = child.read()
    return report, child.finish()


def test_cudart_resolves_the_fake_driver_through_get_proc_address(gpu_env: Env) -> None:
    report, trace = run_cudart(gpu_env(cuda="12.8"))
    assert report["runtime"] == [0, 12090]
    assert report["driver"] == [0, 12080]  # cuDriverGetVersion of the fake, through cudart
    lookups = set(re.findall(r'cuGetProcAddress\("(\w+)", (\d+), (\d)\) = (\w+)', trace))
    assert {
        ("cuGetProcAddress", "12000", "0", "cuGetProcAddress_v2"),
        ("cuMemAlloc", "3020", "0", "cuMemAlloc_v2"),
        ("cuMemGetInfo", "3020", "0", "cuMemGetInfo_v2"),
        ("cuMemFree", "3020", "0", "cuMemFree_v2"),
        ("cuLaunchKernel", "7000", "2", "cuLaunchKernel_ptsz"),
        ("cuMemAllocAsync", "11020", "2", "cuMemAllocAsync_ptsz"),
        ("cuStreamGetCaptureInfo", "12030", "0", "cuStreamGetCaptureInfo_v3"),
        ("cuGraphExecUpdate", "12000", "0", "cuGraphExecUpdate_v2"),
    } <= lookups
    # every version it asks for has a variant here: none is "version not sufficient"
    assert "version not sufficient" not in trace


def test_cudart_stops_at_the_drivers_private_export_table(gpu_env: Env) -> None:
    report, trace = run_cudart(gpu_env(cuda="12.8"))
    assert re.findall(r"cuGetExportTable\(([0-9a-f-]+)\)", trace) == EXPORT_TABLES
    # cudaErrorNotSupported: the driver's error, passed on; the count is left as it was
    assert report["count"] == [801, -1]
    assert report["malloc"] == report["info"] == report["free"] == 801
