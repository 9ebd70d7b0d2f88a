"""The core limit's C unit tests (csrc/libvgpu CORE_TESTS, built by `make build`): the token bucket and
controller as pure units, and the shared bucket file with real processes (lost updates, refill
election, sampler election and takeover after SIGKILL)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support import REPO, built


def _core_tests() -> list[str]:
    """The CORE_TESTS list of csrc/libvgpu/Makefile, so a new core C test is picked up here."""
    text = (REPO / "csrc" / "libvgpu" / "Makefile").read_text()
    match = re.search(r"^CORE_TESTS\s*:=\s*(.+)$", text, re.MULTILINE)
    assert match, "csrc/libvgpu/Makefile has no CORE_TESTS line"
    return match.group(1).split()


@pytest.mark.needs_build
@pytest.mark.parametrize("name", _core_tests())
def test_core_c_unit_tests(name: str) -> None:
    binary = built(f"libvgpu/tests/{name}")
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert re.search(rf"^{name}: \d+ checks, 0 failed$", result.stdout, re.MULTILINE), output
