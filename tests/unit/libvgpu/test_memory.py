"""The memory limit in real processes: the fake driver + fake NVML under LD_PRELOAD of the
library. The fake driver itself has 40 GiB per GPU, so every refusal below the limit is the
library's."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.unit.libvgpu.conftest import MIB, PHYSICAL, UUIDS, Container, read_result

LIMIT = 1024 * MIB
CUDA_ERROR_OUT_OF_MEMORY = "2"
DOORS = [
    "direct",  # the application's import, bound to the preloaded hook
    "dlsym",  # dlsym(libcuda handle, "cuMemAlloc_v2")
    "next",  # dlsym(RTLD_NEXT, ...)
    "gpa",  # cuGetProcAddress("cuMemAlloc", 12000, 0)
    "gpa2",  # cuGetProcAddress_v2
    "gpa2ptsz",  # cuGetProcAddress_v2("cuMemAllocAsync", flags=PER_THREAD) -> _ptsz
    "v1",  # the 32-bit cuMemAlloc
    "pitch",
    "managed",
    "async",
    "asyncptsz",
    "pool",
    "create",  # cuMemCreate, device location
    "array",  # cuArrayCreate_v2, size from the descriptor
]


@pytest.mark.parametrize("door", DOORS)
def test_out_of_memory_at_the_limit_through_every_door(container: Container, door: str) -> None:
    got = container.run("fill", door, str(128 * MIB), CUDA_MEM_LIMIT_0="1024m")
    assert (got["count"], got["error"]) == ("8", CUDA_ERROR_OUT_OF_MEMORY), got


def test_the_same_fill_without_the_library_is_not_limited(container: Container) -> None:
    got = container.run("fill", "direct", str(4096 * MIB), preload=False, CUDA_MEM_LIMIT_0="1024m")
    assert int(got["count"]) == PHYSICAL // (4096 * MIB)


def test_the_limit_is_exact_to_the_byte(container: Container) -> None:
    assert container.run("fill", "direct", str(LIMIT), CUDA_MEM_LIMIT_0="1g")["count"] == "1"
    over = container.run("fill", "direct", str(LIMIT + 1), CUDA_MEM_LIMIT_0="1g")
    assert (over["count"], over["error"]) == ("0", CUDA_ERROR_OUT_OF_MEMORY)


def test_index_suffix_wins_and_empty_means_unlimited(container: Container) -> None:
    got = container.run("fill", "direct", str(256 * MIB), CUDA_MEM_LIMIT_0="512m", CUDA_MEM_LIMIT="2g")
    assert got["count"] == "2"
    got = container.run("fill", "direct", str(256 * MIB), CUDA_MEM_LIMIT="768m")
    assert got["count"] == "3"
    got = container.run("fill", "direct", str(8192 * MIB), CUDA_MEM_LIMIT_0="", CUDA_MEM_LIMIT="768m")
    assert int(got["count"]) == PHYSICAL // (8192 * MIB)


def test_limited_views(container: Container) -> None:
    holder = container.start("fill", "direct", str(384 * MIB), "hold", CUDA_MEM_LIMIT_0="1024m")
    try:
        # The holder fills to 768 MiB (two 384 MiB chunks), then holds.
        assert read_result(holder, ("count", "total", "error"))["count"] == "2"
        got = container.run("info", CUDA_MEM_LIMIT_0="1024m")
    finally:
        holder.communicate(timeout=30)
    assert got["meminfo_rc"] == "0" and got["totalmem_rc"] == "0" and got["nvml_rc"] == "0"
    assert int(got["meminfo_total"]) == LIMIT
    assert int(got["totalmem"]) == LIMIT
    assert int(got["nvml_total"]) == LIMIT
    used = int(got["nvml_used"])
    assert used >= 768 * MIB
    assert int(got["meminfo_free"]) == LIMIT - used
    assert int(got["nvml_free"]) == LIMIT - used


def test_view_never_above_physical_and_unlimited_is_physical(container: Container) -> None:
    got = container.run("info", CUDA_MEM_LIMIT_0="100g")
    assert int(got["meminfo_total"]) == PHYSICAL and int(got["nvml_total"]) == PHYSICAL
    got = container.run("info", CUDA_MEM_LIMIT_1="1g")
    assert int(got["meminfo_total"]) == PHYSICAL and int(got["totalmem"]) == PHYSICAL


def test_usage_above_the_limit_is_no_error_and_no_underflow(container: Container) -> None:
    """Another process of the container (mode 0: every process on the GPU) holds more than the
    limit: the views stay valid, free is 0, used is capped at the limit."""
    holder = container.start("take", str(512 * MIB), preload=False)
    try:
        assert read_result(holder, ("rc",))["rc"] == "0"
        got = container.run("info", CUDA_MEM_LIMIT_0="256m")
    finally:
        holder.communicate(timeout=30)
    assert got["meminfo_rc"] == "0" and got["nvml_rc"] == "0"
    assert int(got["meminfo_total"]) == 256 * MIB
    assert int(got["meminfo_free"]) == 0
    assert int(got["nvml_used"]) == 256 * MIB and int(got["nvml_free"]) == 0


def test_processes_share_one_limit(container: Container) -> None:
    """Four processes fill concurrently with equal chunks: together exactly the limit."""
    procs = [
        container.start("fill", "direct", str(64 * MIB), "hold", CUDA_MEM_LIMIT_0="1024m") for _ in range(4)
    ]
    try:
        totals = [int(read_result(p, ("count", "total", "error"))["total"]) for p in procs]
    finally:
        for p in procs:
            p.communicate(timeout=30)
    assert sum(totals) == LIMIT, totals


def test_no_overshoot_under_concurrent_random_sizes(container: Container) -> None:
    procs = [
        container.start("random", str(seed), str(96 * MIB), CUDA_MEM_LIMIT_0="1024m") for seed in range(1, 7)
    ]
    try:
        totals = [int(read_result(p)["total"]) for p in procs]
        # While they all still hold their memory, the fake NVML (no library) sees the sum.
        seen = int(container.run("info", preload=False)["nvml_used"])
    finally:
        for p in procs:
            p.communicate(timeout=30)
    assert sum(totals) <= LIMIT, totals
    assert seen == sum(totals)
    # Twenty refusals in a row each: the device is full to within the largest chunk.
    assert sum(totals) > LIMIT - 96 * MIB, totals


F_OFD_SETLK = 37


def test_sigkilled_lock_holder_blocks_nobody(container: Container) -> None:
    lock_dir = container.root / "lock"
    lock_dir.mkdir(exist_ok=True)
    holder = subprocess.Popen(
        [
            "python3",
            "-c",
            "import fcntl, struct, sys, time\n"
            f"f = open({str(lock_dir / 'vgpu_0.lock')!r}, 'a+')\n"
            f"fcntl.fcntl(f, {F_OFD_SETLK}, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0))\n"
            "print('locked', flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    waiter = container.start("fill", "direct", str(128 * MIB), CUDA_MEM_LIMIT_0="1024m")
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=1)  # blocked on the lock the holder has
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        out, err = waiter.communicate(timeout=30)
    finally:
        waiter.kill()
        holder.kill()
    assert waiter.returncode == 0, err
    assert "count 8" in out


def test_sigkilled_allocator_loses_nothing(container: Container) -> None:
    victim = container.start("fill", "direct", str(256 * MIB), "hold", CUDA_MEM_LIMIT_0="1024m")
    assert read_result(victim, ("count", "total", "error"))["count"] == "4"
    victim.kill()
    victim.wait()
    assert container.run("fill", "direct", str(256 * MIB), CUDA_MEM_LIMIT_0="1024m")["count"] == "4"


def test_forked_child_shares_the_limit(container: Container) -> None:
    got = container.run("fork", str(256 * MIB), CUDA_MEM_LIMIT_0="1024m")
    assert got["parent_rc"] == "0"
    assert (got["count"], got["error"]) == ("3", CUDA_ERROR_OUT_OF_MEMORY)


@pytest.mark.parametrize("visible", ["1", "1,0"])
def test_reordered_cuda_visible_devices_maps_by_uuid(container: Container, visible: str) -> None:
    """Ordinal 0 is host GPU 1 here: its limit (512 MiB) applies, not GPU 0's."""
    limits = {"CUDA_MEM_LIMIT_0": "256m", "CUDA_MEM_LIMIT_1": "512m", "CUDA_VISIBLE_DEVICES": visible}
    got = container.run("info", PROBE_NVML_UUID=UUIDS[1], **limits)
    assert int(got["totalmem"]) == 512 * MIB and int(got["meminfo_total"]) == 512 * MIB
    assert int(got["nvml_total"]) == 512 * MIB
    assert container.run("fill", "direct", str(128 * MIB), **limits)["count"] == "4"


