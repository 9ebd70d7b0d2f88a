"""MIG in the GPU profiles: the fake NVML's MIG calls (through nvidia-ml-py, in this process), and
both backends reporting the same MIG mode and devices for one profile (vgpud.gpu.migtable)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pynvml
import pytest

from tests.fakegpu_state import set_lost
from tests.support import built
from tests.unit.test_gpu_mock import BASE
from tests.unit.test_gpu_nvml import nvml_gpus, serving
from vgpud.compat import pynvml as compat
from vgpud.gpu import GpuInfo, GpuInventoryError, open_inventory
from vgpud.gpu.migtable import MIG_PROFILES, MigProfile, mig_capable
from vgpud.gpu.mock import dump_profile, load_profile, shipped_profiles
from vgpud.gpu.model import MigDevice

MIG_PROFILE = shipped_profiles()["a100-40gb-x2-mig"]
PARENT = "GPU-5c1e0a37-8d2b-4f60-a1e9-3b7f2c94d018"
MIB = 1 << 20
ENABLED, DISABLED = pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE


def profile(gpu0: str = "", gpu1: str = "", **edits: tuple[str, str]) -> str:
    """BASE with `gpu0` / `gpu1` (key lines, each ending in a newline) added to that GPU, and each
    (old, new) edit of `edits` made once (keys: the edit's name, for readability only)."""
    text = BASE.replace("    numaNode: 0\n", "    numaNode: 0\n" + gpu0, 1)
    text = text.replace("    numaNode: 1\n", "    numaNode: 1\n" + gpu1, 1)
    for old, new in edits.values():
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


@contextmanager
def session(served: Path | str) -> Iterator[list[object]]:
    """An NVML session of the fake serving `served`, bound into pynvml here; yields the GPU handles."""
    with serving(served) as library:
        compat.bind(ctypes.CDLL(library))
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            yield [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        finally:
            pynvml.nvmlShutdown()


def code(fn: object, *args: object) -> int:
    """The NVML error a call returns, 0 on success."""
    try:
        fn(*args)  # type: ignore[operator]
    except pynvml.NVMLError as err:
        return int(err.value)
    return 0


def mig_uuid(gpu_instance: int) -> str:
    """The UUID of the MIG device with this GPU instance id of the MIG profile's GPU 0."""
    return f"MIG-5c1e0a37-8d2b-{gpu_instance:02x}00-a1e9-3b7f2c94d018"


def mig_handles(gpu: object) -> list[object]:
    handles = []
    for place in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        with suppress(pynvml.NVMLError_NotFound):
            handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, place))
    return handles


# --- the fake NVML ------------------------------------------------------------------------------------


def test_the_fake_serves_a_gpu_in_mig_mode_and_its_mig_devices() -> None:
    with session(MIG_PROFILE) as (mig_gpu, plain):
        assert pynvml.nvmlDeviceGetMigMode(mig_gpu) == [ENABLED, ENABLED]
        assert pynvml.nvmlDeviceGetMigMode(plain) == [DISABLED, DISABLED]
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(mig_gpu) == 7
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(plain) == 0
        migs = mig_handles(mig_gpu)
        rows = []
        for mig in migs:
            attributes = pynvml.nvmlDeviceGetAttributes_v2(mig)
            rows.append(
                (
                    pynvml.nvmlDeviceGetUUID(mig),
                    pynvml.nvmlDeviceGetName(mig).removeprefix("NVIDIA A100-SXM4-40GB MIG "),
                    pynvml.nvmlDeviceGetMemoryInfo(mig).total // MIB,
                    attributes.multiprocessorCount,
                    attributes.gpuInstanceSliceCount,
                    attributes.computeInstanceSliceCount,
                    attributes.memorySizeMB,
                    pynvml.nvmlDeviceGetGpuInstanceId(mig),
                    pynvml.nvmlDeviceGetComputeInstanceId(mig),
                )
            )
        # UUID, profile, memory MiB, SMs, GI and CI slices, memorySizeMB, GI id, CI id
        assert rows == [
            (mig_uuid(1), "3g.20gb", 20096, 42, 3, 3, 20096, 1, 0),
            (mig_uuid(2), "2g.10gb", 9984, 28, 2, 2, 9984, 2, 0),
            (mig_uuid(3), "1g.5gb", 4864, 14, 1, 1, 4864, 3, 0),
            (mig_uuid(4), "1g.5gb", 4864, 14, 1, 1, 4864, 4, 0),
        ]
        memory = pynvml.nvmlDeviceGetMemoryInfo(migs[0], version=pynvml.nvmlMemory_v2)
        assert (memory.total, memory.used, memory.free) == (20096 * MIB, 0, 20096 * MIB)
        for mig in migs:
            assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            assert pynvml.nvmlDeviceGetUUID(parent) == PARENT
        assert pynvml.nvmlDeviceIsMigDeviceHandle(mig_gpu).value == 0


