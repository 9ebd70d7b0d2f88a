"""The control library's load-time and export rules, read from the built .so (reference §1): no
constructors, no bare dlsym, the anonymous version script, every listed hook exported."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO, built
from tests.unit.libvgpu import elfcheck

SRC = REPO / "csrc" / "libvgpu" / "src"


def _listed_hooks() -> list[str]:
    names = []
    for def_file in ("hooks_lib.def", "core_hooks.def"):
        names += re.findall(r"^VGPU_HOOK\((\w+)\)", (SRC / def_file).read_text(), re.MULTILINE)
    return names


@pytest.fixture(scope="module")
def lib() -> Path:
    return built("libvgpu/libvgpu-control.so")


@pytest.fixture(scope="module")
def bad_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A library that breaks every rule: a constructor, a bare dlsym call, a stray export."""
    tmp = tmp_path_factory.mktemp("bad")
    src = tmp / "bad.c"
    src.write_text(
        "#include <dlfcn.h>\n"
        "__attribute__((constructor)) static void boot(void) {}\n"
        "void *helper_lookup(const char *n) { return dlsym(RTLD_NEXT, n); }\n"
    )
    out = tmp / "libbad.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(out), str(src)], check=True)
    return out


def test_no_load_time_code(lib: Path) -> None:
    assert elfcheck.load_time_code(lib) == []


def test_checker_sees_a_constructor(bad_lib: Path) -> None:
    assert "DT_INIT_ARRAY" in elfcheck.load_time_code(bad_lib)


def test_no_bare_dlsym(lib: Path) -> None:
    assert elfcheck.bare_dlsym_calls(lib) == []
    assert not elfcheck.undefined_dlsym(lib)


def test_checker_sees_a_bare_dlsym(bad_lib: Path) -> None:
    assert elfcheck.bare_dlsym_calls(bad_lib)
    assert elfcheck.undefined_dlsym(bad_lib)


def test_exports_only_the_hook_families_unversioned(lib: Path) -> None:
    symbols = elfcheck.exported(lib)
    assert {name for name in symbols if not elfcheck.EXPORT_FAMILIES.match(name)} == set()
    # An unversioned definition satisfies the application's dlsym@GLIBC_2.34 reference.
    assert {name: v for name, v in symbols.items() if v} == {}


def test_checker_sees_a_stray_export(bad_lib: Path) -> None:
    assert "helper_lookup" in elfcheck.exported(bad_lib)


def test_every_listed_hook_is_exported(lib: Path) -> None:
    hooks = _listed_hooks()
    assert len(hooks) == len(set(hooks)), "a hook is listed twice"
    assert set(hooks) <= set(elfcheck.exported(lib))
    assert "dlsym" in elfcheck.exported(lib)


def test_both_abi_variants_exported(lib: Path) -> None:
    symbols = elfcheck.exported(lib)
    bases = (
        "cuMemAlloc",
        "cuMemGetInfo",
        "cuDeviceTotalMem",
        "cuMemFree",
        "cuArrayCreate",
        "cuGetProcAddress",
    )
    for base in bases:
        assert base in symbols and f"{base}_v2" in symbols, base
    # Context creation is gated in every ABI variant (a variant left to the driver would be a door).
    assert {"cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4"} <= set(symbols)


def test_loads_on_old_glibc(lib: Path) -> None:
    """It goes into arbitrary images (CUDA 11 on Ubuntu 20.04 has glibc 2.31): nothing of
    GLIBC_2.33/2.34 (stat, libdl/libpthread merged into libc), and libdl/libpthread are NEEDED so
    the original symbol versions resolve there."""
    assert elfcheck.required_glibc(lib) <= (2, 17)
    dynamic = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "[libdl.so.2]" in dynamic and "[libpthread.so.0]" in dynamic


def test_checker_sees_a_new_glibc_symbol(bad_lib: Path) -> None:
    assert elfcheck.required_glibc(bad_lib) >= (2, 34)  # dlsym@GLIBC_2.34 from this toolchain
