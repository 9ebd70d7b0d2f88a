"""The library's file layouts: vgpud's Python side (vgpud.partition.libfiles) against the C side
(csrc/libvgpu/src/vgpu_files.h, through build/libvgpu/tests/files_layout): every struct size, field
offset and size, constant and path agree, and files written by one side read back on the other."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import built
from vgpud.partition import libfiles as F

GIB = 1 << 30
UUID = "GPU-8d2f0d3a-5c41-4b0e-9d2a-0123456789ab"


def _printer(*args: str) -> str:
    done = subprocess.run(
        [str(built("libvgpu/tests/files_layout")), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def c_layout() -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(_printer())
    return parsed


@pytest.mark.needs_build
def test_every_struct_field_offset_and_size_agree(c_layout: dict[str, Any]) -> None:
    c_structs = c_layout["structs"]
    assert set(c_structs) == set(F.STRUCTS)
    for c_name, layout in F.STRUCTS.items():
        assert c_structs[c_name]["size"] == layout.size, c_name
        python = {f.name: [f.offset, f.size] for f in layout.fields}
        assert c_structs[c_name]["fields"] == python, c_name


@pytest.mark.needs_build
def test_constants_and_container_paths_agree(c_layout: dict[str, Any]) -> None:
    assert c_layout["constants"] == dict(F.CONSTANTS)
    assert c_layout["paths"] == {
        "config": str(F.CONT_VGPU_CONFIG),
        "vmem_node": str(F.CONT_VMEM_NODE_CONFIG),
        "sm_node": str(F.CONT_SM_NODE_CONFIG),
        "sm_node_lock": str(F.CONT_SM_NODE_LOCK),
        "vgpu_lock_fmt": F.CONT_VGPU_LOCK_FORMAT.replace("{index}", "%d"),
    }


def test_the_reference_offsets_hold() -> None:
    """Spot checks against reference/libvgpu.md §4, independent of both tables."""
    assert F.CONFIG["devices"].offset == 512 and F.CONFIG["vmem_node"].offset == 424
    assert F.CONFIG_DEVICE["activate"].offset == 96 and F.CONFIG_DEVICE["total_memory"].offset == 56
    assert F.VMEM_DEVICE_STRIDE == F.VMEM_MAX_PROCESSES * F.VMEM_ENTRY_SIZE + 8
    assert F.VMEM_STRUCT_SIZE == 128 + 16 * F.VMEM_DEVICE_STRIDE
    assert F.vmem_lock_offset(1) == 128 + 16392 + 16388
    assert F.SM_MAGIC.to_bytes(4, "little") == b"SMND"


@pytest.mark.needs_build
def test_files_the_c_side_writes_parse_in_python(tmp_path: Path) -> None:
    _printer("--write", str(tmp_path))
    config = F.parse_vgpu_config((tmp_path / F.VGPU_CONFIG_FILE).read_bytes())
    assert config.cuda_version == (12, 8)
    assert (config.driver_version, config.pod_uid) == ("570.86.15", "0f6c7d9e-1111-2222-3333-444455556666")
    assert (config.pod_name, config.pod_namespace, config.container_name) == ("trainer", "team-a", "main")
    assert config.reg_uuid == "r" * 48  # a full field has no NUL
    assert (config.compatibility_mode, config.sm_watcher, config.vmem_node) == (102, False, True)
    assert config.active() == {
        3: F.DeviceLimits(
            uuid=UUID,
            total_memory=4 * GIB,
            real_memory=2 * GIB,
            hard_core=30,
            soft_core=60,
            core_limit=True,
            hard_limit=False,
            memory_limit=True,
            memory_oversold=True,
            activate=True,
            seq=2,
        )
    }
    vmem = F.parse_vmem_node((tmp_path / F.VMEM_NODE_FILE).read_bytes())
    assert vmem.devices[3] == (F.LedgerEntry(4242, 1 << 20), F.LedgerEntry(4343, 3 * GIB + 7))
    assert vmem.used(3) == (1 << 20) + 3 * GIB + 7
    assert len(vmem.devices[15]) == 1024 and vmem.devices[15][-1] == F.LedgerEntry(2**31 - 1, 2**64 - 1)
    assert vmem.used(15) == 2**64 - 1  # free slots (pid 0) count nothing
    assert all(vmem.devices[i] == () for i in range(16) if i not in (3, 15))
    sm = F.parse_sm_node((tmp_path / F.SM_NODE_FILE).read_bytes())
    assert (sm.sampler_pid, sm.sampler_heartbeat_ns) == (4242, 123456789012345)
    assert sm.devices[3] == F.Bucket(-1234567, 987654321, 8650752, 40000, 987000000, 295, 30, 30, 60, True)
    assert not any(b.active for i, b in enumerate(sm.devices) if i != 3)


@pytest.mark.needs_build
def test_files_python_builds_read_the_same_in_c(tmp_path: Path) -> None:
    devices = [F.DeviceLimits()] * 16
    devices[0] = F.DeviceLimits(uuid=UUID, total_memory=GIB, real_memory=GIB, hard_core=20, activate=True)
    devices[9] = F.DeviceLimits(
        uuid="GPU-x", total_memory=2**64 - 1, soft_core=99, hard_limit=True, activate=True
    )
    config = F.VgpuConfig(
        devices=tuple(devices),
        cuda_version=(13, 0),
        driver_version="580.1",
        pod_uid="u" * 48,
        pod_name="p",
        pod_namespace="n",
        container_name="c" * 64,
        reg_uuid="",
        compatibility_mode=236,
        sm_watcher=True,
    )
    (tmp_path / F.VGPU_CONFIG_FILE).write_bytes(F.build_vgpu_config(config))
    ledger = {
        0: [F.LedgerEntry(7, 5), F.LedgerEntry(0, 0), F.LedgerEntry(9, 2**40)],
        15: [F.LedgerEntry(1, 1)],
    }
    (tmp_path / F.VMEM_NODE_FILE).write_bytes(F.build_vmem_node(ledger))
    buckets = [F.Bucket()] * 16
    buckets[5] = F.Bucket(
        tokens=-(2**63), last_refill_ns=2**64 - 1, ceiling=2**63 - 1, util=1000, active=True
    )
    (tmp_path / F.SM_NODE_FILE).write_bytes(F.build_sm_node(F.SmNode(tuple(buckets), 77, 88)))

    seen = json.loads(_printer("--read", str(tmp_path)))
    assert seen["config"] == {
        "header": [F.CONFIG_MAGIC, 1, 2560, 16],
        "cuda": [13, 0],
        "driver": "580.1",
        "pod_uid": "u" * 48,
        "pod_name": "p",
        "pod_namespace": "n",
        "container_name": "c" * 64,
        "reg_uuid": "",
        "flags": [236, 1, 0],
        "devices": {
            "0": [0, UUID, GIB, GIB, 20, 0, 0, 0, 0, 0, 1],
            "9": [0, "GPU-x", 2**64 - 1, 0, 0, 99, 0, 1, 0, 0, 1],
        },
    }
    assert seen["vmem"] == {
        "header": [F.VMEM_MAGIC, 1, 262400, 16],
        "devices": {"0": [[7, 5], [0, 0], [9, 2**40]], "15": [[1, 1]]},
    }
    assert seen["sm"] == {
        "header": [F.SM_MAGIC, 3, 2176, 16],
        "sampler": [77, 88],
        "devices": {"5": [-(2**63), 2**64 - 1, 2**63 - 1, 0, 0, 1000, 0, 0, 0, 1]},
    }
    assert (tmp_path / F.VGPU_CONFIG_FILE).stat().st_size == 8192
    assert (tmp_path / F.VMEM_NODE_FILE).stat().st_size == 320 * 1024
    assert (tmp_path / F.SM_NODE_FILE).stat().st_size == 8192


# --------------------------------------------------------------------------------------------------
# The Python codec alone


def test_round_trips_and_sizes() -> None:
    config = F.VgpuConfig(pod_uid="x", vmem_node=True)
    data = F.build_vgpu_config(config)
    assert len(data) == F.CONFIG_FILE_SIZE and F.parse_vgpu_config(data) == config
    assert F.parse_vgpu_config(data[: F.CONFIG_STRUCT_SIZE]) == config  # the struct alone is enough
    empty = F.build_vmem_node({})
    assert len(empty) == F.VMEM_FILE_SIZE and F.parse_vmem_node(empty) == F.VmemNode()
    node = F.SmNode(sampler_pid=3)
    assert F.parse_sm_node(F.build_sm_node(node)) == node


def test_an_mmap_of_the_file_parses_like_its_bytes(tmp_path: Path) -> None:
    import mmap

    path = tmp_path / F.VMEM_NODE_FILE
    path.write_bytes(F.build_vmem_node({2: [F.LedgerEntry(10, 1 << 30)]}))
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as view:
        F.check_vmem_header(view)
        assert F.parse_vmem_device(view, 2) == (F.LedgerEntry(10, 1 << 30),)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:100], "shorter than its 2560-byte layout"),
        (lambda b: b"\0\0\0\0" + b[4:], "header magic/layout/size 0x0/1/2560"),
        (lambda b: b[:4] + (2).to_bytes(4, "little") + b[8:], "expected 0x56474346/1/2560"),
        (lambda b: b[:12] + (8).to_bytes(4, "little") + b[16:], "device count 8, expected 16"),
    ],
)
def test_a_bad_vgpu_config_is_refused_with_the_reason(mutate: Any, message: str) -> None:
    with pytest.raises(F.LibFileError, match=message):
        F.parse_vgpu_config(mutate(F.build_vgpu_config(F.VgpuConfig())))


def test_a_bad_ledger_is_refused() -> None:
    data = bytearray(F.build_vmem_node({}))
    data[F.vmem_device_offset(4) + F.VMEM_PROCESSES_SIZE_AT] = 0xFF
    data[F.vmem_device_offset(4) + F.VMEM_PROCESSES_SIZE_AT + 1] = 0x04  # 1279 > 1024
    with pytest.raises(F.LibFileError, match="device 4 has processes_size 1279 > 1024"):
        F.parse_vmem_node(bytes(data))
    with pytest.raises(F.LibFileError, match="header"):
        F.parse_sm_node(F.build_vgpu_config(F.VgpuConfig()))  # another file's header
    with pytest.raises(ValueError, match=r"outside 0\.\.15"):
        F.vmem_device_offset(16)


def test_values_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError, match=r"pod_uid: .* is longer than 48 bytes"):
        F.build_vgpu_config(F.VgpuConfig(pod_uid="u" * 49))
    with pytest.raises(ValueError, match="total_memory: -1 does not fit"):
        F.build_vgpu_config(F.VgpuConfig(devices=(F.DeviceLimits(total_memory=-1),) * 16))
    with pytest.raises(ValueError, match="exactly 16 devices"):
        F.build_vgpu_config(F.VgpuConfig(devices=()))
    with pytest.raises(ValueError, match="1025 entries, at most 1024"):
        F.build_vmem_node({0: [F.LedgerEntry(1, 1)] * 1025})
    with pytest.raises(ValueError, match=r"tokens: .* does not fit"):
        F.build_sm_node(F.SmNode(devices=(F.Bucket(tokens=2**63),) * 16))
