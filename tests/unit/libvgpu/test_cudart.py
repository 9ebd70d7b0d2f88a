"""The real CUDA runtime (libcudart.so.12) over the fake driver, under the control library: it
fetches its whole driver table through the library's dlsym and cuGetProcAddress hooks and gets
exactly as far as without the library (tests/unit/fakes/test_cudart.py: up to the driver's
private export table, which the fake does not serve)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import built
from tests.unit.fakes.conftest import Env, gpu_env  # noqa: F401 (the fakes' fixture, used here too)
from tests.unit.fakes.test_cudart import run_cudart
from tests.unit.libvgpu.conftest import MIB


def test_cudart_initialises_the_same_under_the_library(gpu_env: Env, tmp_path: Path) -> None:  # noqa: F811
    lib = built("libvgpu/libvgpu-control.so")
    plain_env = gpu_env(cuda="12.8")
    plain, plain_trace = run_cudart(plain_env)
    hooked_env = {
        **plain_env,
        "LD_PRELOAD": str(lib),
        "VGPU_LOCK_DIR": str(tmp_path / "lock"),
        "VGPU_VMEM_NODE_DIR": str(tmp_path / "vmem"),
        "VGPU_SM_NODE_DIR": str(tmp_path / "sm"),
        "VGPU_CONFIG_DIR": str(tmp_path / "config"),
        "CUDA_MEM_LIMIT": str(256 * MIB),
    }
    hooked, hooked_trace = run_cudart(hooked_env)
    assert hooked == plain
    assert hooked["driver"] == [0, 12080]
    lookups = re.compile(r'cuGetProcAddress\("(\w+)", (\d+), (\d)\) = (\w+)')
    seen = set(lookups.findall(hooked_trace))
    assert ("cuMemAlloc", "3020", "0", "cuMemAlloc_v2") in seen
    assert ("cuMemAllocAsync", "11020", "2", "cuMemAllocAsync_ptsz") in seen
    assert seen == set(lookups.findall(plain_trace))
    assert "vgpu:" not in hooked_trace.replace("vgpu: warning: partition directories", "")
