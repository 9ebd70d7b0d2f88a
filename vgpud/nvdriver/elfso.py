"""A shared library's SONAME (DT_SONAME), read from its ELF dynamic section: pure, bytes in.

The toolkit adds a `<soname> -> <file>` link in the container only where the driver root has such a
link beside the library; it reads the soname from the file, as this does. ELF32 and ELF64, either
byte order; the dynamic section is found through the section headers, or through the program
headers (PT_DYNAMIC, DT_STRTAB mapped by PT_LOAD) when a stripped file has none.
"""

from __future__ import annotations

import struct

ELF_MAGIC = b"\x7fELF"
SHT_DYNAMIC = 6
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_SONAME, DT_STRTAB = 0, 14, 5


class ElfError(ValueError):
    """Not an ELF file this reader understands."""


def soname(data: bytes) -> str | None:
    """The DT_SONAME string, or None when the file has none."""
    if len(data) < 64 or not data.startswith(ELF_MAGIC):
        raise ElfError("not an ELF file")
    wide = {1: False, 2: True}.get(data[4])
    order = {1: "<", 2: ">"}.get(data[5])
    if wide is None or order is None:
        raise ElfError("unknown ELF class or byte order")
    elf = _Elf(data, wide, order)
    found = elf.dynamic_from_sections() or elf.dynamic_from_segments()
    if found is None:
        return None
    entries, strtab = found
    for tag, value in entries:
        if tag == DT_SONAME:
            return elf.string(strtab + value)
    return None


class _Elf:
    def __init__(self, data: bytes, wide: bool, order: str) -> None:
        self.data, self.wide, self.order = data, wide, order
        self.header = struct.Struct(order + ("16xHHIQQQIHHHHHH" if wide else "16xHHIIIIIHHHHHH"))
        self.section = struct.Struct(order + ("IIQQQQIIQQ" if wide else "IIIIIIIIII"))
        self.segment = struct.Struct(order + ("IIQQQQQQ" if wide else "IIIIIIII"))
        self.dyn = struct.Struct(order + ("qQ" if wide else "iI"))
        fields = self._unpack(self.header, 0)
        self.phoff, self.shoff = fields[4], fields[5]
        self.phnum, self.shnum = fields[9], fields[11]

    def _unpack(self, layout: struct.Struct, offset: int) -> tuple[int, ...]:
        if offset < 0 or offset + layout.size > len(self.data):
            raise ElfError(f"truncated ELF file (offset {offset})")
        return layout.unpack_from(self.data, offset)

    def _dyn_entries(self, offset: int, size: int) -> list[tuple[int, int]]:
        entries = []
        for at in range(offset, offset + size - self.dyn.size + 1, self.dyn.size):
            tag, value = self._unpack(self.dyn, at)
            if tag == DT_NULL:
                break
            entries.append((tag, value))
        return entries

    def dynamic_from_sections(self) -> tuple[list[tuple[int, int]], int] | None:
        sections = [self._unpack(self.section, self.shoff + i * self.section.size) for i in range(self.shnum)]
        for sh in sections:
            if sh[1] == SHT_DYNAMIC and 0 <= sh[6] < len(sections):
                strtab = sections[sh[6]][4]  # the linked string table's file offset
                return self._dyn_entries(sh[4], sh[5]), strtab
        return None

    def dynamic_from_segments(self) -> tuple[list[tuple[int, int]], int] | None:
        segments = [self._unpack(self.segment, self.phoff + i * self.segment.size) for i in range(self.phnum)]
        ph = self._fields
        dynamic = next((s for s in segments if ph(s)[0] == PT_DYNAMIC), None)
        if dynamic is None:
            return None
        _, offset, _, filesz, _ = ph(dynamic)
        entries = self._dyn_entries(offset, filesz)
        address = next((v for t, v in entries if t == DT_STRTAB), None)
        if address is None:
            return None
        for segment in segments:
            kind, seg_offset, vaddr, seg_filesz, _ = ph(segment)
            if kind == PT_LOAD and vaddr <= address < vaddr + seg_filesz:
                return entries, address - vaddr + seg_offset
        return None

    def _fields(self, segment: tuple[int, ...]) -> tuple[int, int, int, int, int]:
        """(type, file offset, vaddr, file size, memory size) of a program header."""
        if self.wide:  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
            return segment[0], segment[2], segment[3], segment[5], segment[6]
        # p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align
        return segment[0], segment[1], segment[2], segment[4], segment[5]

    def string(self, offset: int) -> str:
        end = self.data.find(b"\0", offset)
        if offset >= len(self.data) or end < 0:
            raise ElfError(f"string at {offset} runs past the end of the file")
        return self.data[offset:end].decode(errors="replace")
