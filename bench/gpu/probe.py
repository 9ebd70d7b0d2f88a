"""One phase of the acceptance run, in its own process (started by acceptance.py with
LD_PRELOAD=libvgpu-control.so and the limits in its environment): `python -m bench.gpu.probe
PHASE ARGS...`; the last stdout line is the phase's JSON result ({"exception": ...} and exit 1
when the phase raised).

Phases: `info UUID`, `alloc DOOR CHUNK CAP`, `hold BYTES` (allocates, reports, waits for stdin to
close), `once BYTES`, `spin SECONDS SPIN_MS`, `overhead LAUNCHES ALLOCS`, `torch CHUNK CAP`."""

from __future__ import annotations

import ctypes
import json
import sys
import time
from ctypes import byref, c_int, c_size_t, c_uint, c_uint64, c_void_p

from bench.gpu import cuda
from bench.gpu.cuda import CUDA_SUCCESS, Driver, MemAllocationProp
from bench.gpu.ptx import SPIN_AND_NOP


def info(uuid: str) -> dict:
    drv = Driver().open()
    free, total = drv.mem_info()
    nvml = cuda.Nvml()
    mem = nvml.memory(nvml.handle_by_uuid(uuid))
    return {
        "uuid": drv.uuid(),
        "cuMemGetInfo_v2": {"free": free, "total": total},
        "cuDeviceTotalMem_v2": drv.total_mem(),
        "nvmlDeviceGetMemoryInfo": {"free": mem.free, "total": mem.total, "used": mem.used},
        "sms": drv.attribute(cuda.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        "clock_khz": drv.attribute(cuda.CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
        "owners": {
            name: cuda.owner(drv.address(name))
            for name in ("cuMemGetInfo_v2", "cuDeviceTotalMem_v2", "cuMemAlloc_v2", "cuLaunchKernel")
        },
        "nvml_owner": cuda.owner(ctypes.cast(nvml.lib.nvmlDeviceGetMemoryInfo, c_void_p).value or 0),
    }


class Door:
    """One allocation entry point: `alloc(bytes) -> (code, handle)`, `free(handle)`."""

    def __init__(self, drv: Driver, kind: str) -> None:
        self.drv, self.kind, self.owner = drv, kind, "?"
        self.stream = c_void_p()
        if kind == "cuMemAlloc_v2":
            self.owner = cuda.owner(drv.address("cuMemAlloc_v2"))
        elif kind == "cuGetProcAddress_v2":
            code, pfn, status = drv.proc_address("cuMemAlloc", 12000, 0)
            if code != CUDA_SUCCESS or not pfn:
                raise cuda.CudaError(f"cuGetProcAddress_v2(cuMemAlloc) status {status}", code)
            self.owner = cuda.owner(pfn)
            self.fn = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(c_uint64), c_size_t)(pfn)
        elif kind == "cuMemAllocManaged":
            self.owner = cuda.owner(drv.address(kind))
        elif kind == "cuMemAllocAsync":
            drv.must("cuStreamCreate", byref(self.stream), c_uint(1))
            self.owner = cuda.owner(drv.address(kind))
        elif kind == "cuMemCreate":
            self.owner = cuda.owner(drv.address(kind))
        else:
            raise ValueError(f"unknown door {kind!r}")

    def alloc(self, size: int) -> tuple[int, int]:
        ptr = c_uint64()
        d = self.drv
        if self.kind == "cuMemAlloc_v2":
            code = d.call("cuMemAlloc_v2", byref(ptr), c_size_t(size))
        elif self.kind == "cuGetProcAddress_v2":
            code = int(self.fn(byref(ptr), size))
        elif self.kind == "cuMemAllocManaged":
            code = d.call("cuMemAllocManaged", byref(ptr), c_size_t(size), c_uint(cuda.CU_MEM_ATTACH_GLOBAL))
        elif self.kind == "cuMemAllocAsync":
            code = d.call("cuMemAllocAsync", byref(ptr), c_size_t(size), self.stream)
            if code == CUDA_SUCCESS:
                d.must("cuStreamSynchronize", self.stream)
        else:
            prop = MemAllocationProp()
            prop.type = cuda.CU_MEM_ALLOCATION_TYPE_PINNED
            prop.location.type = cuda.CU_MEM_LOCATION_TYPE_DEVICE
            prop.location.id = d.dev.value
            code = d.call("cuMemCreate", byref(ptr), c_size_t(size), byref(prop), c_uint64(0))
        return code, ptr.value

    def free(self, handle: int) -> None:
        d = self.drv
        if self.kind == "cuMemCreate":
            d.must("cuMemRelease", c_uint64(handle))
        elif self.kind == "cuMemAllocAsync":
            d.must("cuMemFreeAsync", c_uint64(handle), self.stream)
            d.must("cuStreamSynchronize", self.stream)
        else:
            d.must("cuMemFree_v2", c_uint64(handle))


def alloc(kind: str, chunk: int, cap: int) -> dict:
    """Allocate `chunk` bytes through one door until it fails (at most `cap` times), then free all."""
    door = Door(Driver().open(), kind)
    held: list[int] = []
    code = CUDA_SUCCESS
    while len(held) < cap:
        code, handle = door.alloc(chunk)
        if code != CUDA_SUCCESS:
            break
        held.append(handle)
    for handle in held:
        door.free(handle)
    return {"door": kind, "owner": door.owner, "error": code, "count": len(held), "total": len(held) * chunk}


def once(size: int) -> dict:
    drv = Driver().open()
    ptr = c_uint64()
    code = drv.call("cuMemAlloc_v2", byref(ptr), c_size_t(size))
    return {"error": code, "bytes": size}


def hold(size: int) -> dict:
    result = once(size)
    print(json.dumps(result), flush=True)
    sys.stdin.read()
    return result


def _module(drv: Driver) -> tuple[int, c_void_p]:
    mod = c_void_p()
    return drv.call("cuModuleLoadData", byref(mod), ctypes.c_char_p(SPIN_AND_NOP)), mod


#: the SM clock assumed when the driver does not report one (H200 boost clock, kHz)
DEFAULT_CLOCK_KHZ = 1_980_000


def spin(seconds: float, spin_ms: float) -> dict:
    """Launch `spin` for `seconds` (each launch: 4 blocks of 128 threads per SM, each spinning
    `spin_ms` of the SM clock), 4 launches between synchronisations."""
    drv = Driver().open()
    grid = 4 * (drv.attribute(cuda.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) or 0)
    cycles = int((drv.attribute(cuda.CU_DEVICE_ATTRIBUTE_CLOCK_RATE) or DEFAULT_CLOCK_KHZ) * spin_ms)
    load, mod = _module(drv)
    shape = {"module_load": load, "grid": grid, "cycles": cycles}
    if load != CUDA_SUCCESS or grid == 0:
        return {**shape, "launches": 0, "seconds": 0.0, "rate": 0.0}
    fn = c_void_p()
    drv.must("cuModuleGetFunction", byref(fn), mod, b"spin")
    arg = c_uint64(cycles)
    params = (c_void_p * 1)(c_void_p(ctypes.addressof(arg)))
    launch = drv.lib.cuLaunchKernel
    launch.restype = c_int
    launches, start = 0, time.monotonic()
    end = start + seconds
    while time.monotonic() < end:
        for _ in range(4):
            code = launch(fn, grid, 1, 1, 128, 1, 1, 0, None, params, None)
            if code != CUDA_SUCCESS:
                raise cuda.CudaError("cuLaunchKernel", code)
            launches += 1
        drv.must("cuCtxSynchronize")
    spent = time.monotonic() - start
    return {**shape, "launches": launches, "seconds": spent, "rate": launches / spent}


def overhead(launches: int, allocs: int) -> dict:
    """ns per empty launch (1 block, async, one final synchronisation) and per 1 MiB alloc+free."""
    drv = Driver().open()
    load, mod = _module(drv)
    if load != CUDA_SUCCESS:
        raise cuda.CudaError("cuModuleLoadData", load)
    fn = c_void_p()
    drv.must("cuModuleGetFunction", byref(fn), mod, b"nop")
    launch, malloc, free = drv.lib.cuLaunchKernel, drv.lib.cuMemAlloc_v2, drv.lib.cuMemFree_v2
    for f in (launch, malloc, free):
        f.restype = c_int
    malloc.argtypes = [ctypes.POINTER(c_uint64), c_size_t]
    free.argtypes = [c_uint64]
    ptr = c_uint64()
    malloc(byref(ptr), 1 << 20), free(ptr)  # first calls: lazy set-up, not timed
    launch(fn, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    drv.must("cuCtxSynchronize")
    t0 = time.perf_counter_ns()
    for _ in range(launches):
        code = launch(fn, 1, 1, 1, 1, 1, 1, 0, None, None, None)
        if code != CUDA_SUCCESS:
            raise cuda.CudaError("cuLaunchKernel", code)
    drv.must("cuCtxSynchronize")
    t1 = time.perf_counter_ns()
    for _ in range(allocs):
        code = malloc(byref(ptr), 1 << 20)
        if code != CUDA_SUCCESS:
            raise cuda.CudaError("cuMemAlloc_v2", code)
        free(ptr)
    t2 = time.perf_counter_ns()
    return {
        "launches": launches,
        "launch_ns": (t1 - t0) / launches,
        "allocs": allocs,
        "alloc_free_ns": (t2 - t1) / allocs,
        "launch_owner": cuda.owner(drv.address("cuLaunchKernel")),
    }


def torch_probe(chunk: int, cap: int) -> dict:
    """PyTorch over the library: mem_get_info, then `chunk`-byte tensors until OutOfMemoryError."""
    import torch

    if torch.version.cuda is None:
        return {"unavailable": f"PyTorch {torch.__version__} is built without CUDA"}
    free, total = torch.cuda.mem_get_info()
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    held, error = [], None
    while len(held) < cap:
        try:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except oom as exc:
            error = type(exc).__name__
            break
    try:
        reserved: int | None = torch.cuda.memory_reserved()
    except RuntimeError:  # allocator backends without the caching allocator's statistics
        reserved = None
    return {
        "mem_get_info": {"free": free, "total": total},
        "stopped_by": error,
        "count": len(held),
        "total": len(held) * chunk,
        "reserved": reserved,
        "torch": torch.__version__,
    }


PHASES = {
    "info": lambda a: info(a[0]),
    "alloc": lambda a: alloc(a[0], int(a[1]), int(a[2])),
    "once": lambda a: once(int(a[0])),
    "hold": lambda a: hold(int(a[0])),
    "spin": lambda a: spin(float(a[0]), float(a[1])),
    "overhead": lambda a: overhead(int(a[0]), int(a[1])),
    "torch": lambda a: torch_probe(int(a[0]), int(a[1])),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in PHASES:
        print(json.dumps({"exception": f"usage: probe {{{','.join(PHASES)}}} ARGS..."}))
        return 2
    try:
        result = PHASES[argv[0]](argv[1:])
    except Exception as exc:  # the phase's failure is its result, read by acceptance.py
        print(json.dumps({"exception": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