def test_proc_addresses_belong_to_the_library(container: Container) -> None:
    got = container.run("owners", CUDA_MEM_LIMIT_0="1024m")
    lib = str(container.lib)
    assert got["gpa.cuMemAlloc"] == f"{lib}:cuMemAlloc_v2"
    assert got["gpa2.cuMemAlloc"] == f"{lib}:cuMemAlloc_v2"
    assert got["gpa2.cuMemAllocAsync"] == f"{lib}:cuMemAllocAsync"
    assert got["gpa2.cuMemAllocAsync.ptsz"] == f"{lib}:cuMemAllocAsync_ptsz"
    assert got["gpa2.cuMemFreeAsync.ptsz"] == f"{lib}:cuMemFreeAsync_ptsz"
    assert got["gpa2.cuMemGetInfo"] == f"{lib}:cuMemGetInfo_v2"
    assert got["gpa2.cuGetProcAddress"] == f"{lib}:cuGetProcAddress_v2"
    assert got["gpa.cuGetProcAddress"] == f"{lib}:cuGetProcAddress_v2"
    assert got["gpa2.cuDeviceGet"] == f"{lib}:cuDeviceGet"  # the device gate
    # Known but not hooked: the driver's own function.
    name = got["gpa2.cuDeviceGetName"]
    assert name.endswith(":cuDeviceGetName") and not name.startswith(lib)


