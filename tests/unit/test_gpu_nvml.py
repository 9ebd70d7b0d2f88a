"""The NVML backend, run through nvidia-ml-py against the fake libnvidia-ml.so.1 (csrc/fakenvml).

The fake serves the same profile files the mock backend reads, so for every valid profile the two
backends must give equal inventories. NVML reads run in this process: vgpud.gpu.nvml binds its library
into pynvml for each read, which these tests exercise by switching libraries between reads. Only the
default library name needs a subprocess: once the fake is loaded here, dlopen("libnvidia-ml.so.1")
resolves to it by soname.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import REPO, built
from tests.unit.test_gpu_mock import BAD_PROFILES, BASE, Bad, inventories
from vgpud.gpu import GpuInfo, GpuInventoryError, open_inventory
from vgpud.gpu import nvml as nvml_backend
from vgpud.gpu.mock import GPU_FIELDS, PROFILES_DIR, TOP_FIELDS, dump_profile, load_profile, shipped_profiles
from vgpud.gpu.model import ADDRESSING_MODE_NAMES, ARCHITECTURE_NAMES, BRAND_NAMES
from vgpud.gpu.profile import LIST_KEY

FAKE = "fakenvml/libnvidia-ml.so.1"


@pytest.fixture(scope="module", autouse=True)
def no_host_sysfs() -> Iterator[None]:
    """The NUMA fallback must not read this host's PCI devices (module scope: hypothesis-friendly)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nvml_backend, "SYSFS_PCI_DEVICES", Path("/nonexistent/sys/bus/pci/devices"))
        yield


@contextmanager
def serving(profile: Path | str) -> Iterator[str]:
    """FAKE_NVML_PROFILE=profile for the block (a str is written to a temporary file); yields the lib."""
    library = str(built(FAKE))
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(profile, str):
            path = Path(tmp) / "profile.yaml"
            path.write_text(profile)
            profile = path
        old = os.environ.get("FAKE_NVML_PROFILE")
        os.environ["FAKE_NVML_PROFILE"] = str(profile)
        try:
            yield library
        finally:
            if old is None:
                del os.environ["FAKE_NVML_PROFILE"]
            else:
                os.environ["FAKE_NVML_PROFILE"] = old


def nvml_gpus(profile: Path | str) -> list[GpuInfo]:
    with serving(profile) as library:
        return open_inventory("nvml", nvml_library=library).gpus()


@pytest.mark.parametrize("name", sorted(shipped_profiles()))
def test_nvml_through_the_fake_equals_mock(name: str) -> None:
    profile = PROFILES_DIR / f"{name}.yaml"
    assert nvml_gpus(profile) == open_inventory("mock", profile=profile).gpus()


def test_every_name_round_trips_through_c() -> None:
    """The C fake's name tables agree with model.py's: every brand, architecture and addressing mode."""
    base = load_profile(PROFILES_DIR / "a100-40gb-x2.yaml")[0]
    brands, archs = sorted(BRAND_NAMES.values()), sorted(ARCHITECTURE_NAMES.values())
    modes = [None, *sorted(ADDRESSING_MODE_NAMES.values())]
    gpus = [
        replace(
            base,
            uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
            index=i,
            minor=40 - i,
            pci_bus_id=f"0000:{i + 16:02x}:00.0",
            brand=brands[i],
            architecture=archs[i % len(archs)],
            addressing_mode=modes[i % len(modes)],
            numa_node=i % 3,
        )
        for i in range(len(brands))
    ]
    assert nvml_gpus(dump_profile(gpus)) == gpus


@st.composite
def styled(draw: st.DrawFn, gpus: list[GpuInfo]) -> str:
    """A profile for `gpus` in any style the subset allows: plain or quoted strings, comments, blank
    lines, trailing spaces, CRLF, keys in any order, GPUs in any order."""

    def value(v: str | int) -> str:
        if isinstance(v, int):
            return str(v)
        styles = ['"{}"', "'{}'"]
        if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._()+-]*", v) and yaml.safe_load(f"k: {v}")["k"] == v:
            styles.append("{}")
        return draw(st.sampled_from(styles)).format(v)

    def tail() -> str:
        return draw(st.sampled_from(["", "  ", "  # note", " #"]))

    def filler() -> list[str]:
        return draw(
            st.lists(st.sampled_from(["", "   ", "# comment", "      # indented comment"]), max_size=2)
        )

    dumped = yaml.safe_load(dump_profile(gpus))
    lines = filler()
    for key in draw(st.permutations(list(TOP_FIELDS))):
        lines += [f"{key}: {value(dumped[key])}{tail()}", *filler()]
    lines.append(f"{LIST_KEY}:{tail()}")
    for item in draw(st.permutations(dumped[LIST_KEY])):
        keys = draw(st.permutations([key for key in GPU_FIELDS if key in item]))
        for n, key in enumerate(keys):
            lines += [f"{'  - ' if n == 0 else '    '}{key}: {value(item[key])}{tail()}", *filler()]
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    return newline.join(lines) + draw(st.sampled_from(["", newline]))


