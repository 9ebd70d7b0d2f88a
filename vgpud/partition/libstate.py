"""The library's files in a partition directory on the host: cleared when a container starts afresh,
read (never written) for the observability. Blocking: call from a worker thread.

The directories are bind-mounted writable into the container, so every name in them is under the
workload's control: nothing here follows a symlink, opens a FIFO or device, or maps a file (a
workload that truncates a mapped file would crash vgpud with SIGBUS); files are read with pread into
buffers and parsed by the pure `libfiles`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from vgpud.fsutil import remove_tree
from vgpud.partition import libfiles as F
from vgpud.partition.layout import PartitionPaths

#: the library holds a device's ledger lock for a few microseconds per update
LEDGER_LOCK_BUDGET = 0.05
LEDGER_LOCK_POLL = 0.001
#: pids.config lists the processes of one container: far below this
PIDS_READ_LIMIT = 1 << 20

T = TypeVar("T")


# --------------------------------------------------------------------------------------------------
# Clearing


def library_state_files(paths: PartitionPaths) -> tuple[Path, Path]:
    """vmem_node.config and sm_node.config of a partition (sm_node.lock is not one of them)."""
    return Path(paths.vmem_node) / F.VMEM_NODE_FILE, Path(paths.sm_node) / F.SM_NODE_FILE


def clear_library_state(paths: PartitionPaths) -> list[Path]:
    """Delete the ledger and the shared bucket so a new container instance starts from zero (what
    the reference's node side does at container create); return what was removed. sm_node.lock stays:
    a live sampler may hold it. Whatever a workload left under those names goes, never followed."""
    removed = []
    for path in library_state_files(paths):
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            remove_tree(path)
        removed.append(path)
    return removed


# --------------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class DeviceUsage:
    """One device of a partition, as its files describe it."""

    index: int
    uuid: str = ""
    #: vgpu.config: the memory limit in bytes, and whether it is enforced
    memory_limit: int = 0
    memory_limited: bool = False
    #: vgpu.config: the hard core limit in percent, and whether it is enforced
    core_limit: int = 0
    core_limited: bool = False
    #: vmem_node.config: bytes the ledger charges (memory NVML does not report), live entries
    ledger_bytes: int = 0
    ledger_processes: int = 0
    #: sm_node.config: the container's SM utilization at the last sample, per-mille (None: no bucket,
    #: or no sample yet: the sampler writes -1)
    sm_util_permille: int | None = None
    #: NVML's device memory of the container's registered PIDs (pids.config); None when unknown (no
    #: registered PID, or no process memory to match them against)
    nvml_bytes: int | None = None

    @property
    def used_bytes(self) -> int | None:
        """The library's own usage formula: NVML's per-process memory plus the ledger."""
        return None if self.nvml_bytes is None else self.nvml_bytes + self.ledger_bytes


@dataclass(frozen=True)
class PartitionUsage:
    """What the library's files of one partition (or NRI container) directory say."""

    directory: str
    devices: tuple[DeviceUsage, ...] = ()
    #: host PIDs registered in pids.config (empty: none, or the file is absent)
    pids: frozenset[int] = frozenset()
    #: which files were present and valid
    has_config: bool = False
    has_ledger: bool = False
    has_bucket: bool = False
    #: one line per file that was there but could not be read or parsed
    errors: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        return {
            "directory": self.directory,
            "files": {
                "vgpu_config": self.has_config,
                "vmem_node": self.has_ledger,
                "sm_node": self.has_bucket,
            },
            "devices": {
                str(d.index): {
                    "uuid": d.uuid,
                    "memory_limit_bytes": d.memory_limit if d.memory_limited else None,
                    "core_limit_percent": d.core_limit if d.core_limited else None,
                    "ledger_bytes": d.ledger_bytes,
                    "ledger_processes": d.ledger_processes,
                    "sm_utilization_permille": d.sm_util_permille,
                    "nvml_bytes": d.nvml_bytes,
                    "used_bytes": d.used_bytes,
                }
                for d in self.devices
            },
            "errors": list(self.errors),
        }


class _Absent(Exception):
    """The file is not there (a container whose library has not written it yet)."""


def _open(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _Absent from None
    except OSError as err:
        reason = "a symbolic link (not followed)" if err.errno == errno.ELOOP else err.strerror
        raise OSError(err.errno, reason) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd


def _pread_into(fd: int, buf: bytearray, offset: int, length: int, name: str) -> None:
    view = memoryview(buf)[offset : offset + length]
    got = os.preadv(fd, [view], offset)
    if got != length:
        raise F.LibFileError(f"{name}: {got} bytes at offset {offset}, expected {length} (file too short)")


def _read_struct(path: Path, size: int) -> bytes:
    fd = _open(path)
    try:
        buf = bytearray(size)
        _pread_into(fd, buf, 0, size, path.name)
        return bytes(buf)
    finally:
        os.close(fd)


def _lock_shared(fd: int, offset: int) -> bool:
    """A read lock on one byte (the ledger's per-device lock), within the budget; False if busy."""
    deadline = time.monotonic() + LEDGER_LOCK_BUDGET
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, offset)
            return True
        except (BlockingIOError, PermissionError):
            if time.monotonic() >= deadline:
                return False
            time.sleep(LEDGER_LOCK_POLL)


def _read_ledger(path: Path, devices: list[int], errors: list[str]) -> dict[int, tuple[F.LedgerEntry, ...]]:
    """The live entries of `devices`, each read under a read lock of its lock byte (the library
    writes under a write lock of it); a device whose lock stays taken is an error line, not read."""
    fd = _open(path)
    try:
        buf = bytearray(F.VMEM_STRUCT_SIZE)
        _pread_into(fd, buf, 0, F.VMEM_DEVICES_OFFSET, path.name)
        F.check_vmem_header(buf)
        entries = {}
        for index in devices:
            offset = F.vmem_device_offset(index)
            if not _lock_shared(fd, F.vmem_lock_offset(index)):
                errors.append(f"{path.name}: device {index}'s ledger stayed locked; not read")
                continue
            try:
                _pread_into(fd, buf, offset, F.VMEM_DEVICE_STRIDE, path.name)
            finally:
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, F.vmem_lock_offset(index))
            entries[index] = F.parse_vmem_device(buf, index)
        return entries
    finally:
        os.close(fd)


