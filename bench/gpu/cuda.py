"""Minimal ctypes access to the CUDA driver API and NVML, as an application would reach them: by
soname (`libcuda.so.1`, `libnvidia-ml.so.1`), each symbol through `dlsym`, so under
LD_PRELOAD=libvgpu-control.so every door the library guards is the one taken."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_MEM_ATTACH_GLOBAL = 1
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1


class CudaError(RuntimeError):
    """A driver call that had to succeed returned `code`."""

    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} returned {code}")
        self.code = code


class MemLocation(ctypes.Structure):
    _fields_ = [("type", c_int), ("id", c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class MemAllocationProp(ctypes.Structure):
    """CUmemAllocationProp (cuda.h): 32 bytes on 64-bit."""

    _fields_ = [
        ("type", c_int),
        ("requestedHandleTypes", c_int),
        ("location", MemLocation),
        ("win32HandleMetaData", c_void_p),
        ("allocFlags", AllocFlags),
    ]


class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class NvmlUtilization(ctypes.Structure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class Driver:
    """libcuda.so.1 with a current primary context on CUDA ordinal 0 once `open()` ran."""

    def __init__(self, soname: str = "libcuda.so.1") -> None:
        self.lib = ctypes.CDLL(soname)
        self.dev = c_int(0)
        self.ctx = c_void_p()

    def call(self, name: str, *args: object) -> int:
        """The driver's return code of `name(*args)`."""
        fn = getattr(self.lib, name)
        fn.restype = c_int
        return int(fn(*args))

    def must(self, name: str, *args: object) -> None:
        code = self.call(name, *args)
        if code != CUDA_SUCCESS:
            raise CudaError(name, code)

    def open(self) -> Driver:
        self.must("cuInit", c_uint(0))
        self.must("cuDeviceGet", byref(self.dev), c_int(0))
        self.must("cuDevicePrimaryCtxRetain", byref(self.ctx), self.dev)
        self.must("cuCtxSetCurrent", self.ctx)
        return self

    def attribute(self, attr: int) -> int | None:
        value = c_int()
        if self.call("cuDeviceGetAttribute", byref(value), c_int(attr), self.dev) != CUDA_SUCCESS:
            return None
        return value.value

    def mem_info(self) -> tuple[int, int]:
        free, total = c_size_t(), c_size_t()
        self.must("cuMemGetInfo_v2", byref(free), byref(total))
        return free.value, total.value

    def total_mem(self) -> int:
        total = c_size_t()
        self.must("cuDeviceTotalMem_v2", byref(total), self.dev)
        return total.value

    def uuid(self) -> str:
        raw = (ctypes.c_ubyte * 16)()
        self.must("cuDeviceGetUuid", raw, self.dev)
        h = bytes(raw).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def proc_address(self, symbol: str, version: int, flags: int = 0) -> tuple[int, int, int]:
        """cuGetProcAddress_v2: (return code, function pointer, symbolStatus)."""
        pfn, status = c_void_p(), c_int(-1)
        fn = self.lib.cuGetProcAddress_v2
        fn.restype = c_int
        fn.argtypes = [c_char_p, POINTER(c_void_p), c_int, c_uint64, POINTER(c_int)]
        code = fn(symbol.encode(), byref(pfn), version, flags, byref(status))
        return int(code), int(pfn.value or 0), status.value

    def address(self, name: str) -> int:
        """The address `dlsym` gives for `name` (the library's hook when it is preloaded)."""
        return ctypes.cast(getattr(self.lib, name), c_void_p).value or 0


class Nvml:
    """libnvidia-ml.so.1, initialised."""

    def __init__(self, soname: str = "libnvidia-ml.so.1") -> None:
        self.lib = ctypes.CDLL(soname)
        self.must("nvmlInit_v2")

    def must(self, name: str, *args: object) -> None:
        fn = getattr(self.lib, name)
        fn.restype = c_int
        code = int(fn(*args))
        if code != 0:
            raise RuntimeError(f"{name} returned NVML error {code}")

    def handle(self, index: int = 0) -> c_void_p:
        h = c_void_p()
        self.must("nvmlDeviceGetHandleByIndex_v2", c_uint(index), byref(h))
        return h

    def handle_by_uuid(self, uuid: str) -> c_void_p:
        h = c_void_p()
        self.must("nvmlDeviceGetHandleByUUID", uuid.encode(), byref(h))
        return h

    def text(self, name: str, *args: object) -> str:
        buf = ctypes.create_string_buffer(96)
        self.must(name, *args, buf, c_uint(len(buf)))
        return buf.value.decode()

    def memory(self, h: c_void_p) -> NvmlMemory:
        mem = NvmlMemory()
        self.must("nvmlDeviceGetMemoryInfo", h, byref(mem))
        return mem

    def utilization(self, h: c_void_p) -> int:
        util = NvmlUtilization()
        self.must("nvmlDeviceGetUtilizationRates", h, byref(util))
        return int(util.gpu)


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", c_char_p), ("fbase", c_void_p), ("sname", c_char_p), ("saddr", c_void_p)]


def owner(address: int) -> str:
    """The file of the loaded object that holds `address` (dladdr), or "?"."""
    libc = ctypes.CDLL(None)
    info = _DlInfo()
    if address and libc.dladdr(c_void_p(address), byref(info)) and info.fname:
        return info.fname.decode()
    return "?"


def loaded(fragment: str) -> str | None:
    """The path of the first object mapped into this process whose name contains `fragment`."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split(maxsplit=5)[5].strip() if len(line.split(maxsplit=5)) == 6 else ""
            if fragment in path.rsplit("/", 1)[-1]:
                return path
    return None
