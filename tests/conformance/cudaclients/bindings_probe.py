"""Run by the cuda-clients venv's Python (hack/install-cuda-clients.sh), not by pytest: NVIDIA's
cuda-bindings driving the driver API on CUDA device 0, one `key value` line per check, for
tests/conformance/test_cuda_bindings.py. Every allocation runs into the same 1 GiB when the control
library enforces CUDA_MEM_LIMIT_0=1g; without it the fake GPU's 40 GiB are there. Each check frees
what it took, so the next starts from nothing used."""

from __future__ import annotations

from collections.abc import Callable

from cuda.bindings import driver as cu

MIB = 1 << 20
STEP = 256 * MIB
#: allocations per fill at most: 2 GiB, past a 1 GiB limit without reaching the GPU's 40 GiB
MAX_STEPS = 8
SUCCESS = cu.CUresult.CUDA_SUCCESS


def ok(result: tuple) -> object:
    """The value of a (CUresult, value...) tuple, which must be a success."""
    assert result[0] == SUCCESS, result
    return result[1] if len(result) == 2 else result[1:]


def say(key: str, *values: object) -> None:
    """One `key value...` line."""
    print(key, *values, flush=True)


def fill(alloc: Callable[[], tuple], free: Callable[[object], object]) -> tuple[int, int]:
    """STEP-sized allocations until one fails or MAX_STEPS succeed: (count, the failing CUresult or 0);
    then frees them."""
    held, error = [], 0
    while len(held) < MAX_STEPS:
        result = alloc()
        if result[0] != SUCCESS:
            error = int(result[0])
            break
        held.append(result[1])
    for ptr in held:
        free(ptr)
    return len(held), error


def mem_info() -> tuple[int, int]:
    free, total = ok(cu.cuMemGetInfo())
    return int(free), int(total)


def plain(device: object) -> None:
    """cuMemAlloc fills, the limit to the MiB, cuMemGetInfo with memory held."""
    say("fill", *fill(lambda: cu.cuMemAlloc(STEP), cu.cuMemFree))
    half = ok(cu.cuMemAlloc(512 * MIB))
    over = cu.cuMemAlloc(513 * MIB)
    if over[0] == SUCCESS:
        ok(cu.cuMemFree(over[1]))
    say("over_by_1mib", int(over[0]))
    exact = ok(cu.cuMemAlloc(512 * MIB))
    say("info_full", *mem_info())
    ok(cu.cuMemFree(exact))
    ok(cu.cuMemFree(half))
    held = ok(cu.cuMemAlloc(384 * MIB))
    say("info_384mib", *mem_info())
    ok(cu.cuMemFree(held))


def stream_ordered(device: object) -> None:
    """cuMemAllocAsync on a created stream, and from the device's default pool."""
    stream = ok(cu.cuStreamCreate(0))
    pool = ok(cu.cuDeviceGetDefaultMemPool(device))

    def free(ptr: object) -> None:
        ok(cu.cuMemFreeAsync(ptr, stream))

    say("async_fill", *fill(lambda: cu.cuMemAllocAsync(STEP, stream), free))
    say("pool_fill", *fill(lambda: cu.cuMemAllocFromPoolAsync(STEP, pool, stream), free))
    ok(cu.cuStreamSynchronize(stream))
    ok(cu.cuStreamDestroy(stream))


def vmm(device: object) -> None:
    """cuMemCreate of physical memory, mapped into a reserved range: the same limit as cuMemAlloc."""
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = int(device)
    granularity = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    say("vmm_granularity", ok(cu.cuMemGetAllocationGranularity(prop, granularity)))
    handle = ok(cu.cuMemCreate(768 * MIB, prop, 0))
    va = ok(cu.cuMemAddressReserve(768 * MIB, 0, 0, 0))
    ok(cu.cuMemMap(va, 768 * MIB, 0, handle, 0))
    access = cu.CUmemAccessDesc()
    access.location = prop.location
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ok(cu.cuMemSetAccess(va, 768 * MIB, [access], 1))
    beside = cu.cuMemAlloc(512 * MIB)  # 768 MiB mapped + 512 MiB > 1 GiB
    say("vmm_then_alloc", int(beside[0]))
    if beside[0] == SUCCESS:
        ok(cu.cuMemFree(beside[1]))
    rest = cu.cuMemCreate(256 * MIB, prop, 0)  # ends exactly at 1 GiB
    more = cu.cuMemCreate(2 * MIB, prop, 0)
    say("vmm_rest_and_more", int(rest[0]), int(more[0]))
    for extra in (rest, more):
        if extra[0] == SUCCESS:
            ok(cu.cuMemRelease(extra[1]))
    ok(cu.cuMemUnmap(va, 768 * MIB))
    ok(cu.cuMemAddressFree(va, 768 * MIB))
    ok(cu.cuMemRelease(handle))
    say("vmm_released_info", *mem_info())


def copies() -> None:
    """Bytes in and out of a device allocation (the library passes copies through untouched)."""
    ptr = ok(cu.cuMemAlloc(MIB))
    ok(cu.cuMemcpyHtoD(ptr, b"vgpud", 5))
    out = bytearray(5)
    ok(cu.cuMemcpyDtoH(out, ptr, 5))
    ok(cu.cuMemFree(ptr))
    say("copy", out.decode())


def main() -> None:
    ok(cu.cuInit(0))
    say("driver_version", ok(cu.cuDriverGetVersion()))
    say("device_count", ok(cu.cuDeviceGetCount()))
    device = ok(cu.cuDeviceGet(0))
    say("name", ok(cu.cuDeviceGetName(64, device)).split(b"\0")[0].decode())
    ctx = ok(cu.cuCtxCreate(0, device))
    plain(device)
    stream_ordered(device)
    vmm(device)
    copies()
    ok(cu.cuCtxDestroy(ctx))
    say("done", 1)


if __name__ == "__main__":
    main()
