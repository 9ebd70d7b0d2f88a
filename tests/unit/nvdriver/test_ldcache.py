"""The ld.so.cache parser against glibc's own reader (`ldconfig -p`) and against bad input."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import require
from vgpud.nvdriver.ldcache import NEW_MAGIC, OLD_MAGIC, LdCacheError, library_paths

HOST_CACHE = Path("/etc/ld.so.cache")
_LINE = re.compile(r"^\s+(\S+) \(([^)]*)\) => (\S+)$")


def ldconfig_paths() -> list[str]:
    """`ldconfig -p`'s 64-bit entries, in its order, each path once."""
    out = subprocess.run(["ldconfig", "-p"], check=True, capture_output=True, text=True).stdout
    paths: list[str] = []
    for line in out.splitlines():
        m = _LINE.match(line)
        if m and ("x86-64" in m.group(2) or "AArch64" in m.group(2)) and m.group(3) not in paths:
            paths.append(m.group(3))
    return paths


def test_the_hosts_cache_reads_as_ldconfig_lists_it() -> None:
    require(HOST_CACHE.is_file() and shutil.which("ldconfig") is not None, "/etc/ld.so.cache", "glibc")
    assert library_paths(HOST_CACHE.read_bytes()) == ldconfig_paths()


def cache(entries: list[tuple[int, str, str]], legacy: int = 0) -> bytes:
    """A cache in glibc's layout: `legacy` old-format entries first (skipped), then the new part."""
    strings = b""
    table = b""
    header_size, entry_size = 48, 24
    base = header_size + entry_size * len(entries)
    offsets = []
    for _, key, value in entries:
        k = base + len(strings)
        strings += key.encode() + b"\0"
        v = base + len(strings)
        strings += value.encode() + b"\0"
        offsets.append((k, v))
    for (flags, _, _), (k, v) in zip(entries, offsets, strict=True):
        table += struct.pack("<iIIIQ", flags, k, v, 0, 0)
    new = struct.pack("<20sII12x8x", NEW_MAGIC, len(entries), len(strings)) + table + strings
    if not legacy:
        return new
    old = OLD_MAGIC + struct.pack("<I", legacy) + b"\0" * (12 * legacy)
    return old + b"\0" * (-len(old) % 8) + new


X86_64 = 0x0303  # ELF libc6, x86-64


def test_only_64_bit_elf_entries_count_each_path_once() -> None:
    data = cache(
        [
            (X86_64, "libcuda.so.1", "/usr/lib64/libcuda.so.1"),
            (0x0003, "libcuda.so.1", "/usr/lib/libcuda.so.1"),  # i386
            (0x0000, "libold.so", "/lib/libold.so"),  # not ELF
            (X86_64, "libcuda.so", "/usr/lib64/libcuda.so.1"),  # the same path again
            (0x0A03, "libnvidia-ml.so.1", "/usr/lib/aarch64/libnvidia-ml.so.1"),
        ]
    )
    assert library_paths(data) == ["/usr/lib64/libcuda.so.1", "/usr/lib/aarch64/libnvidia-ml.so.1"]


def test_a_legacy_part_is_skipped() -> None:
    data = cache([(X86_64, "libcuda.so.1", "/opt/nv/libcuda.so.1")], legacy=3)
    assert library_paths(data) == ["/opt/nv/libcuda.so.1"]


@pytest.mark.parametrize(
    "data",
    [b"", b"garbage" * 10, NEW_MAGIC + b"\0" * 3, cache([(X86_64, "a", "/a")])[:60], OLD_MAGIC + b"\xff" * 4],
)
def test_bad_caches_are_refused(data: bytes) -> None:
    with pytest.raises(LdCacheError):
        library_paths(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([b"", NEW_MAGIC, OLD_MAGIC]))
def test_any_bytes_give_paths_or_a_clear_error(tail: bytes, head: bytes) -> None:
    try:
        paths = library_paths(head + tail)
    except LdCacheError:
        return
    assert all(isinstance(p, str) for p in paths)
