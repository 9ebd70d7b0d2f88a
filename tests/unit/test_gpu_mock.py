"""The GPU model, the profile subset and the mock backend (no C, no NVML)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpud.gpu import GpuInfo, GpuInventoryError, open_inventory
from vgpud.gpu.mock import PROFILES_DIR, dump_profile, load_profile, shipped_profiles
from vgpud.gpu.model import (
    ADDRESSING_MODE_NAMES,
    ARCHITECTURE_NAMES,
    BRAND_NAMES,
    cuda_version_string,
    normalize_pci_bus_id,
)

# A valid two-GPU profile; line numbers matter to the cases below (line 4 starts gpus[0], 14 gpus[1]).
BASE = """\
driverVersion: 550.54.15
cudaDriverVersion: "12.4"
gpus:
  - uuid: GPU-11111111-2222-3333-4444-555555555555
    index: 0
    minor: 0
    productName: NVIDIA A100-SXM4-40GB
    brand: Nvidia
    architecture: Ampere
    memoryTotal: 42949672960
    pciBusId: "00000000:07:00.0"
    numaNode: 0
    computeCapability: "8.0"
  - uuid: GPU-66666666-7777-8888-9999-000000000000
    index: 1
    minor: 1
    productName: NVIDIA A100-SXM4-40GB
    brand: Nvidia
    architecture: Ampere
    memoryTotal: 42949672960
    pciBusId: "00000000:87:00.0"
    numaNode: 1
    computeCapability: "8.0"
