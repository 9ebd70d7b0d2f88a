"""`GpuInventory`, what the rest of vgpud sees of the node's GPUs, and the factory that opens one."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

from .model import GpuInfo, GpuInventoryError

Backend = Literal["nvml", "mock"]


class GpuInventory(Protocol):
    """The node's physical GPUs. `gpus()` may block (NVML): call it from a worker thread."""

    backend: str  # "nvml" or "mock"

    def gpus(self) -> list[GpuInfo]:
        """Every GPU, sorted by index; raises GpuInventoryError when they cannot be read."""
        ...

    def describe(self) -> str:
        """One line for logs: the backend and where its GPUs come from."""
        ...

    def process_memory(self) -> dict[int, dict[int, int]]:
        """GPU index -> {host PID: bytes of device memory it uses}; blocks like `gpus()`."""
        ...


def open_inventory(
    backend: Backend, *, profile: Path | None = None, nvml_library: str | None = None
) -> GpuInventory:
    """Open a backend: "nvml" (optionally a library path instead of libnvidia-ml.so.1) or "mock" (a
    profile, see `vgpud.gpu.mock.shipped_profiles()`). Fails early, with a GpuInventoryError, on a
    missing library or a bad profile."""
    if backend == "mock":
        if profile is None:
            raise GpuInventoryError("the mock GPU backend needs a profile (a YAML file of GPUs)")
        if nvml_library is not None:
            raise GpuInventoryError("an NVML library applies to the nvml GPU backend, not to the mock one")
        from .mock import MockInventory  # here: PyYAML only where profiles are read

        return MockInventory(profile)
    if backend == "nvml":
        if profile is not None:
            raise GpuInventoryError("a GPU profile applies to the mock GPU backend, not to the nvml one")
        from .nvml import NvmlInventory  # here: pynvml only where NVML is used

        return NvmlInventory(nvml_library)
    raise GpuInventoryError(f"unknown GPU backend {backend!r}: expected 'nvml' or 'mock'")