def test_pinned_host_memory_is_undone_when_already_over(container: Container) -> None:
    assert container.run("host", str(64 * MIB), CUDA_MEM_LIMIT_0="256m") == {
        "hostalloc_rc": "0",
        "hostalloc_null": "0",
        "register_rc": "0",
        "unregister_rc": "0",
    }
    outsider = container.start("take", str(512 * MIB), preload=False)
    try:
        assert read_result(outsider, ("rc",))["rc"] == "0"
        got = container.run("host", str(64 * MIB), CUDA_MEM_LIMIT_0="256m")
    finally:
        outsider.communicate(timeout=30)
    assert (got["hostalloc_rc"], got["hostalloc_null"], got["register_rc"]) == (
        CUDA_ERROR_OUT_OF_MEMORY,
        "1",
        "2",
    )
    assert got["unregister_rc"] != "0"  # the registration was undone


def test_nvml_calls_of_a_limited_device(container: Container) -> None:
    got = container.run("nvml", CUDA_MEM_LIMIT_0="1024m")
    assert got["setcompute_rc"] == "3"  # NVML_ERROR_NOT_SUPPORTED
    assert (got["persistence_rc"], got["persistence"]) == ("0", "0")
    assert got["mem2_rc"] == "0" and int(got["mem2_total"]) == LIMIT
    parts = int(got["mem2_used"]) + int(got["mem2_reserved"]) + int(got["mem2_free"])
    assert parts == LIMIT


def test_a_process_in_both_nvml_lists_counts_once(container: Container) -> None:
    """FAKE_GPU_GRAPHICS=1: every process also shows as a graphics process."""
    got = container.run("fill", "direct", str(128 * MIB), CUDA_MEM_LIMIT_0="1024m", FAKE_GPU_GRAPHICS="1")
    assert got["count"] == "8"


def test_forked_children_exclude_each_other(container: Container) -> None:
    """Children forked from a process whose library is initialised (CUDA is set up after the
    fork, as it must be) fill at random, released together: the library state they inherit must
    not let them overshoot the shared limit. A race, so several rounds."""
    for _ in range(8):
        proc = container.start("forkrandom", "4", str(96 * MIB), CUDA_MEM_LIMIT_0="1024m")
        try:
            got = read_result(proc, ("child0", "child1", "child2", "child3"))
        finally:
            proc.communicate(timeout=60)
        children = [int(got[f"child{i}"]) for i in range(4)]
        assert sum(children) <= LIMIT, children
        assert sum(children) > LIMIT - 96 * MIB, children
