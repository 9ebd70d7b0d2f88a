"""The NVML backend: the node's GPUs through nvidia-ml-py (`pynvml`).

pynvml keeps its library in module globals and only ever loads "libnvidia-ml.so.1" by name. To load
a library we name (a driver root's path, or the fake NVML in tests) and report exactly what failed to
load, this module opens the library itself with ctypes and binds it into pynvml (vgpud.compat.pynvml)
for the span of one read, under a lock. Every read is a whole NVML
session (init, queries, shutdown), so repeated reads, even against different libraries in one
process, do not interfere. The health watcher's session (`NvmlHealthSession`) is the one held open:
its event set lives as long as the watcher, while the reads above still come and go beside it (NVML
counts its inits). All NVML use in vgpud goes through here. Calls block: run them in a thread.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from vgpud.compat import pynvml as pynvml_compat

from .model import (
    ADDRESSING_MODE_NAMES,
    ARCHITECTURE_NAMES,
    BRAND_NAMES,
    GpuInfo,
    GpuInventoryError,
    GpusLost,
    MigDevice,
    XidEvent,
    cuda_version_string,
    normalize_pci_bus_id,
)

DEFAULT_LIBRARY = "libnvidia-ml.so.1"
SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")  # NUMA fallback, as the Go reference reads it

log = logging.getLogger(__name__)
_session = threading.Lock()
_T = TypeVar("_T")
# An optional query that the driver lacks or the platform does not support yields None.
_ABSENT = (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported)
# What a GPU that fell off the bus (or needs a reset) answers: the GPU is sick, not NVML.
_DEVICE_GONE = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_ResetRequired)


class NvmlInventory:
    """GPUs as NVML reports them, read afresh on every `gpus()` call."""

    backend = "nvml"

    def __init__(self, library: str | None = None) -> None:
        self.library = library or DEFAULT_LIBRARY
        try:
            self._lib = ctypes.CDLL(self.library)
        except OSError as err:
            raise GpuInventoryError(f"NVML library {self.library} could not be loaded: {err}") from err

    def describe(self) -> str:
        return f"NVML GPUs through {self.library}"

    def gpus(self) -> list[GpuInfo]:
        with _session:
            pynvml_compat.bind(self._lib)
            self._call("nvmlInitWithFlags", pynvml.nvmlInit)
            try:
                driver = self._call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)
                cuda = self._call("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion)
                count = self._call("nvmlDeviceGetCount_v2", pynvml.nvmlDeviceGetCount)
                return [self._gpu(index, _text(driver), cuda_version_string(cuda)) for index in range(count)]
            finally:
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError as err:
                    log.warning("nvmlShutdown through %s failed: %s", self.library, err)

    def process_memory(self) -> dict[int, dict[int, int]]:
        """NVML index -> {host PID: bytes of device memory} over the compute and graphics process
        lists (a PID in both counts once); a process whose memory NVML cannot tell is left out."""
        with _session:
            pynvml_compat.bind(self._lib)
            self._call("nvmlInitWithFlags", pynvml.nvmlInit)
            try:
                count = self._call("nvmlDeviceGetCount_v2", pynvml.nvmlDeviceGetCount)
                out: dict[int, dict[int, int]] = {}
                for index in range(count):
                    handle = self._call(
                        "nvmlDeviceGetHandleByIndex_v2", pynvml.nvmlDeviceGetHandleByIndex, index
                    )
                    used: dict[int, int] = {}
                    for symbol, fn in (
                        ("nvmlDeviceGetComputeRunningProcesses", pynvml.nvmlDeviceGetComputeRunningProcesses),
                        (
                            "nvmlDeviceGetGraphicsRunningProcesses",
                            pynvml.nvmlDeviceGetGraphicsRunningProcesses,
                        ),
                    ):
                        for process in self._call(symbol, fn, handle, where=f" on GPU {index}"):
                            if process.usedGpuMemory is not None:
                                used.setdefault(int(process.pid), int(process.usedGpuMemory))
                    out[index] = used
                return out
            finally:
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError as err:
                    log.warning("nvmlShutdown through %s failed: %s", self.library, err)

    def _gpu(self, index: int, driver_version: str, cuda_driver_version: str) -> GpuInfo:
        handle = self._call("nvmlDeviceGetHandleByIndex_v2", pynvml.nvmlDeviceGetHandleByIndex, index)
        where = f" for GPU {index}"

        def query(symbol: str, fn: Callable[..., _T]) -> _T:
            return self._call(symbol, fn, handle, where=where)

        def optional(
            symbol: str, fn: Callable[..., _T], absent: tuple[type[Exception], ...] = _ABSENT
        ) -> _T | None:
            return self._call(symbol, fn, handle, where=where, absent=absent)

        minor = optional(
            "nvmlDeviceGetMinorNumber", pynvml.nvmlDeviceGetMinorNumber, (pynvml.NVMLError_NotSupported,)
        )
        if minor is None:
            log.warning("GPU %d has no minor number (WSL?): using its index, as the Go reference does", index)
            minor = index
        pci_bus_id = normalize_pci_bus_id(
            _text(query("nvmlDeviceGetPciInfo_v3", pynvml.nvmlDeviceGetPciInfo_v3).busId)
        )
        numa_node = optional("nvmlDeviceGetNumaNodeId", pynvml.nvmlDeviceGetNumaNodeId)
        if numa_node is None or numa_node < 0:
            numa_node = _sysfs_numa_node(pci_bus_id)
        addressing = optional("nvmlDeviceGetAddressingMode", pynvml.nvmlDeviceGetAddressingMode)
        cc_major, cc_minor = query(
            "nvmlDeviceGetCudaComputeCapability", pynvml.nvmlDeviceGetCudaComputeCapability
        )
        modes = optional("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode)
        mig_mode = modes is not None and modes[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        return GpuInfo(
            uuid=_text(query("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID)),
            index=index,
            minor=minor,
            product_name=_text(query("nvmlDeviceGetName", pynvml.nvmlDeviceGetName)),
            brand=_named(BRAND_NAMES, query("nvmlDeviceGetBrand", pynvml.nvmlDeviceGetBrand), "brand", index),
            architecture=_named(
                ARCHITECTURE_NAMES,
                query("nvmlDeviceGetArchitecture", pynvml.nvmlDeviceGetArchitecture),
                "architecture",
                index,
            ),
            memory_total=query("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo).total,
            pci_bus_id=pci_bus_id,
            numa_node=numa_node,
            compute_capability=f"{cc_major}.{cc_minor}",
            driver_version=driver_version,
            cuda_driver_version=cuda_driver_version,
            addressing_mode=None if addressing is None else _addressing_mode_name(addressing, index),
            mig_mode=mig_mode,
            mig_devices=self._mig_devices(handle, index) if mig_mode else (),
        )

    def _mig_devices(self, handle: Any, index: int) -> tuple[MigDevice, ...]:
        """The MIG devices of GPU `index` (in MIG mode), by MIG index; an empty place is skipped."""
        count = self._call(
            "nvmlDeviceGetMaxMigDeviceCount",
            pynvml.nvmlDeviceGetMaxMigDeviceCount,
            handle,
            where=f" for GPU {index}",
        )
        devices = []
        for place in range(count):
            where = f" for MIG device {place} of GPU {index}"
            mig = self._call(
                "nvmlDeviceGetMigDeviceHandleByIndex",
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
                handle,
                place,
                where=where,
                absent=(pynvml.NVMLError_NotFound,),
            )
            if mig is not None:
                devices.append(self._mig_device(mig, where))
        return tuple(devices)

    def _mig_device(self, mig: Any, where: str) -> MigDevice:
        def query(symbol: str, fn: Callable[..., _T]) -> _T:
            return self._call(symbol, fn, mig, where=where)

        attributes = query("nvmlDeviceGetAttributes_v2", pynvml.nvmlDeviceGetAttributes_v2)
        return MigDevice(
            uuid=_text(query("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID)),
            gpu_instance_id=query("nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId),
            compute_instance_id=query(
                "nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId
            ),
            profile=_text(query("nvmlDeviceGetName", pynvml.nvmlDeviceGetName)).rpartition(" MIG ")[2],
            slices=attributes.gpuInstanceSliceCount,
            memory_total=query("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo).total,
            multiprocessor_count=attributes.multiprocessorCount,
        )

    def _call(
        self,
        symbol: str,
        fn: Callable[..., _T],
        *args: Any,
        where: str = "",
        absent: tuple[type[Exception], ...] = (),
    ) -> _T:
        """Run one pynvml call. The `absent` errors (an optional query) give None; any other NVML error
        becomes a GpuInventoryError naming the library and the NVML function."""
        try:
            return fn(*args)
        except absent:
            return None  # type: ignore[return-value]
        except pynvml.NVMLError as err:
            if isinstance(err, pynvml.NVMLError_FunctionNotFound):
                why = f"has no {symbol} (not an NVML library, or a driver older than vgpud supports)"
            else:
                why = f"{symbol} failed{where}: {_error_string(err)} (NVML error {err.value})"
            raise GpuInventoryError(f"NVML library {self.library} {why}") from err


class NvmlHealthSession:
    """One NVML session held open for the device-health watcher: an event set with every GPU's XID
    critical errors registered, and a per-GPU check. `open` and `close` take the session lock (NVML's
    init count is shared with the inventory's reads); `wait` and `check` run beside other sessions.
    Methods block; NVML failures other than a sick GPU raise GpuInventoryError."""

    def __init__(self, inventory: NvmlInventory) -> None:
        self._inventory = inventory
        self._events: Any = None
        self._initialized = False
        self._handles: dict[int, Any] = {}
        self._by_address: dict[int, int] = {}
        #: GPUs whose events are registered, or that cannot report XID events at all
        self._settled: set[int] = set()

    def open(self) -> dict[int, str]:
        """Init NVML and register every GPU's XID events; returns the GPUs that do not answer (NVML
        index -> why: lost, or needing a reset). They are registered once they answer a `check`."""
        call = self._inventory._call
        with _session:
            pynvml_compat.bind(self._inventory._lib)
            call("nvmlInitWithFlags", pynvml.nvmlInit)
            self._initialized = True
        try:
            count = call("nvmlDeviceGetCount_v2", pynvml.nvmlDeviceGetCount)
            self._events = call("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
            gone = {}
            for index in range(count):
                problem = self._register(index)
                if problem is not None:
                    gone[index] = problem
            return gone
        except BaseException:
            self.close()
            raise

    def wait(self, timeout_ms: int) -> XidEvent | GpusLost | None:
        """The next event within `timeout_ms`: an XID of a known GPU, a loss, or None (nothing)."""
        try:
            data = pynvml.nvmlEventSetWait_v2(self._events, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return None
        except pynvml.NVMLError_GpuIsLost:
            return GpusLost()
        except pynvml.NVMLError as err:
            raise self._failed("nvmlEventSetWait_v2", err) from err
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return None
        index = self._by_address.get(_address(data.device))
        if index is None:  # a handle of another address for a registered GPU: NVML names its index
            try:
                index = int(pynvml.nvmlDeviceGetIndex(data.device))
            except pynvml.NVMLError:
                index = None
        if index is None or index not in self._settled:
            log.warning("NVML reported XID %d of a GPU vgpud did not register: ignored", data.eventData)
            return None
        return XidEvent(index, int(data.eventData))

    def check(self, index: int) -> str | None:
        """None when the GPU answers NVML (registering its events if that had not been possible),
        else why it does not."""
        if index not in self._settled:
            problem = self._register(index)
            if problem is not None:
                return problem
        try:
            pynvml.nvmlDeviceGetMemoryInfo(self._handles[index])
        except _DEVICE_GONE as err:
            return _gone("nvmlDeviceGetMemoryInfo", err)
        except pynvml.NVMLError as err:
            raise self._failed(f"nvmlDeviceGetMemoryInfo on GPU {index}", err) from err
        return None

    def close(self) -> None:
        """Free the event set and end the session (idempotent; failures are logged)."""
        with _session:
            if self._events is not None:
                try:
                    pynvml.nvmlEventSetFree(self._events)
                except pynvml.NVMLError as err:
                    log.warning("nvmlEventSetFree through %s failed: %s", self._inventory.library, err)
                self._events = None
            if self._initialized:
                self._initialized = False
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError as err:
                    log.warning("nvmlShutdown through %s failed: %s", self._inventory.library, err)

    def _register(self, index: int) -> str | None:
        """Register GPU `index`'s XID events; why not when it does not answer (None when done)."""
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._handles[index] = handle
            self._by_address[_address(handle)] = index
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
            except pynvml.NVMLError_NotSupported:
                supported = 0
            if supported & pynvml.nvmlEventTypeXidCriticalError:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
            else:
                log.warning("GPU %d reports no XID events: only its NVML checks tell its health", index)
        except _DEVICE_GONE as err:
            return _gone(f"registering XID events of GPU {index}", err)
        except pynvml.NVMLError as err:
            raise self._failed(f"registering XID events of GPU {index}", err) from err
        self._settled.add(index)
        return None

    def _failed(self, what: str, err: pynvml.NVMLError) -> GpuInventoryError:
        return GpuInventoryError(f"NVML library {self._inventory.library}: {_gone(what + ' failed', err)}")


def _gone(what: str, err: pynvml.NVMLError) -> str:
    return f"{what}: {_error_string(err)} (NVML error {err.value})"


def _address(handle: Any) -> int:
    """An NVML device handle's address: how an event's device is matched to a GPU without asking
    NVML about a GPU that may be lost."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _error_string(err: pynvml.NVMLError) -> str:
    """The library's own words for an error (nvmlErrorString), else pynvml's."""
    try:
        return _text(pynvml.nvmlErrorString(err.value))
    except pynvml.NVMLError:
        return str(err)


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _named(names: dict[int, str], value: int, what: str, index: int) -> str:
    if value not in names:
        log.warning("GPU %d reports an unknown %s (%d): publishing 'Unknown'", index, what, value)
    return names.get(value, "Unknown")


def _addressing_mode_name(mode: int, index: int) -> str | None:
    if mode not in ADDRESSING_MODE_NAMES:
        log.warning("GPU %d reports an unknown addressing mode (%d): leaving it out", index, mode)
    return ADDRESSING_MODE_NAMES.get(mode)


def _sysfs_numa_node(pci_bus_id: str) -> int | None:
    try:
        node = int((SYSFS_PCI_DEVICES / pci_bus_id / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None