def test_the_fake_answers_mig_calls_as_nvml_does_where_there_is_no_such_device() -> None:
    with session(MIG_PROFILE) as (mig_gpu, plain):
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 0)
        fn = pynvml  # short lines below
        assert code(fn.nvmlDeviceGetMigDeviceHandleByIndex, mig_gpu, 4) == pynvml.NVML_ERROR_NOT_FOUND
        assert code(fn.nvmlDeviceGetMigDeviceHandleByIndex, mig_gpu, 7) == pynvml.NVML_ERROR_INVALID_ARGUMENT
        assert code(fn.nvmlDeviceGetMigDeviceHandleByIndex, plain, 0) == pynvml.NVML_ERROR_INVALID_ARGUMENT
        # the instance calls on a GPU handle; the parent of a GPU
        for call in (
            fn.nvmlDeviceGetGpuInstanceId,
            fn.nvmlDeviceGetComputeInstanceId,
            fn.nvmlDeviceGetAttributes_v2,
        ):
            assert code(call, plain) == pynvml.NVML_ERROR_NOT_SUPPORTED
        assert (
            code(fn.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, plain) == pynvml.NVML_ERROR_INVALID_ARGUMENT
        )
        # a MIG handle is no GPU handle for the calls that take GPUs only
        for call in (fn.nvmlDeviceGetMinorNumber, fn.nvmlDeviceGetMigMode, fn.nvmlDeviceGetPciInfo_v3):
            assert code(call, mig) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_a_pending_mig_mode_is_reported_but_the_current_one_rules() -> None:
    text = profile("    migMode: enabled\n    migModePending: disabled\n", "    migModePending: enabled\n")
    with session(text) as (leaving, entering):
        assert pynvml.nvmlDeviceGetMigMode(leaving) == [ENABLED, DISABLED]
        assert pynvml.nvmlDeviceGetMigMode(entering) == [DISABLED, ENABLED]
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(leaving) == 7 and mig_handles(leaving) == []
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(entering) == 0
    assert [(g.mig_mode, g.mig_devices) for g in nvml_gpus(text)] == [(True, ()), (False, ())]
    assert nvml_gpus(text) == load_profile_text(text)


@pytest.mark.parametrize(
    ("product", "architecture"),
    [
        ("NVIDIA A100-SXM4-40GB", "Volta"),
        ("NVIDIA GeForce RTX 3090", "Ampere"),
        ("NVIDIA RTX A3000", "Ampere"),
    ],
)
def test_a_gpu_without_mig_answers_not_supported(product: str, architecture: str) -> None:
    text = profile(
        name=("productName: NVIDIA A100-SXM4-40GB\n", f"productName: {product}\n"),
        arch=("architecture: Ampere\n", f"architecture: {architecture}\n"),
    )
    with session(text) as (gpu, other):
        assert code(pynvml.nvmlDeviceGetMigMode, gpu) == pynvml.NVML_ERROR_NOT_SUPPORTED
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 0
        assert pynvml.nvmlDeviceGetMigMode(other) == [DISABLED, DISABLED]
    assert [g.mig_mode for g in nvml_gpus(text)] == [False, False]


def test_mig_handles_of_a_lost_gpu_answer_gpu_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "gpu.state"
    monkeypatch.setenv("FAKE_GPU_STATE", str(state))
    with session(MIG_PROFILE) as (mig_gpu, _plain):
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 1)
        set_lost(state, 0, True)
        try:
            for call in (
                pynvml.nvmlDeviceGetUUID,
                pynvml.nvmlDeviceGetGpuInstanceId,
                pynvml.nvmlDeviceGetMemoryInfo,
            ):
                assert code(call, mig) == pynvml.NVML_ERROR_GPU_IS_LOST
        finally:
            set_lost(state, 0, False)
        assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == 2


def test_the_fake_nvidia_smi_shows_mig_mode_and_devices() -> None:
    smi = built("fakenvml/nvidia-smi")
    env = {**os.environ, "LD_LIBRARY_PATH": str(smi.parent), "FAKE_NVML_PROFILE": str(MIG_PROFILE)}
    table = subprocess.run([str(smi)], env=env, capture_output=True, text=True, timeout=30, check=True)
    listed = subprocess.run([str(smi), "-L"], env=env, capture_output=True, text=True, timeout=30, check=True)
    rows = table.stdout.splitlines()
    assert rows[1].split()[-2:] == ["MIG", "M."]
    assert [row.split()[-1] for row in rows[2:]] == ["Enabled", "Disabled"]
    lines = listed.stdout.splitlines()
    assert lines[0] == f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {PARENT})"
    assert [line.split() for line in lines[1:5]] == [
        ["MIG", name, "Device", f"{n}:", "(UUID:", f"{mig_uuid(n + 1)})"]
        for n, name in enumerate(["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"])
    ]
    assert lines[5].startswith("GPU 1: ") and len(lines) == 6


