"""csrc/libvgpu's C unit tests (built by `make build`), run here so `make test` runs them, plus a
cross-check of the C HPACK tables against the independent python `hpack` package."""

from __future__ import annotations

import re
import subprocess

import pytest
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.table import HeaderTable

from tests.support import REPO, built

LIBVGPU = REPO / "csrc" / "libvgpu"


def _c_tests() -> list[str]:
    """The TESTS list of csrc/libvgpu/Makefile, so a new C test is picked up without editing this file."""
    text = (LIBVGPU / "Makefile").read_text()
    match = re.search(r"^TESTS\s*:=\s*(.+)$", text, re.MULTILINE)
    assert match, "csrc/libvgpu/Makefile has no TESTS line"
    return match.group(1).split()


@pytest.mark.needs_build
@pytest.mark.parametrize("name", _c_tests())
def test_c_unit_tests(name: str) -> None:
    binary = built(f"libvgpu/tests/{name}")
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert re.search(rf"^{name}: \d+ checks, 0 failed$", result.stdout, re.MULTILINE), output


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
