"""The environment every fake-GPU scenario runs in: a profile, a state file, the built fakes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import built
from tests.unit.fakes.gpu import CUDA_LIB, NVML_LIB, profile_text

Env = Callable[..., dict[str, str]]


@pytest.fixture
def gpu_env(tmp_path: Path) -> Env:
    """gpu_env(cuda="12.4", memory_gib=8, **VAR) -> the child environment for a fresh state file."""
    cuda_lib, nvml_lib = str(built(CUDA_LIB)), str(built(NVML_LIB))

    def make(cuda: str = "12.4", memory_gib: int = 8, **extra: str) -> dict[str, str]:
        profile = tmp_path / f"profile-{cuda}-{memory_gib}.yaml"
        profile.write_text(profile_text(cuda, memory_gib))
        return {
            "FAKE_NVML_PROFILE": str(profile),
            "FAKE_GPU_STATE": str(tmp_path / "gpu.state"),
            "FAKE_CUDA_LIB": cuda_lib,
            "FAKE_NVML_LIB": nvml_lib,
            **extra,
        }

    return make