@settings(max_examples=60, deadline=None)
@given(st.data(), inventories())
def test_both_backends_read_any_valid_profile_alike(data: st.DataObject, gpus: list[GpuInfo]) -> None:
    text = data.draw(styled(gpus))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.yaml"
        path.write_text(text, newline="")
        assert load_profile(path) == gpus
        assert nvml_gpus(path) == gpus


@pytest.mark.parametrize("bad", [bad for bad in BAD_PROFILES if bad.fake_rejects], ids=lambda bad: bad.id)
def test_fake_rejects_what_it_cannot_serve(bad: Bad, capfd: pytest.CaptureFixture[str]) -> None:
    with serving(bad.text) as library, pytest.raises(GpuInventoryError) as caught:
        open_inventory("nvml", nvml_library=library).gpus()
    message = str(caught.value)
    assert message.startswith(
        f"NVML library {library} nvmlInitWithFlags failed: Unknown Error (fakenvml: profile "
    )
    assert message.endswith("(NVML error 999)")
    line = re.search(r": line (\d+): ", message)
    if line is not None:
        assert int(line.group(1)) == bad.line, message
    stderr = capfd.readouterr().err.splitlines()
    assert len(stderr) == 1 and stderr[0].startswith("fakenvml: profile "), stderr


@pytest.mark.parametrize("bad", [bad for bad in BAD_PROFILES if not bad.fake_rejects], ids=lambda bad: bad.id)
def test_fake_serves_what_only_the_mock_rejects(bad: Bad) -> None:
    """Uniqueness, formats and YAML typing are the mock's gate: the fake is the more lenient reader."""
    assert len(nvml_gpus(bad.text)) == 2


def test_unset_profile_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    library = str(built(FAKE))
    monkeypatch.delenv("FAKE_NVML_PROFILE", raising=False)
    with pytest.raises(GpuInventoryError, match="FAKE_NVML_PROFILE is not set"):
        open_inventory("nvml", nvml_library=library).gpus()


def test_missing_library_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "libnvidia-ml.so.1"
    with pytest.raises(GpuInventoryError) as caught:
        open_inventory("nvml", nvml_library=str(missing))
    assert str(caught.value).startswith(f"NVML library {missing} could not be loaded: ")
    assert "No such file or directory" in str(caught.value)


def test_a_file_that_is_no_library_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "libnvidia-ml.so.1"
    empty.touch()
    with pytest.raises(
        GpuInventoryError, match=rf"NVML library {re.escape(str(empty))} could not be loaded: .*"
    ):
        open_inventory("nvml", nvml_library=str(empty))


def test_a_library_that_is_not_nvml_is_a_clear_error() -> None:
    libc = ctypes.util.find_library("c")
    assert libc is not None
    with pytest.raises(GpuInventoryError) as caught:
        open_inventory("nvml", nvml_library=libc).gpus()
    assert str(caught.value) == (
        f"NVML library {libc} has no nvmlInitWithFlags "
        "(not an NVML library, or a driver older than vgpud supports)"
    )


def test_reads_switch_libraries_and_always_shut_down() -> None:
    """pynvml's globals are rebound per read: fake, not-NVML, fake again; NVML is shut down after each."""
    profile = PROFILES_DIR / "a100-40gb-x2.yaml"
    libc = ctypes.util.find_library("c")
    assert libc is not None
    first = nvml_gpus(profile)
    with pytest.raises(GpuInventoryError, match="has no nvmlInitWithFlags"):
        open_inventory("nvml", nvml_library=libc).gpus()
    assert nvml_gpus(profile) == first
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()  # the fake is bound again, and was shut down after the read


def test_concurrent_reads_are_serialized() -> None:
    libc = ctypes.util.find_library("c")
    assert libc is not None
    with serving(PROFILES_DIR / "h100-80gb-x8.yaml") as library:
        good, bad = open_inventory("nvml", nvml_library=library), open_inventory("nvml", nvml_library=libc)
        expected = good.gpus()

        def read(i: int) -> list[GpuInfo] | str:
            try:
                return (good if i % 2 else bad).gpus()
            except GpuInventoryError as err:
                return str(err)

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(read, range(32)))
    assert all(r == expected for r in results[1::2])
    assert all(isinstance(r, str) and "has no nvmlInitWithFlags" in r for r in results[::2])