def read_partition_usage(
    paths: PartitionPaths,
    process_memory: Mapping[int, Mapping[int, int]] | None = None,
    pids: frozenset[int] | None = None,
) -> PartitionUsage:
    """Parse vgpu.config (limits), vmem_node.config (ledger), sm_node.config (bucket) and pids.config
    of one partition directory. A missing file is normal (no library process ran yet); a bad one is
    an error line, and the other files are still read. `process_memory` (GPU index -> {host PID:
    bytes}, from NVML) gives each device the memory of the PIDs pids.config registers, or of `pids`
    when given (cgroup mode: the container's cgroup; pids.config is then not read)."""
    errors: list[str] = []
    config_path = Path(paths.config) / F.VGPU_CONFIG_FILE
    config = _attempt(
        config_path, lambda: F.parse_vgpu_config(_read_struct(config_path, F.CONFIG_STRUCT_SIZE)), errors
    )
    indexes = sorted(config.active()) if config is not None else list(range(F.MAX_DEVICES))
    ledger_path = Path(paths.vmem_node) / F.VMEM_NODE_FILE
    ledger = _attempt(ledger_path, lambda: _read_ledger(ledger_path, indexes, errors), errors)
    bucket_path = Path(paths.sm_node) / F.SM_NODE_FILE
    bucket = _attempt(
        bucket_path, lambda: F.parse_sm_node(_read_struct(bucket_path, F.SM_STRUCT_SIZE)), errors
    )
    if pids is None:
        pids_path = Path(paths.pids_file)
        pids = _attempt(pids_path, lambda: _read_pids(pids_path), errors) or frozenset()
    nvml: dict[int, int] | None = None
    if process_memory is not None and pids:
        nvml = {i: sum(b for pid, b in used.items() if pid in pids) for i, used in process_memory.items()}
    return PartitionUsage(
        str(paths.base),
        _devices(indexes, config, ledger or {}, bucket, nvml),
        pids=pids,
        has_config=config is not None,
        has_ledger=ledger is not None,
        has_bucket=bucket is not None,
        errors=tuple(errors),
    )


def _read_pids(path: Path) -> frozenset[int]:
    """pids.config: one decimal host PID per line (vgpud's registry writes it)."""
    fd = _open(path)
    try:
        data = os.pread(fd, PIDS_READ_LIMIT + 1, 0)
    finally:
        os.close(fd)
    if len(data) > PIDS_READ_LIMIT:
        raise F.LibFileError(f"{path.name}: larger than {PIDS_READ_LIMIT} bytes")
    try:
        return frozenset(int(line) for line in data.decode("ascii").split())
    except (UnicodeDecodeError, ValueError):
        raise F.LibFileError(f"{path.name}: not one decimal PID per line") from None


def _attempt(path: Path, read: Callable[[], T], errors: list[str]) -> T | None:
    """`read()`, or None: silently when the file is absent, with an error line when it is bad."""
    try:
        return read()
    except _Absent:
        return None
    except F.LibFileError as err:
        errors.append(str(err))
    except OSError as err:
        errors.append(f"{path.name}: {err.strerror or err}")
    return None


def _devices(
    indexes: list[int],
    config: F.VgpuConfig | None,
    ledger: dict[int, tuple[F.LedgerEntry, ...]],
    bucket: F.SmNode | None,
    nvml: dict[int, int] | None,
) -> tuple[DeviceUsage, ...]:
    """One row per device vgpu.config activates; without it, per device the ledger, bucket or the
    registered PIDs use; with it, also a device the PIDs use that it does not list."""
    out = []
    for index in sorted(set(indexes) | {i for i, b in (nvml or {}).items() if b and 0 <= i < F.MAX_DEVICES}):
        entries = [e for e in ledger.get(index, ()) if e.pid > 0]
        sm = bucket.devices[index] if bucket is not None and bucket.devices[index].active else None
        nvml_bytes = None if nvml is None else nvml.get(index, 0)
        if config is None and not entries and sm is None and not nvml_bytes:
            continue
        limits = config.devices[index] if config is not None else F.DeviceLimits()
        out.append(
            DeviceUsage(
                index,
                uuid=limits.uuid,
                memory_limit=limits.total_memory,
                memory_limited=limits.memory_limit,
                core_limit=limits.hard_core,
                core_limited=limits.core_limit,
                ledger_bytes=sum(e.used for e in entries),
                ledger_processes=len(entries),
                sm_util_permille=sm.util if sm is not None and sm.util >= 0 else None,
                nvml_bytes=nvml_bytes,
            )
        )
    return tuple(out)