# --- both backends --------------------------------------------------------------------------------------


def load_profile_text(text: str) -> list[GpuInfo]:
    """The mock backend's GPUs of a profile's text."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.yaml"
        path.write_text(text)
        return load_profile(path)


def test_both_backends_report_the_mig_profile_alike() -> None:
    mock = open_inventory("mock", profile=MIG_PROFILE).gpus()
    assert nvml_gpus(MIG_PROFILE) == mock
    mig_gpu, plain = mock
    assert (mig_gpu.mig_mode, plain.mig_mode, plain.mig_devices) == (True, False, ())
    assert mig_gpu.mig_devices[0] == MigDevice(
        uuid=mig_uuid(1),
        gpu_instance_id=1,
        compute_instance_id=0,
        profile="3g.20gb",
        slices=3,
        memory_total=20096 * MIB,
        multiprocessor_count=42,
    )
    assert [(m.profile, m.gpu_instance_id, m.slices) for m in mig_gpu.mig_devices] == [
        ("3g.20gb", 1, 3),
        ("2g.10gb", 2, 2),
        ("1g.5gb", 3, 1),
        ("1g.5gb", 4, 1),
    ]
    assert mig_gpu.to_dict()["mig_devices"][3]["uuid"] == "MIG-5c1e0a37-8d2b-0400-a1e9-3b7f2c94d018"
    assert json.loads(json.dumps(mig_gpu.to_dict())) == mig_gpu.to_dict()


def table_gpu(entry: MigProfile, architecture: str) -> str:
    """A profile whose GPU 0 has one MIG device of `entry`, on a GPU of `architecture`."""
    product = {
        "Ampere": "NVIDIA A100-SXM4-40GB",
        "Hopper": "NVIDIA H100 80GB HBM3",
        "Blackwell": "NVIDIA B200",
    }
    return profile(
        f"    migMode: enabled\n    migDevices: {entry.name}\n",
        name=("productName: NVIDIA A100-SXM4-40GB\n", f"productName: {product[architecture]}\n"),
        arch=("architecture: Ampere\n", f"architecture: {architecture}\n"),
    )


@pytest.mark.parametrize(
    ("entry", "architecture"),
    [(e, e.table) for e in MIG_PROFILES] + [(e, "Blackwell") for e in MIG_PROFILES if e.table == "Hopper"],
    ids=lambda v: v.name if isinstance(v, MigProfile) else v,
)
def test_the_c_table_is_the_python_table(entry: MigProfile, architecture: str) -> None:
    """Every MIG profile: the same memory, SMs and slices from the fake as from the mock's table."""
    text = table_gpu(entry, architecture)
    (device,) = nvml_gpus(text)[0].mig_devices
    assert (device.profile, device.slices, device.memory_total, device.multiprocessor_count) == (
        entry.name,
        entry.slices,
        entry.memory_mib * MIB,
        entry.multiprocessor_count,
    )
    assert nvml_gpus(text) == load_profile_text(text)


def test_a_mig_profile_dumps_and_loads_back(tmp_path: Path) -> None:
    gpus = load_profile(MIG_PROFILE)
    path = tmp_path / "dumped.yaml"
    path.write_text(dump_profile(gpus))
    assert load_profile(path) == gpus
    assert nvml_gpus(path) == gpus


def test_the_mig_rule_reads_words_of_the_product_name() -> None:
    assert mig_capable("NVIDIA A100-SXM4-40GB", "Ampere") and mig_capable("NVIDIA A30", "Ampere")
    assert mig_capable("NVIDIA H100 80GB HBM3", "Hopper") and mig_capable("NVIDIA H200", "Hopper")
    assert mig_capable("NVIDIA B200", "Blackwell")
    assert not mig_capable("NVIDIA A100-SXM4-40GB", "Volta")  # the architecture counts too
    assert not mig_capable("NVIDIA RTX A3000", "Ampere")  # "A3000" is not "A30"
    assert not mig_capable("NVIDIA GeForce RTX 4090", "Ada Lovelace")


def test_a_failing_mig_query_names_the_mig_device(monkeypatch: pytest.MonkeyPatch) -> None:
    def lost(handle: object) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuInstanceId", lost)
    with serving(MIG_PROFILE) as library, pytest.raises(GpuInventoryError) as caught:
        open_inventory("nvml", nvml_library=library).gpus()
    assert str(caught.value) == (
        f"NVML library {library} nvmlDeviceGetGpuInstanceId failed for MIG device 0 of GPU 0: GPU is lost "
        "(NVML error 15)"
    )


def test_a_driver_without_mig_queries_reads_as_no_mig(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(handle: object) -> list[int]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigMode", absent)
    assert [(g.mig_mode, g.mig_devices) for g in nvml_gpus(MIG_PROFILE)] == [(False, ()), (False, ())]
