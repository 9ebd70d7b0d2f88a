"""ctypes clients of the fake libcuda.so.1 and libnvidia-ml.so.1, and a runner of child processes.

The fake driver reads its environment once (cuInit), so every scenario runs in a child process of its
own: `start(script, env)` runs `script` with this module imported, the child prints JSON lines, and
may hold its GPU state until the test closes its stdin (`Child.hold`).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CUDA_LIB = "fakecuda/libcuda.so.1"
NVML_LIB = "fakenvml/libnvidia-ml.so.1"
GIB = 1 << 30
MIB = 1 << 20

# Two GPUs in PCI order opposite to their NVML index, so a CUDA ordinal and an NVML index differ.
UUID_A = "GPU-11111111-2222-4333-8444-555555555555"  # NVML index 0, PCI bus 0x87
UUID_B = "GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"  # NVML index 1, PCI bus 0x07


def profile_text(cuda: str = "12.4", memory_gib: int = 8) -> str:
    """A two-GPU profile: an A100 pair (108 SMs, 2048 threads per SM) with `memory_gib` each."""
    gpus = [(UUID_A, 0, "00000000:87:00.0"), (UUID_B, 1, "00000000:07:00.0")]
    lines = ["driverVersion: 550.54.15", f'cudaDriverVersion: "{cuda}"', "gpus:"]
    for uuid, index, bus in gpus:
        lines += [
            f"  - uuid: {uuid}",
            f"    index: {index}",
            f"    minor: {index}",
            "    productName: NVIDIA A100-SXM4-40GB",
            "    brand: Nvidia",
            "    architecture: Ampere",
            f"    memoryTotal: {memory_gib * GIB}",
            f'    pciBusId: "{bus}"',
            '    computeCapability: "8.0"',
        ]
    return "\n".join(lines) + "\n"


class CudaError(Exception):
    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} returned {code}")
        self.code = code


class Cuda:
    """The driver API through ctypes; `ok` raises CudaError on a non-zero CUresult."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)

    def __call__(self, name: str, *args: Any) -> int:
        return int(getattr(self.lib, name)(*args))

    def ok(self, name: str, *args: Any) -> None:
        rc = self(name, *args)
        if rc != 0:
            raise CudaError(name, rc)

    def address(self, name: str) -> int:
        """Where the library's exported `name` is."""
        return int(ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value or 0)

    def init(self) -> None:
        self.ok("cuInit", 0)

    def count(self) -> int:
        n = ctypes.c_int()
        self.ok("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def uuid(self, ordinal: int, name: str = "cuDeviceGetUuid_v2") -> str:
        raw = (ctypes.c_ubyte * 16)()
        self.ok(name, raw, ordinal)
        h = bytes(raw).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def attribute(self, attribute: int, ordinal: int) -> int:
        v = ctypes.c_int()
        self.ok("cuDeviceGetAttribute", ctypes.byref(v), attribute, ordinal)
        return v.value

    def use(self, ordinal: int) -> int:
        """Retain the device's primary context and make it current; returns the context."""
        ctx = ctypes.c_void_p()
        self.ok("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), ordinal)
        self.ok("cuCtxSetCurrent", ctx)
        return int(ctx.value or 0)

    def alloc(self, size: int, name: str = "cuMemAlloc_v2") -> int:
        ptr = ctypes.c_ulonglong()
        self.ok(name, ctypes.byref(ptr), ctypes.c_size_t(size))
        return ptr.value

    def free(self, ptr: int) -> None:
        self.ok("cuMemFree_v2", ctypes.c_ulonglong(ptr))

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.ok("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def proc(self, symbol: str, version: int, flags: int = 0) -> tuple[int, int, int]:
        """cuGetProcAddress_v2: (CUresult, function address or 0, symbolStatus)."""
        fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
        rc = self(
            "cuGetProcAddress_v2",
            symbol.encode(),
            ctypes.byref(fn),
            version,
            ctypes.c_uint64(flags),
            ctypes.byref(status),
        )
        return rc, int(fn.value or 0), status.value

    def kernel(self, name: str = "spin") -> int:
        """A function of a loaded PTX module with one kernel, `name`."""
        ptx = f".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry {name}()\n{{\n ret;\n}}\n"
        module, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.ok("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(ptx.encode()))
        self.ok("cuModuleGetFunction", ctypes.byref(fn), module, name.encode())
        return int(fn.value or 0)

    def launch(self, fn: int, blocks: int, stream: int = 0, name: str = "cuLaunchKernel") -> None:
        c = ctypes.c_uint
        self.ok(
            name,
            ctypes.c_void_p(fn),
            c(blocks),
            c(1),
            c(1),
            c(32),
            c(1),
            c(1),
            c(0),
            ctypes.c_void_p(stream),
            None,
            None,
        )

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self.ok("cuStreamCreate", ctypes.byref(s), 0)
        return int(s.value or 0)


class ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessInfoV2(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class UtilizationSample(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class Nvml:
    """The NVML calls the fakes share state through, by NVML index."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        rc = self.lib.nvmlInit_v2()
        if rc != 0:
            raise RuntimeError(f"nvmlInit_v2 returned {rc}")

    def handle(self, index: int) -> ctypes.c_void_p:
        h = ctypes.c_void_p()
        rc = self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h))
        if rc != 0:
            raise RuntimeError(f"nvmlDeviceGetHandleByIndex_v2 returned {rc}")
        return h

    def processes(self, index: int, name: str = "nvmlDeviceGetComputeRunningProcesses") -> dict[int, int]:
        """{pid: usedGpuMemory}; the v1 struct for the unsuffixed name, else v2/v3's 24 bytes."""
        kind = ProcessInfoV1 if not name.endswith(("_v2", "_v3")) else ProcessInfoV2
        count = ctypes.c_uint(0)
        fn = getattr(self.lib, name)
        rc = fn(self.handle(index), ctypes.byref(count), None)
        if rc == 0:
            return {}
        if rc != 7:  # NVML_ERROR_INSUFFICIENT_SIZE
            raise RuntimeError(f"{name} returned {rc}")
        infos = (kind * count.value)()
        rc = fn(self.handle(index), ctypes.byref(count), infos)
        if rc != 0:
            raise RuntimeError(f"{name} returned {rc}")
        return {infos[i].pid: infos[i].usedGpuMemory for i in range(count.value)}

    def memory(self, index: int) -> tuple[int, int, int]:
        """nvmlDeviceGetMemoryInfo: (total, free, used)."""
        m = (ctypes.c_ulonglong * 3)()
        rc = self.lib.nvmlDeviceGetMemoryInfo(self.handle(index), m)
        if rc != 0:
            raise RuntimeError(f"nvmlDeviceGetMemoryInfo returned {rc}")
        return m[0], m[1], m[2]

    def process_utilization(self, index: int, last_seen_us: int) -> tuple[int, dict[int, int]]:
        """nvmlDeviceGetProcessUtilization: (nvmlReturn_t, {pid: smUtil})."""
        fn = self.lib.nvmlDeviceGetProcessUtilization
        count = ctypes.c_uint(0)
        rc = fn(self.handle(index), None, ctypes.byref(count), ctypes.c_ulonglong(last_seen_us))
        if rc != 7:
            return rc, {}
        samples = (UtilizationSample * count.value)()
        rc = fn(self.handle(index), samples, ctypes.byref(count), ctypes.c_ulonglong(last_seen_us))
        return rc, {samples[i].pid: samples[i].smUtil for i in range(count.value)}

    def utilization(self, index: int) -> int:
        """nvmlDeviceGetUtilizationRates().gpu."""
        u = (ctypes.c_uint * 2)()
        rc = self.lib.nvmlDeviceGetUtilizationRates(self.handle(index), u)
        if rc != 0:
            raise RuntimeError(f"nvmlDeviceGetUtilizationRates returned {rc}")
        return u[0]


def emit(**values: Any) -> None:
    """A child's report: one JSON line on stdout."""
    print(json.dumps(values), flush=True)


def hold() -> None:
    """Keep this child (and its GPU state) alive until the test closes its stdin."""
    sys.stdin.read()


@dataclass
class Child:
    proc: subprocess.Popen[str]

    def read(self) -> dict[str, Any]:
        """The child's next JSON line (it fails the test with the child's stderr if there is none)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"child exited {self.proc.returncode} without a report: {stderr}")
        return json.loads(line)

    def finish(self) -> str:
        """Let the child exit; returns its stderr. The child must exit 0."""
        _, stderr = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, stderr
        return stderr


PRELUDE = """
import ctypes, os, sys, time
from tests.unit.fakes.gpu import *
cuda = Cuda(os.environ["FAKE_CUDA_LIB"])
ref, sz, u64, vp = ctypes.byref, ctypes.c_size_t, ctypes.c_ulonglong, ctypes.c_void_p
"""


def start(script: str, env: dict[str, str], prefix: Sequence[str] = ()) -> Child:
    """Run `script` (after PRELUDE) in a child Python with `env` over this environment; `prefix` is
    a command that execs the rest (e.g. `unshare --pid --fork`)."""
    repo = Path(__file__).resolve().parents[3]
    inherited = {
        k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES" and not k.startswith("FAKE_")
    }
    full = {**inherited, "PYTHONPATH": str(repo), **env}
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", PRELUDE + script],
        env=full,
        cwd=repo,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return Child(proc)


def run(script: str, env: dict[str, str], prefix: Sequence[str] = ()) -> dict[str, Any]:
    """Run `script` to completion; returns its one JSON report."""
    child = start(script, env, prefix)
    report = child.read()
    child.finish()
    return report
