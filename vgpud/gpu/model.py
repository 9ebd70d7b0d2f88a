"""What vgpud knows about one physical GPU, whichever backend found it.

The name tables follow NVIDIA's go-nvlib (`GetBrandAsString`, `GetArchitectureAsString`,
`GetAddressingModeAsString`), because the ResourceSlice attributes must read exactly as the Go
reference system publishes them. The mock profiles and the fake NVML library use the same names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


class GpuInventoryError(Exception):
    """The GPU inventory cannot be read: a bad profile, or an NVML that is missing or failing."""


@dataclass(frozen=True)
class MigDevice:
    """One MIG device of a GPU in MIG mode (a compute instance in a GPU instance), as NVML reports it:
    what an operator needs to tell it apart, since vgpud leaves MIG GPUs out of its ResourceSlice."""

    uuid: str  # "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # "3g.20gb": what NVML's device name says after " MIG "
    slices: int  # the GPU instance's slices of the GPU's 7
    memory_total: int  # bytes
    multiprocessor_count: int


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU. Values are as the DRA layer publishes them, before any per-claim maths."""

    uuid: str  # as NVML gives it, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    index: int  # NVML enumeration index (the host index the library's env vars use)
    minor: int  # /dev/nvidia<minor>; the DRA device is named vgpu-<minor>
    product_name: str
    brand: str  # a value of BRAND_NAMES
    architecture: str  # a value of ARCHITECTURE_NAMES
    memory_total: int  # bytes
    pci_bus_id: str  # normalized: lower case, 4-digit domain, "0000:07:00.0"
    numa_node: int | None  # None when the platform reports no NUMA affinity
    compute_capability: str  # "8.0"
    driver_version: str  # "550.54.15"
    cuda_driver_version: str  # "12.4"
    addressing_mode: str | None  # "None" / "HMM" / "ATS"; None when the platform does not support it
    #: MIG mode now (NVML's current mode; a pending change counts from the GPU's next reset)
    mig_mode: bool = False
    #: its MIG devices, by MIG index (none unless `mig_mode`)
    mig_devices: tuple[MigDevice, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready mapping, field names as above (the MIG devices a list of mappings)."""
        return {**dataclasses.asdict(self), "mig_devices": [dataclasses.asdict(m) for m in self.mig_devices]}


NVML_ARCH_UNKNOWN = 0xFFFFFFFF

BRAND_NAMES: dict[int, str] = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}

ARCHITECTURE_NAMES: dict[int, str] = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    11: "Orin",  # NVML_DEVICE_ARCH_T23X
    NVML_ARCH_UNKNOWN: "Unknown",
}

ADDRESSING_MODE_NAMES: dict[int, str] = {0: "None", 1: "HMM", 2: "ATS"}


def normalize_pci_bus_id(bus_id: str) -> str:
    """NVML's "00000000:07:00.0" -> "0000:07:00.0" (go-nvlib `GetPCIBusID`: lower case, domain cut to 4)."""
    normalized = bus_id.strip().lower()
    if normalized != "0000" and normalized.startswith("0000"):
        normalized = normalized[4:]
    return normalized


def cuda_version_string(version: int) -> str:
    """NVML's CUDA driver version integer (12040) as "12.4", the way the Go reference renders it."""
    return f"{version // 1000}.{version % 1000 // 10}"


@dataclass(frozen=True)
class XidEvent:
    """NVML delivered a critical-error event: XID `xid` on the GPU of NVML index `index`."""

    index: int
    xid: int


@dataclass(frozen=True)
class GpusLost:
    """NVML's event wait said a GPU is lost without saying which: check every GPU now."""
