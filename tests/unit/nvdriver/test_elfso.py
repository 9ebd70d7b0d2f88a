"""SONAMEs from ELF files: real libraries, a file without section headers, and bad input."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import built
from vgpud.nvdriver.elfso import ELF_MAGIC, ElfError, soname

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


def test_real_libraries_name_their_soname() -> None:
    assert soname(LIBC.read_bytes()) == "libc.so.6"
    assert soname(built("fakecuda/libcuda.so.1").read_bytes()) == "libcuda.so.1"
    assert soname(built("fakenvml/libnvidia-ml.so.1").read_bytes()) == "libnvidia-ml.so.1"


def test_an_executable_has_none() -> None:
    assert soname(Path("/bin/true").read_bytes()) is None


def test_without_section_headers_the_program_headers_give_it() -> None:
    data = bytearray(LIBC.read_bytes())
    # ELF64: e_shoff at 0x28 (8 bytes), e_shnum at 0x3c (2 bytes): as if stripped of sections
    struct.pack_into("<Q", data, 0x28, 0)
    struct.pack_into("<H", data, 0x3C, 0)
    assert soname(bytes(data)) == "libc.so.6"


@pytest.mark.parametrize("data", [b"", b"\x7fELF", b"not an elf" * 10, ELF_MAGIC + b"\x09\x01" + b"\0" * 60])
def test_bad_files_are_refused(data: bytes) -> None:
    with pytest.raises(ElfError):
        soname(data)


def test_a_truncated_library_is_refused() -> None:
    with pytest.raises(ElfError):
        soname(LIBC.read_bytes()[:4096])


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=400), st.sampled_from([b"\x02\x01", b"\x01\x01", b"\x02\x02"]))
def test_any_bytes_give_a_name_none_or_a_clear_error(tail: bytes, ident: bytes) -> None:
    try:
        result = soname(ELF_MAGIC + ident + tail)
    except ElfError:
        return
    assert result is None or isinstance(result, str)