"""


def edit(old: str, new: str, *, second: bool = False) -> str:
    """BASE with one occurrence of `old` (in gpus[1] when `second`) replaced."""
    split = BASE.index("  - uuid: GPU-6666") if second else 0
    assert old in BASE[split:], old
    return BASE[:split] + BASE[split:].replace(old, new, 1)


@dataclass(frozen=True)
class Bad:
    """A profile outside the subset or the schema: what the mock says, and whether the C fake rejects it
    too (it checks the grammar, keys, values it serves and index density; not uniqueness or formats that
    only matter to vgpud, and it does not know what PyYAML would read)."""

    id: str
    text: str
    line: int | None  # where the mock reports it
    fragment: str
    fake_rejects: bool = True


BAD_PROFILES = [
    Bad("unknown top key", "vendor: nvidia\n" + BASE, 1, "vendor: unknown key"),
    Bad(
        "unknown gpu key",
        edit("    numaNode: 0\n", "    numaNode: 0\n    serial: 1324\n"),
        13,
        "gpus[0].serial: unknown key",
    ),
    Bad("missing gpu key", edit("    minor: 0\n", ""), 4, "gpus[0]: missing required key 'minor'"),
    Bad(
        "missing top key",
        edit("driverVersion: 550.54.15\n", ""),
        1,
        "top level: missing required key 'driverVersion'",
    ),
    Bad(
        "quoted integer",
        edit("    index: 0\n", '    index: "0"\n'),
        5,
        "gpus[0].index: expected an unquoted integer",
    ),
    Bad(
        "word for integer",
        edit("    minor: 1\n", "    minor: one\n", second=True),
        16,
        "gpus[1].minor: expected an unquoted integer",
    ),
    Bad(
        "leading zero",
        edit("    minor: 1\n", "    minor: 01\n", second=True),
        16,
        "gpus[1].minor: expected an unquoted integer",
    ),
    Bad("negative numa", edit("    numaNode: 0\n", "    numaNode: -1\n"), 12, "not a 'key: value' line"),
    Bad(
        "yaml float",
        edit('    computeCapability: "8.0"\n', "    computeCapability: 8.0\n"),
        13,
        "gpus[0].computeCapability: YAML reads this value as 8.0 (float)",
        fake_rejects=False,
    ),
    Bad(
        "yaml bool",
        edit("    productName: NVIDIA A100-SXM4-40GB\n", "    productName: yes\n"),
        7,
        "gpus[0].productName: YAML reads this value as True (bool)",
        fake_rejects=False,
    ),
    Bad(
        "yaml int",
        edit("driverVersion: 550.54.15\n", "driverVersion: 550\n"),
        1,
        "driverVersion: YAML reads this value as 550 (int)",
        fake_rejects=False,
    ),
    Bad(
        "unquoted bus id",
        edit('    pciBusId: "00000000:07:00.0"\n', "    pciBusId: 00000000:07:00.0\n"),
        11,
        "not a 'key: value' line in the profile subset",
    ),
    Bad(
        "short bus id",
        edit('"00000000:07:00.0"', '"0000:07:00.0"'),
        11,
        "gpus[0].pciBusId: '0000:07:00.0' is not",
    ),
    Bad(
        "bad cuda version",
        edit('cudaDriverVersion: "12.4"', 'cudaDriverVersion: "12"'),
        2,
        "cudaDriverVersion: '12' is not a version",
    ),
    Bad(
        "unknown brand",
        edit("    brand: Nvidia\n", "    brand: Radeon\n"),
        8,
        "gpus[0].brand: 'Radeon' is not one of",
    ),
    Bad(
        "unknown architecture",
        edit("    architecture: Ampere\n", "    architecture: Lovelace\n"),
        9,
        "gpus[0].architecture: 'Lovelace' is not one of",
    ),
    Bad(
        "unknown addressing mode",
        edit("    numaNode: 0\n", "    numaNode: 0\n    addressingMode: NUMA\n"),
        13,
        "gpus[0].addressingMode: 'NUMA' is not one of",
    ),
    Bad(
        "bad uuid",
        edit("GPU-11111111-2222-3333-4444-555555555555", "GPU-1234"),
        4,
        "gpus[0].uuid: 'GPU-1234' is not a GPU UUID",
        fake_rejects=False,
    ),
    Bad(
        "zero memory",
        edit("    memoryTotal: 42949672960\n", "    memoryTotal: 0\n"),
        10,
        "gpus[0].memoryTotal: 0 is outside",
        fake_rejects=False,
    ),
    Bad(
        "duplicate uuid",
        edit("GPU-66666666-7777-8888-9999-000000000000", "GPU-11111111-2222-3333-4444-555555555555"),
        14,
        "gpus[1].uuid: 'GPU-11111111-2222-3333-4444-555555555555' is already used by gpus[0]",
        fake_rejects=False,
    ),
    Bad(
        "duplicate index",
        edit("    index: 1\n", "    index: 0\n"),
        15,
        "gpus[1].index: 0 is already used by gpus[0]",
    ),
    Bad(
        "duplicate minor",
        edit("    minor: 1\n", "    minor: 0\n"),
        16,
        "gpus[1].minor: 0 is already used by gpus[0]",
        fake_rejects=False,
    ),
    Bad(
        "duplicate bus id",
        edit("00000000:87:00.0", "00000000:07:00.0"),
        21,
        "gpus[1].pciBusId: '00000000:07:00.0' is already used by gpus[0]",
        fake_rejects=False,
    ),
    Bad("index gap", edit("    index: 1\n", "    index: 2\n"), 15, "gpus[1].index: 2 is out of range"),
    Bad("duplicate key", edit("    minor: 0\n", "    minor: 0\n    minor: 0\n"), 7, "duplicate key 'minor'"),
    Bad("duplicate list", BASE + "gpus:\n", 24, "duplicate key 'gpus'"),
    Bad(
        "nested mapping",
        edit('    pciBusId: "00000000:07:00.0"\n', '    pci:\n      busId: "00000000:07:00.0"\n'),
        11,
        "key 'pci' has no value",
    ),
    Bad(
        "flow list",
        'driverVersion: 550.54.15\ncudaDriverVersion: "12.4"\ngpus: [{uuid: x}]\n',
        3,
        "not a 'key: value' line",
    ),
    Bad(
        "list with a value",
        BASE.replace("gpus:\n", "gpus: none\n", 1),
        3,
        "'gpus' takes its items on the following lines",
    ),
    Bad("flow value", edit("    numaNode: 0\n", "    numaNode: [0]\n"), 12, "not a 'key: value' line"),
    Bad(
        "anchor",
        edit("    productName: NVIDIA A100-SXM4-40GB\n", "    productName: &name A100\n"),
        7,
        "not a 'key: value' line",
    ),
    Bad(
        "escape in quotes",
        edit("    productName: NVIDIA A100-SXM4-40GB\n", '    productName: "A\\"100"\n'),
        7,
        "not a 'key: value' line",
    ),
    Bad("document marker", "---\n" + BASE, 1, "not a 'key: value' line"),
    Bad("no space after colon", edit("    minor: 0\n", "    minor:0\n"), 6, "not a 'key: value' line"),
    Bad("tab", edit("    minor: 0\n", "    minor:\t0\n"), 6, "tab character"),
    Bad("three-space indent", edit("    minor: 0\n", "   minor: 0\n"), 6, "unexpected indentation"),
    Bad("five-space indent", edit("    minor: 0\n", "     minor: 0\n"), 6, "unexpected indentation"),
    Bad(
        "item outside list",
        edit("driverVersion: 550.54.15\n", "").replace(
            "  - uuid: GPU-6666", "driverVersion: 550.54.15\n  - uuid: GPU-6666"
        ),
        14,
        "list item outside the 'gpus' list",
    ),
    Bad("no gpus", BASE[: BASE.index("  - uuid")], 3, "'gpus' lists no GPUs"),
    Bad("no list", BASE[: BASE.index("gpus:")], None, "missing the 'gpus' list"),
    Bad(
        "long line",
        edit("    productName: NVIDIA A100-SXM4-40GB\n", f"    productName: {'A' * 600}\n"),
        7,
        "line longer than 511 bytes",
    ),
    Bad(
        "long name",
        edit("    productName: NVIDIA A100-SXM4-40GB\n", f"    productName: {'A' * 96}\n"),
        7,
        "gpus[0].productName: must be 1 to 95 characters",
    ),
    Bad(
        "unknown mig mode",
        edit("    numaNode: 0\n", "    numaNode: 0\n    migMode: on\n"),
        13,
        "gpus[0].migMode: 'on' is not one of 'disabled', 'enabled'",
    ),
    Bad(
        "mig devices without mig mode",
        edit("    numaNode: 0\n", "    numaNode: 0\n    migDevices: 1g.5gb\n"),
        13,
        "gpus[0].migDevices: MIG devices need migMode: enabled",
    ),
    Bad(
        "mig devices with mig mode disabled",
        edit("    numaNode: 1\n", "    numaNode: 1\n    migMode: disabled\n    migDevices: 1g.5gb\n"),
        24,
        "gpus[1].migDevices: MIG devices need migMode: enabled",
    ),
    Bad(
        "mig devices only pending",
        edit("    numaNode: 0\n", "    numaNode: 0\n    migModePending: enabled\n    migDevices: 1g.5gb\n"),
        14,
        "gpus[0].migDevices: MIG devices need migMode: enabled",
    ),
    Bad(
        "unknown mig profile",
        edit("    numaNode: 0\n", "    numaNode: 0\n    migMode: enabled\n    migDevices: 3g.20gb 1g.10gb\n"),
        14,
        "gpus[0].migDevices: unknown MIG profile '1g.10gb' for this GPU (known: 1g.5gb, 2g.10gb, 3g.20gb, "
        "4g.20gb, 7g.40gb)",
    ),
    Bad(
        "mig slices over 7",
        edit(
            "    numaNode: 0\n",
            "    numaNode: 0\n    migMode: enabled\n    migDevices: 4g.20gb 3g.20gb 1g.5gb\n",
        ),
        14,
        "gpus[0].migDevices: the MIG devices take 8 slices, more than the GPU's 7",
    ),
    Bad(
        "empty mig devices",
        edit("    numaNode: 0\n", '    numaNode: 0\n    migMode: enabled\n    migDevices: ""\n'),
        14,
        "gpus[0].migDevices: must be 1 to 127 characters",
    ),
    Bad(
        "mig mode on a gpu without mig",
        edit("    architecture: Ampere\n", "    architecture: Volta\n    migMode: enabled\n"),
        10,
        "gpus[0].migMode: this GPU has no MIG mode (MIG needs an Ampere, Hopper or Blackwell A100, A30, "
        "H100, H200 or B200)",
    ),
    Bad(
        "pending mig mode on a gpu without mig",
        edit(
            "    productName: NVIDIA A100-SXM4-40GB\n",
            "    productName: NVIDIA GeForce RTX 3090\n    migModePending: enabled\n",
            second=True,
        ),
        18,
        "gpus[1].migModePending: this GPU has no MIG mode",
    ),
]


def write(tmp_path: Path, text: str, name: str = "profile.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_profiles_load() -> None:
    profiles = shipped_profiles()
    assert set(profiles) == {"a100-40gb-x2", "a100-40gb-x2-mig", "h100-80gb-x8"}
    a100, h100 = load_profile(profiles["a100-40gb-x2"]), load_profile(profiles["h100-80gb-x8"])
    assert [g.index for g in a100] == [0, 1] and [g.index for g in h100] == list(range(8))
    assert {(g.product_name, g.architecture, g.compute_capability, g.memory_total) for g in a100} == {
        ("NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 40960 * 2**20)
    }
    assert {(g.product_name, g.architecture, g.compute_capability, g.memory_total) for g in h100} == {
        ("NVIDIA H100 80GB HBM3", "Hopper", "9.0", 81559 * 2**20)
    }
    assert a100[1].pci_bus_id == "0000:87:00.0" and a100[1].numa_node == 1
    assert sorted(g.minor for g in h100) == list(range(8)) and [g.minor for g in h100] != list(range(8))
    for gpu in a100 + h100:
        assert (gpu.brand, gpu.driver_version, gpu.cuda_driver_version) == ("Nvidia", "550.54.15", "12.4")
        assert gpu.addressing_mode is None
        assert (gpu.mig_mode, gpu.mig_devices) == (False, ())
        assert json.loads(json.dumps(gpu.to_dict())) == gpu.to_dict()


def test_open_inventory_mock(tmp_path: Path) -> None:
    inventory = open_inventory("mock", profile=PROFILES_DIR / "h100-80gb-x8.yaml")
    assert inventory.backend == "mock"
    assert len(inventory.gpus()) == 8
    assert "h100-80gb-x8.yaml" in inventory.describe()
    shuffled = write(
        tmp_path,
        BASE[: BASE.index("  - uuid")]
        + BASE[BASE.index("  - uuid: GPU-6666") :]
        + BASE[BASE.index("  - uuid") : BASE.index("  - uuid: GPU-6666")],
    )
    assert [g.index for g in open_inventory("mock", profile=shuffled).gpus()] == [0, 1]


def test_to_dict_has_every_field() -> None:
    gpu = load_profile(PROFILES_DIR / "a100-40gb-x2.yaml")[0]
    assert gpu.to_dict() == {
        "uuid": "GPU-2db41dd2-f9b4-4c97-9654-9baa4a150479",
        "index": 0,
        "minor": 0,
        "product_name": "NVIDIA A100-SXM4-40GB",
        "brand": "Nvidia",
        "architecture": "Ampere",
        "memory_total": 42949672960,
        "pci_bus_id": "0000:07:00.0",
        "numa_node": 0,
        "compute_capability": "8.0",
        "driver_version": "550.54.15",
        "cuda_driver_version": "12.4",
        "addressing_mode": None,
        "mig_mode": False,
        "mig_devices": [],
    }


@pytest.mark.parametrize(
    ("backend", "kwargs", "fragment"),
    [
        ("mock", {}, "the mock GPU backend needs a profile"),
        (
            "mock",
            {"profile": PROFILES_DIR / "a100-40gb-x2.yaml", "nvml_library": "x.so"},
            "applies to the nvml",
        ),
        ("nvml", {"profile": PROFILES_DIR / "a100-40gb-x2.yaml"}, "applies to the mock"),
        ("cuda", {}, "unknown GPU backend 'cuda'"),
    ],
)
def test_open_inventory_rejects_bad_arguments(backend: str, kwargs: dict, fragment: str) -> None:
    with pytest.raises(GpuInventoryError, match=fragment):
        open_inventory(backend, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", BAD_PROFILES, ids=lambda bad: bad.id)
def test_mock_rejects_bad_profiles(tmp_path: Path, bad: Bad) -> None:
    path = write(tmp_path, bad.text)
    with pytest.raises(GpuInventoryError) as caught:
        open_inventory("mock", profile=path)
    message = str(caught.value)
    assert message.startswith(f"profile {path}: "), message
    assert bad.fragment in message
    if bad.line is not None:
        assert f": line {bad.line}: " in message


def test_mock_rejects_unreadable_profiles(tmp_path: Path) -> None:
    with pytest.raises(GpuInventoryError, match=r"profile .*missing\.yaml cannot be read"):
        open_inventory("mock", profile=tmp_path / "missing.yaml")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(BASE.replace("NVIDIA A100", "NVIDIA \xe9", 1).encode("latin-1"))
    with pytest.raises(GpuInventoryError, match="cannot be read"):
        load_profile(latin1)


def test_mock_accepts_the_whole_subset(tmp_path: Path) -> None:
    """Comments, blank lines, single quotes, trailing spaces and CRLF are all inside the subset."""
    text = (
        "# a comment\n\n"
        + BASE.replace(
            "    numaNode: 0\n", "    numaNode: 0   # trailing comment\n   # indented comment\n", 1
        )
        .replace("productName: NVIDIA A100-SXM4-40GB", "productName: 'NVIDIA A100-SXM4-40GB'  ", 1)
        .replace("gpus:\n", "gpus:  # the list\n")
    ).replace("\n", "\r\n")
    assert load_profile(write(tmp_path, text)) == load_profile(write(tmp_path, BASE, "base.yaml"))


def test_name_tables_match_nvml_constants() -> None:
    assert BRAND_NAMES[pynvml.NVML_BRAND_NVIDIA] == "Nvidia"
    assert BRAND_NAMES[pynvml.NVML_BRAND_TESLA] == "Tesla"
    assert BRAND_NAMES[pynvml.NVML_BRAND_NVIDIA_CLOUD_GAMING] == "NvidiaCloudGaming"
    assert ARCHITECTURE_NAMES[pynvml.NVML_DEVICE_ARCH_AMPERE] == "Ampere"
    assert ARCHITECTURE_NAMES[pynvml.NVML_DEVICE_ARCH_ADA] == "Ada Lovelace"
    assert ARCHITECTURE_NAMES[pynvml.NVML_DEVICE_ARCH_HOPPER] == "Hopper"
    assert ARCHITECTURE_NAMES[pynvml.NVML_DEVICE_ARCH_BLACKWELL] == "Blackwell"
    assert ARCHITECTURE_NAMES[pynvml.NVML_DEVICE_ARCH_UNKNOWN] == "Unknown"
    assert ADDRESSING_MODE_NAMES[pynvml.NVML_DEVICE_ADDRESSING_MODE_HMM] == "HMM"
    assert ADDRESSING_MODE_NAMES[pynvml.NVML_DEVICE_ADDRESSING_MODE_ATS] == "ATS"
    assert ADDRESSING_MODE_NAMES[pynvml.NVML_DEVICE_ADDRESSING_MODE_NONE] == "None"


@pytest.mark.parametrize(
    ("nvml", "normalized"),
    [
        ("00000000:07:00.0", "0000:07:00.0"),
        ("00000000:B7:00.0", "0000:b7:00.0"),
        ("00010000:01:00.0", "00010000:01:00.0"),
    ],
)
def test_pci_bus_ids_normalize_as_go_nvlib_does(nvml: str, normalized: str) -> None:
    assert normalize_pci_bus_id(nvml) == normalized


def test_cuda_versions_render_as_major_dot_minor() -> None:
    assert [cuda_version_string(v) for v in (12040, 12000, 11080, 12100)] == ["12.4", "12.0", "11.8", "12.10"]


# Strategies for whole, valid inventories (shared with the NVML tests).
_hex = st.text("0123456789abcdef", min_size=32, max_size=32)
_uuid = _hex.map(lambda h: f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
_name = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9 ._()+-]{0,40}[A-Za-z0-9]", fullmatch=True)


@st.composite
def inventories(draw: st.DrawFn) -> list[GpuInfo]:
    count = draw(st.integers(1, 8))
    uuids = draw(st.lists(_uuid, min_size=count, max_size=count, unique=True))
    minors = draw(st.permutations(range(count)))
    buses = draw(st.lists(st.integers(0, 255), min_size=count, max_size=count, unique=True))
    driver = draw(st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,2}", fullmatch=True))
    cuda = f"{draw(st.integers(0, 999))}.{draw(st.integers(0, 99))}"
    return [
        GpuInfo(
            uuid=uuids[i],
            index=i,
            minor=minors[i],
            product_name=draw(_name),
            brand=draw(st.sampled_from(sorted(BRAND_NAMES.values()))),
            architecture=draw(st.sampled_from(sorted(ARCHITECTURE_NAMES.values()))),
            memory_total=draw(st.integers(1, 2**64 - 1)),
            pci_bus_id=f"0000:{buses[i]:02x}:00.0",
            numa_node=draw(st.none() | st.integers(0, 2**31 - 1)),
            compute_capability=f"{draw(st.integers(1, 99))}.{draw(st.integers(0, 9))}",
            driver_version=driver,
            cuda_driver_version=cuda,
            addressing_mode=draw(st.none() | st.sampled_from(sorted(ADDRESSING_MODE_NAMES.values()))),
        )
        for i in range(count)
    ]


@given(inventories())
def test_dump_profile_loads_back(gpus: list[GpuInfo]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        assert load_profile(write(Path(tmp), dump_profile(gpus))) == gpus


def test_dump_profile_refuses_mixed_drivers() -> None:
    gpus = load_profile(PROFILES_DIR / "a100-40gb-x2.yaml")
    with pytest.raises(ValueError, match="different driver versions"):
        dump_profile([gpus[0], replace(gpus[1], driver_version="560.1")])


def test_a_lone_carriage_return_is_not_a_line_break(tmp_path: Path) -> None:
    """Only "\\n" (optionally after "\\r") ends a line, for the C reader as for this one."""
    path = tmp_path / "profile.yaml"
    path.write_bytes(BASE.replace("    minor: 0\n", "    minor: 0\r    serial: 1\n").encode())
    with pytest.raises(GpuInventoryError, match="line 6: not a 'key: value' line"):
        load_profile(path)
