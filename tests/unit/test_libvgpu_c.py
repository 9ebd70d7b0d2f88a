"""csrc/libvgpu's C unit tests (built by `make build`), run here so `make test` runs them, plus a
cross-check of the C HPACK tables against the independent python `hpack` package."""

from __future__ import annotations

import re

import pytest
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.table import HeaderTable

from tests.support import REPO
from tests.unit.libvgpu.cbuild import check_c_test, makefile_tests

LIBVGPU = REPO / "csrc" / "libvgpu"


@pytest.mark.needs_build
@pytest.mark.parametrize("name", makefile_tests("TESTS"))
def test_c_unit_tests(name: str) -> None:
    check_c_test(name)


def test_huffman_table_matches_python_hpack() -> None:
    """RFC 7541 Appendix B as transcribed in C, entry by entry, against python hpack's copy."""
    text = (LIBVGPU / "src" / "huffman_table.c").read_text()
    entries = [(int(code, 16), int(bits)) for code, bits in re.findall(r"\{0x([0-9a-f]+),\s*(\d+)\}", text)]
    assert entries == list(zip(REQUEST_CODES, REQUEST_CODES_LENGTH, strict=True))


def test_static_table_matches_python_hpack() -> None:
    """RFC 7541 Appendix A as transcribed in C against python hpack's copy."""
    text = (LIBVGPU / "src" / "hpack_table.c").read_text()
    body = text[text.index("hpack_static_table[") :]
    entries = re.findall(r'\{"([^"]*)", "([^"]*)"\}', body)
    assert [(n.encode(), v.encode()) for n, v in entries] == list(HeaderTable.STATIC_TABLE)
