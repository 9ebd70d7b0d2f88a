"""The dynamic linker's cache (`/etc/ld.so.cache`) as a list of 64-bit library paths: pure, bytes in.

The toolkit falls back to a driver root's cache when the standard directories hold no driver
library (a distribution that installs it elsewhere); vgpud does the same. glibc writes the "new"
format (`glibc-ld.so.cache1.1`) since 2.32, after an optional legacy part (`ld.so-1.7.0`) that is
skipped; string offsets count from the start of the new header.
"""

from __future__ import annotations

import struct

OLD_MAGIC = b"ld.so-1.7.0\0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
_OLD_HEADER = struct.Struct("<12sI")
_OLD_ENTRY_SIZE = 12
_NEW_HEADER = struct.Struct("<20sII12x8x")
_NEW_ENTRY = struct.Struct("<iIIIQ")
#: an ELF library for glibc (type bits), and the 64-bit architectures (arch bits)
_TYPE_ELF = 0x0001
_ARCH_MASK = 0xFF00
_ARCH_64 = (0x0300, 0x0A00, 0x0500)  # x86-64, aarch64, ppc64le


class LdCacheError(ValueError):
    """Not an ld.so.cache this parser knows."""


def library_paths(data: bytes) -> list[str]:
    """The paths of the 64-bit ELF libraries in the cache, in cache order, each once."""
    start = 0
    if data.startswith(OLD_MAGIC):
        if len(data) < _OLD_HEADER.size:
            raise LdCacheError("truncated legacy header")
        _, count = _OLD_HEADER.unpack_from(data)
        start = _OLD_HEADER.size + count * _OLD_ENTRY_SIZE
        start += -start % 8  # the new part is 8-byte aligned
    if len(data) < start + _NEW_HEADER.size:
        raise LdCacheError("no glibc-ld.so.cache1.1 header")
    magic, count, _table_size = _NEW_HEADER.unpack_from(data, start)
    if magic != NEW_MAGIC:
        raise LdCacheError(f"unknown magic {magic!r}")
    table = start + _NEW_HEADER.size
    if len(data) < table + count * _NEW_ENTRY.size:
        raise LdCacheError(f"{count} entries do not fit in {len(data)} bytes")
    strings = data[start:]
    paths: list[str] = []
    seen: set[str] = set()
    for flags, _key, value, _os, _hwcap in _NEW_ENTRY.iter_unpack(
        data[table : table + count * _NEW_ENTRY.size]
    ):
        if not flags & _TYPE_ELF or flags & _ARCH_MASK not in _ARCH_64:
            continue
        path = _string(strings, value)
        if path and path not in seen:
            seen.add(path)
            paths.append(path)
    return paths


def _string(data: bytes, offset: int) -> str:
    """The NUL-terminated string at `offset` ('' when it is out of range or not text)."""
    if offset >= len(data):
        return ""
    end = data.find(b"\0", offset)
    raw = data[offset : end if end >= 0 else len(data)]
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return ""
