"""The core limit's C unit tests (csrc/libvgpu CORE_TESTS, built by `make build`): the token bucket and
controller as pure units, and the shared bucket file with real processes (lost updates, refill
election, sampler election and takeover after SIGKILL)."""

from __future__ import annotations

import pytest

from tests.unit.libvgpu.cbuild import check_c_test, makefile_tests


@pytest.mark.needs_build
@pytest.mark.parametrize("name", makefile_tests("CORE_TESTS"))
def test_core_c_unit_tests(name: str) -> None:
    check_c_test(name)
