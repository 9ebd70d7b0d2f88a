"""NVIDIA's cuda-bindings (12.9, the driver API as NVIDIA's own Python binding calls it: every entry
point resolved through cuGetProcAddress) over the fake driver, in a simulated container with
libvgpu-control.so preloaded and CUDA_MEM_LIMIT_0=1g, and the same program without the library.

Under the library every way of taking device memory (cuMemAlloc, cuMemAllocAsync on a created
stream, cuMemAllocFromPoolAsync on the device's default pool, cuMemCreate mapped with the VMM calls)
stops at the same 1 GiB, to the MiB, and cuMemGetInfo shows total = the limit and free = the limit
minus what is held. Without it the fake GPU's 40 GiB are there. One probe run each
(tests/conformance/cudaclients/bindings_probe.py): `key value...` lines."""

from __future__ import annotations

import pytest

from tests.cudaclients import ClientContainer, clients_python
from tests.unit.libvgpu.conftest import MIB, PHYSICAL

LIMIT = 1024 * MIB
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
PROBE = "bindings_probe.py"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    container = ClientContainer(tmp_path_factory.mktemp("bindings-limited"), clients_python())
    return container.run(PROBE, preload=True, CUDA_MEM_LIMIT_0="1g")


@pytest.fixture(scope="module")
def unlimited(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The same probe and env, the library not preloaded (its limit variable set all the same)."""
    container = ClientContainer(tmp_path_factory.mktemp("bindings-plain"), clients_python())
    return container.run(PROBE, preload=False, CUDA_MEM_LIMIT_0="1g")


def values(*numbers: int) -> str:
    return " ".join(map(str, numbers))


def test_the_binding_finds_the_fake_gpus_either_way(
    limited: dict[str, str], unlimited: dict[str, str]
) -> None:
    for got in (limited, unlimited):
        assert got["driver_version"] == "12040"  # the profile's CUDA 12.4
        assert got["device_count"] == "2"
        assert got["name"] == "NVIDIA A100-SXM4-40GB"
        assert got["copy"] == "vgpud"  # bytes through cuMemcpyHtoD / cuMemcpyDtoH, the library or not
        assert got["done"] == "1"


def test_cu_mem_alloc_stops_at_the_limit_to_the_mib(limited: dict[str, str]) -> None:
    assert limited["fill"] == values(4, OOM)  # 4 x 256 MiB, the 5th refused
    assert limited["over_by_1mib"] == str(OOM)  # 512 MiB held, 513 more would cross by 1 MiB
    assert limited["info_full"] == values(0, LIMIT)  # ... and 512 MiB more end exactly at it


def test_cu_mem_get_info_is_the_limited_view(limited: dict[str, str]) -> None:
    assert limited["info_384mib"] == values(LIMIT - 384 * MIB, LIMIT)
    assert limited["vmm_released_info"] == values(LIMIT, LIMIT)  # all freed: nothing counted


def test_stream_ordered_allocations_stop_at_the_same_limit(limited: dict[str, str]) -> None:
    assert limited["async_fill"] == values(4, OOM)
    assert limited["pool_fill"] == values(4, OOM)


def test_vmm_memory_counts_against_the_same_limit(limited: dict[str, str]) -> None:
    assert limited["vmm_granularity"] == str(2 * MIB)
    assert limited["vmm_then_alloc"] == str(OOM)  # 768 MiB created and mapped, 512 MiB more refused
    assert limited["vmm_rest_and_more"] == values(0, OOM)  # 256 MiB more fits exactly; 2 MiB does not


def test_without_the_library_the_whole_gpu_is_there(unlimited: dict[str, str]) -> None:
    assert unlimited["fill"] == values(8, 0)  # 2 GiB, past the 1 GiB the library would allow
    assert unlimited["over_by_1mib"] == "0"
    assert unlimited["info_full"] == values(PHYSICAL - LIMIT, PHYSICAL)
    assert unlimited["info_384mib"] == values(PHYSICAL - 384 * MIB, PHYSICAL)
    assert unlimited["async_fill"] == unlimited["pool_fill"] == values(8, 0)
    assert unlimited["vmm_then_alloc"] == "0"
    assert unlimited["vmm_rest_and_more"] == values(0, 0)
