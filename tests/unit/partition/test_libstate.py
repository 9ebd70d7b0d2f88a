"""The library's files in a partition directory on the host: cleared at a container's (re)start and
read for the observability, with files written by the Python builder and by the C structs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from tests.support import built
from vgpud.partition import libfiles as F
from vgpud.partition.layout import PartitionPaths
from vgpud.partition.libstate import DeviceUsage, clear_library_state, read_partition_usage

GIB = 1 << 30
UUID = "GPU-8d2f0d3a-5c41-4b0e-9d2a-0123456789ab"


@pytest.fixture
def paths(tmp_path: Path) -> PartitionPaths:
    p = PartitionPaths(PurePosixPath(tmp_path / "part"))
    for directory in p.directories:
        Path(directory).mkdir(parents=True, exist_ok=True)
    return p


def _config(*active: tuple[int, F.DeviceLimits]) -> bytes:
    devices = [F.DeviceLimits()] * 16
    for index, limits in active:
        devices[index] = limits
    return F.build_vgpu_config(F.VgpuConfig(devices=tuple(devices), pod_uid="p", vmem_node=True))


def test_clear_deletes_the_ledger_and_bucket_and_keeps_the_lock(paths: PartitionPaths) -> None:
    ledger = Path(paths.vmem_node) / F.VMEM_NODE_FILE
    bucket = Path(paths.sm_node) / F.SM_NODE_FILE
    lock = Path(paths.sm_node) / F.SM_NODE_LOCK_FILE
    for path in (ledger, bucket, lock):
        path.write_bytes(b"x")
    assert clear_library_state(paths) == [ledger, bucket]
    assert not ledger.exists() and not bucket.exists() and lock.exists()
    assert clear_library_state(paths) == []  # nothing there: nothing to do


def test_an_empty_directory_has_no_devices_and_no_errors(paths: PartitionPaths) -> None:
    usage = read_partition_usage(paths)
    assert usage.devices == () and usage.errors == ()
    assert (usage.has_config, usage.has_ledger, usage.has_bucket) == (False, False, False)


def test_limits_ledger_and_bucket_from_python_built_files(paths: PartitionPaths) -> None:
    limits = F.DeviceLimits(
        uuid=UUID, total_memory=4 * GIB, hard_core=30, core_limit=True, memory_limit=True, activate=True
    )
    (Path(paths.config) / F.VGPU_CONFIG_FILE).write_bytes(_config((2, limits)))
    ledger = {
        2: [F.LedgerEntry(10, GIB), F.LedgerEntry(0, 5), F.LedgerEntry(11, 7)],
        5: [F.LedgerEntry(9, 1)],
    }
    (Path(paths.vmem_node) / F.VMEM_NODE_FILE).write_bytes(F.build_vmem_node(ledger))
    buckets = [F.Bucket()] * 16
    buckets[2] = F.Bucket(util=287, active=True)
    (Path(paths.sm_node) / F.SM_NODE_FILE).write_bytes(F.build_sm_node(F.SmNode(tuple(buckets))))
    usage = read_partition_usage(paths)
    assert usage.errors == ()
    # device 5 is not the container's (vgpu.config does not activate it): not shown
    assert usage.devices == (
        DeviceUsage(
            2,
            uuid=UUID,
            memory_limit=4 * GIB,
            memory_limited=True,
            core_limit=30,
            core_limited=True,
            ledger_bytes=GIB + 7,
            ledger_processes=2,
            sm_util_permille=287,
        ),
    )
    assert usage.to_dict()["devices"] == {
        "2": {
            "uuid": UUID,
            "memory_limit_bytes": 4 * GIB,
            "core_limit_percent": 30,
            "ledger_bytes": GIB + 7,
            "ledger_processes": 2,
            "sm_utilization_permille": 287,
        }
    }


@pytest.mark.needs_build
def test_files_the_c_structs_wrote(paths: PartitionPaths, tmp_path: Path) -> None:
    out = tmp_path / "c"
    out.mkdir()
    subprocess.run([str(built("libvgpu/tests/files_layout")), "--write", str(out)], check=True, timeout=30)
    shutil.copy(out / F.VGPU_CONFIG_FILE, Path(paths.config))
    shutil.copy(out / F.VMEM_NODE_FILE, Path(paths.vmem_node))
    shutil.copy(out / F.SM_NODE_FILE, Path(paths.sm_node))
    usage = read_partition_usage(paths)
    assert usage.errors == ()
    (device,) = usage.devices
    assert (device.index, device.uuid, device.memory_limit, device.core_limit) == (3, UUID, 4 * GIB, 30)
    assert (device.ledger_bytes, device.ledger_processes, device.sm_util_permille) == (
        (1 << 20) + 3 * GIB + 7,
        2,
        295,
    )


def test_without_vgpu_config_the_ledger_still_shows(paths: PartitionPaths) -> None:
    (Path(paths.vmem_node) / F.VMEM_NODE_FILE).write_bytes(F.build_vmem_node({7: [F.LedgerEntry(3, 99)]}))
    usage = read_partition_usage(paths)
    assert usage.devices == (DeviceUsage(7, ledger_bytes=99, ledger_processes=1),)
    assert usage.has_ledger and not usage.has_config


def test_bad_files_are_error_lines_and_the_rest_is_still_read(paths: PartitionPaths, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(F.build_vgpu_config(F.VgpuConfig()))
    (Path(paths.config) / F.VGPU_CONFIG_FILE).symlink_to(secret)
    os.mkfifo(Path(paths.sm_node) / F.SM_NODE_FILE)  # opening it for reading must not block
    (Path(paths.vmem_node) / F.VMEM_NODE_FILE).write_bytes(F.build_vmem_node({1: [F.LedgerEntry(3, 5)]}))
    usage = read_partition_usage(paths)
    assert usage.errors == (
        "vgpu.config: a symbolic link (not followed)",
        "sm_node.config: not a regular file",
    )
    assert usage.devices == (DeviceUsage(1, ledger_bytes=5, ledger_processes=1),)


def test_a_truncated_or_foreign_file_is_an_error_line(paths: PartitionPaths) -> None:
    (Path(paths.vmem_node) / F.VMEM_NODE_FILE).write_bytes(F.build_vmem_node({})[:1000])
    (Path(paths.sm_node) / F.SM_NODE_FILE).write_bytes(F.build_vgpu_config(F.VgpuConfig()))
    usage = read_partition_usage(paths)
    assert len(usage.errors) == 2
    assert usage.errors[0].startswith("vmem_node.config: ") and "file too short" in usage.errors[0]
    assert usage.errors[1].startswith("sm_node.config: header magic/layout/size 0x56474346/1/2560")


def test_a_ledger_whose_lock_stays_taken_is_reported_not_waited_for(paths: PartitionPaths) -> None:
    """The library updates a device's entries under a write lock of its lock byte; the reader takes
    a read lock, so a holder that never lets go costs the reader its budget, not a hang."""
    ledger = Path(paths.vmem_node) / F.VMEM_NODE_FILE
    ledger.write_bytes(F.build_vmem_node({0: [F.LedgerEntry(3, 5)], 1: [F.LedgerEntry(4, 6)]}))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.lockf(fd, fcntl.LOCK_EX, 1, int(sys.argv[2])); "
            "print('held', flush=True); sys.stdin.read()",
            str(ledger),
            str(F.vmem_lock_offset(1)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        usage = read_partition_usage(paths)
    finally:
        holder.communicate("", timeout=30)
    assert usage.errors == ("vmem_node.config: device 1's ledger stayed locked; not read",)
    assert usage.devices == (DeviceUsage(0, ledger_bytes=5, ledger_processes=1),)
    assert read_partition_usage(paths).devices[1] == DeviceUsage(1, ledger_bytes=6, ledger_processes=1)