def test_a_failing_query_names_function_and_gpu_and_still_shuts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    def lost(handle: object) -> str:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lost)
    with serving(PROFILES_DIR / "a100-40gb-x2.yaml") as library, pytest.raises(GpuInventoryError) as caught:
        open_inventory("nvml", nvml_library=library).gpus()
    assert str(caught.value) == (
        f"NVML library {library} nvmlDeviceGetName failed for GPU 0: GPU is lost (NVML error 15)"
    )
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_a_missing_required_function_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(handle: object) -> str:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", absent)
    with pytest.raises(GpuInventoryError, match=r"has no nvmlDeviceGetUUID \(not an NVML library"):
        nvml_gpus(PROFILES_DIR / "a100-40gb-x2.yaml")


def test_optional_queries_degrade_as_the_go_reference_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Old drivers lack addressing modes and NUMA queries; WSL has no minor numbers; new enums are
    published as "Unknown" rather than failing the node."""

    def raising(code: int) -> Callable[[object], None]:
        def fn(handle: object) -> None:
            raise pynvml.NVMLError(code)

        return fn

    monkeypatch.setattr(pynvml, "nvmlDeviceGetAddressingMode", raising(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNumaNodeId", raising(pynvml.NVML_ERROR_NOT_SUPPORTED))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMinorNumber", raising(pynvml.NVML_ERROR_NOT_SUPPORTED))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetBrand", lambda handle: 19)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetArchitecture", lambda handle: 13)
    gpus = nvml_gpus(PROFILES_DIR / "h100-80gb-x8.yaml")
    assert [(g.minor, g.numa_node, g.addressing_mode, g.brand, g.architecture) for g in gpus] == [
        (i, None, None, "Unknown", "Unknown") for i in range(8)
    ]


def test_numa_falls_back_to_sysfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for bus, node in (("0000:07:00.0", "1\n"), ("0000:87:00.0", "-1\n")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "numa_node").write_text(node)
    monkeypatch.setattr(nvml_backend, "SYSFS_PCI_DEVICES", tmp_path)
    no_numa = BASE.replace("    numaNode: 0\n", "").replace("    numaNode: 1\n", "")
    assert [g.numa_node for g in nvml_gpus(no_numa)] == [1, None]
    assert [g.numa_node for g in nvml_gpus(BASE)] == [0, 1]  # NVML's answer wins


def test_addressing_modes_are_served() -> None:
    text = BASE.replace("    numaNode: 1\n", "    numaNode: 1\n    addressingMode: HMM\n")
    assert [g.addressing_mode for g in nvml_gpus(text)] == [None, "HMM"]


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
        env={**os.environ, **env},
    )


DEFAULT_READ = (
    "import json; from vgpud.gpu import open_inventory; "
    "print(json.dumps([g.to_dict() for g in open_inventory('nvml').gpus()]))"
)


def test_default_library_name_is_found_on_the_library_path() -> None:
    fake = built(FAKE)
    profile = PROFILES_DIR / "h100-80gb-x8.yaml"
    result = run_python(
        DEFAULT_READ, {"LD_LIBRARY_PATH": str(fake.parent), "FAKE_NVML_PROFILE": str(profile)}
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [g.to_dict() for g in load_profile(profile)]


def test_missing_default_library_is_named() -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this host has a real NVML")
    result = run_python(DEFAULT_READ, {"LD_LIBRARY_PATH": ""})
    assert result.returncode != 0
    assert (
        "GpuInventoryError: NVML library libnvidia-ml.so.1 could not be loaded: libnvidia-ml.so.1: "
        "cannot open shared object file" in result.stderr
    )


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """BASE with a few line-level edits: most break it, some keep it valid."""
    lines = BASE.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        edit = draw(st.sampled_from(["drop", "dup", "swap", "indent", "insert", "truncate"]))
        if edit == "drop":
            del lines[i]
        elif edit == "dup":
            lines.insert(i, lines[i])
        elif edit == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif edit == "indent":
            lines[i] = " " * draw(st.integers(0, 6)) + lines[i].lstrip(" ")
        elif edit == "insert":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = (
                lines[i][:at] + draw(st.text(st.characters(max_codepoint=127), max_size=3)) + lines[i][at:]
            )
        else:
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        if not lines:
            break
    return "\n".join(lines) + "\n"


@settings(max_examples=150, deadline=None)
@given(mutated())
def test_whatever_the_mock_accepts_the_fake_serves_alike(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.yaml"
        path.write_text(text)
        try:
            expected = load_profile(path)
        except GpuInventoryError:
            expected = None
        try:
            got = nvml_gpus(path)
        except GpuInventoryError as err:
            assert expected is None, f"the fake rejects a profile the mock accepts: {err}"
        else:
            assert expected is None or got == expected
