"""The fake libcuda's memory functions: what each charges to the device, and OOM at the device's size."""

from __future__ import annotations

from tests.unit.fakes.conftest import Env
from tests.unit.fakes.gpu import GIB, MIB, run

# Each child: init, use ordinal 0, then the scenario; `used()`: the device's used bytes per cuMemGetInfo.
SETUP = """
cuda.init()
cuda.use(0)
def used():
    free, total = cuda.mem_info()
    return total - free
def rc_alloc(name, size):
    return cuda(name, ref(u64()), sz(size))
"""


def test_alloc_free_and_info(gpu_env: Env) -> None:
    report = run(
        SETUP + "a = cuda.alloc(GIB)\n"
        "b = cuda.alloc(3 * GIB)\n"
        "after_alloc = used()\n"
        "over = rc_alloc('cuMemAlloc_v2', 4 * GIB + 1)\n"
        "fits = rc_alloc('cuMemAlloc_v2', 4 * GIB)\n"
        "full = used()\n"
        "cuda.free(a)\n"
        "double_free = cuda('cuMemFree_v2', u64(a))\n"
        "zero = rc_alloc('cuMemAlloc_v2', 0)\n"
        "emit(after_alloc=after_alloc, over=over, fits=fits, full=full, after_free=used(),\n"
        "     double_free=double_free, zero=zero, total=cuda.mem_info()[1], distinct=a != b)",
        gpu_env(memory_gib=8),
    )
    assert report == {
        "after_alloc": 4 * GIB,
        "over": 2,  # CUDA_ERROR_OUT_OF_MEMORY
        "fits": 0,
        "full": 8 * GIB,
        "after_free": 7 * GIB,
        "double_free": 1,
        "zero": 1,
        "total": 8 * GIB,
        "distinct": True,
    }


def test_v1_forms_use_32_bit_pointers_and_sizes(gpu_env: Env) -> None:
    report = run(
        SETUP + "p = ctypes.c_uint()\n"
        "cuda.ok('cuMemAlloc', ref(p), ctypes.c_uint(64 * MIB))\n"
        "pitch = ctypes.c_uint()\n"
        "q = ctypes.c_uint()\n"
        "cuda.ok('cuMemAllocPitch', ref(q), ref(pitch), 1000, 10, 4)\n"
        "mid = used()\n"
        "cuda.ok('cuMemFree', p)\n"
        "cuda.ok('cuMemFree', q)\n"
        "free, total = ctypes.c_uint(), ctypes.c_uint()\n"
        "cuda.ok('cuMemGetInfo', ref(free), ref(total))\n"
        "emit(ptr_below_4g=0 < p.value < 2**32, pitch=pitch.value, mid=mid, end=used(), total=total.value)",
        gpu_env(memory_gib=8),
    )
    assert report == {
        "ptr_below_4g": True,
        "pitch": 1024,
        "mid": 64 * MIB + 1024 * 10,
        "end": 0,
        "total": 0xFFFFFFFF,
    }


def test_pitch_managed_async_pool(gpu_env: Env) -> None:
    report = run(
        SETUP + "p, pitch = u64(), sz()\n"
        "cuda.ok('cuMemAllocPitch_v2', ref(p), ref(pitch), 1000, 1000, 8)\n"
        "pitched = used()\n"
        "bad_elem = cuda('cuMemAllocPitch_v2', ref(p), ref(pitch), 1000, 10, 3)\n"
        "cuda.free(p.value)\n"
        "m = u64()\n"
        "cuda.ok('cuMemAllocManaged', ref(m), sz(16 * GIB), 1)\n"
        "ctypes.memset(m.value, 7, 4096)\n"  # managed memory is host-accessible
        "managed = used()\n"
        "bad_attach = cuda('cuMemAllocManaged', ref(m), sz(MIB), 4)\n"
        "s = cuda.stream()\n"
        "a = u64()\n"
        "cuda.ok('cuMemAllocAsync', ref(a), sz(GIB), vp(s))\n"
        "b = u64()\n"
        "cuda.ok('cuMemAllocAsync_ptsz', ref(b), sz(GIB), None)\n"
        "pool = vp()\n"
        "cuda.ok('cuDeviceGetDefaultMemPool', ref(pool), 1)\n"
        "c = u64()\n"
        "cuda.ok('cuMemAllocFromPoolAsync', ref(c), sz(GIB), pool, vp(s))\n"
        "async_used = used()\n"
        "cuda.ok('cuMemFreeAsync', a, vp(s))\n"
        "cuda.ok('cuMemFreeAsync_ptsz', b, None)\n"
        "after = used()\n"
        "cuda.ok('cuCtxSetCurrent', vp(cuda.use(1)))\n"
        "on_1 = used()\n"
        "cuda.ok('cuMemFreeAsync', c, vp(s))\n"
        "emit(pitched=pitched, pitch=pitch.value, bad_elem=bad_elem, managed=managed,\n"
        "     bad_attach=bad_attach,\n"
        "     async_used=async_used, after=after, on_1=on_1, on_1_end=used())",
        gpu_env(memory_gib=8),
    )
    assert report == {
        "pitched": 1024 * 1000,
        "pitch": 1024,
        "bad_elem": 1,
        "managed": 0,  # managed memory is not charged to the device
        "bad_attach": 1,
        "async_used": 2 * GIB,  # the pool's allocation went to ordinal 1
        "after": 0,
        "on_1": GIB,
        "on_1_end": 0,
    }


def test_pools_default_current_and_location_forms(gpu_env: Env) -> None:
    report = run(
        SETUP + "class Loc(ctypes.Structure):\n"
        "    _fields_ = [('type', ctypes.c_int), ('id', ctypes.c_int)]\n"
        "class PoolProps(ctypes.Structure):\n"
        "    _fields_ = [('allocType', ctypes.c_int), ('handleTypes', ctypes.c_int), ('location', Loc),\n"
        "                ('sec', ctypes.c_void_p), ('maxSize', ctypes.c_size_t),\n"
        "                ('usage', ctypes.c_ushort), ('reserved', ctypes.c_ubyte * 54)]\n"
        "default, mine, got = vp(), vp(), vp()\n"
        "cuda.ok('cuDeviceGetDefaultMemPool', ref(default), 1)\n"
        "cuda.ok('cuMemPoolCreate', ref(mine), ref(PoolProps(1, 0, Loc(1, 1))))\n"
        "other_device = cuda('cuDeviceSetMemPool', 0, mine)\n"
        "cuda.ok('cuDeviceSetMemPool', 1, mine)\n"
        "cuda.ok('cuDeviceGetMemPool', ref(got), 1)\n"
        "current = got.value == mine.value\n"
        "cuda.ok('cuMemGetMemPool', ref(got), ref(Loc(1, 1)), 1)\n"
        "by_location = got.value == mine.value\n"
        "cuda.ok('cuMemGetDefaultMemPool', ref(got), ref(Loc(1, 1)), 1)\n"
        "default_by_location = got.value == default.value\n"
        "host = cuda('cuMemGetDefaultMemPool', ref(got), ref(Loc(2, 0)), 1)\n"
        "destroy_default = cuda('cuMemPoolDestroy', default)\n"
        "cuda.ok('cuMemPoolDestroy', mine)\n"
        "cuda.ok('cuDeviceGetMemPool', ref(got), 1)\n"
        "emit(other_device=other_device, current=current, by_location=by_location,\n"
        "     default_by_location=default_by_location, host=host, destroy_default=destroy_default,\n"
        "     back_to_default=got.value == default.value)",
        gpu_env(memory_gib=8),
    )
    assert report == {
        "other_device": 1,  # a device's current pool must be local to it
        "current": True,
        "by_location": True,
        "default_by_location": True,
        "host": 801,  # the fake has no host pools
        "destroy_default": 1,
        "back_to_default": True,
    }


def test_vmm_create_reserve_map_release(gpu_env: Env) -> None:
    report = run(
        SETUP + "class Prop(ctypes.Structure):\n"
        "    _fields_ = [('type', ctypes.c_int), ('handleTypes', ctypes.c_int), ('locType', ctypes.c_int),\n"
        "                ('locId', ctypes.c_int), ('meta', ctypes.c_void_p), ('flags', ctypes.c_ubyte * 8)]\n"
        "gran = sz()\n"
        "prop = Prop(1, 0, 1, 0)\n"
        "cuda.ok('cuMemGetAllocationGranularity', ref(gran), ref(prop), 0)\n"
        "h = u64()\n"
        "cuda.ok('cuMemCreate', ref(h), sz(GIB), ref(prop), u64(0))\n"
        "created = used()\n"
        "odd = cuda('cuMemCreate', ref(u64()), sz(GIB + 1), ref(prop),\n"
        "           u64(0))\n"
        "too_big = cuda('cuMemCreate', ref(u64()), sz(8 * GIB),\n"
        "               ref(prop), u64(0))\n"
        "host = Prop(1, 0, 2, 0)\n"
        "hh = u64()\n"
        "cuda.ok('cuMemCreate', ref(hh), sz(GIB), ref(host), u64(0))\n"
        "with_host = used()\n"
        "va = u64()\n"
        "cuda.ok('cuMemAddressReserve', ref(va), sz(2 * GIB), sz(0),\n"
        "        u64(0), u64(0))\n"
        "mapped = cuda('cuMemMap', va, sz(GIB), sz(0), h, u64(0))\n"
        "outside = cuda('cuMemMap', u64(va.value + GIB), sz(2 * GIB),\n"
        "               sz(0), h, u64(0))\n"
        "cuda.ok('cuMemUnmap', va, sz(GIB))\n"
        "cuda.ok('cuMemAddressFree', va, sz(2 * GIB))\n"
        "cuda.ok('cuMemRelease', h)\n"
        "cuda.ok('cuMemRelease', hh)\n"
        "emit(gran=gran.value, created=created, odd=odd, too_big=too_big, with_host=with_host,\n"
        "     mapped=mapped,\n"
        "     outside=outside, released=used(), again=cuda('cuMemRelease', h))",
        gpu_env(memory_gib=8),
    )
    assert report == {
        "gran": 2 * MIB,
        "created": GIB,
        "odd": 1,
        "too_big": 2,
        "with_host": GIB,  # host-located physical memory is not device memory
        "mapped": 0,
        "outside": 1,
        "released": 0,
        "again": 1,
    }


def test_arrays_are_sized_from_their_descriptors(gpu_env: Env) -> None:
    report = run(
        SETUP + "class D2(ctypes.Structure):\n"
        "    _fields_ = [('w', sz), ('h', sz), ('f', ctypes.c_int), ('c', ctypes.c_uint)]\n"
        "class D3(ctypes.Structure):\n"
        "    _fields_ = [('w', sz), ('h', sz), ('d', sz),\n"
        "                ('f', ctypes.c_int), ('c', ctypes.c_uint), ('flags', ctypes.c_uint)]\n"
        "class D1(ctypes.Structure):\n"
        "    _fields_ = [('w', ctypes.c_uint), ('h', ctypes.c_uint), ('f', ctypes.c_int),\n"
        "                ('c', ctypes.c_uint)]\n"
        "sizes = []\n"
        "def measure(fn, desc, *extra):\n"
        "    before = used()\n"
        "    arr = vp()\n"
        "    cuda.ok(fn, ref(arr), ref(desc), *extra)\n"
        "    sizes.append(used() - before)\n"
        "    return arr\n"
        "a = measure('cuArrayCreate_v2', D2(1024, 1024, 0x20, 4))\n"
        "b = measure('cuArrayCreate', D1(1000, 0, 0x01, 1))\n"
        "c = measure('cuArray3DCreate_v2', D3(64, 64, 64, 0x10, 2, 0))\n"
        "m = measure('cuMipmappedArrayCreate', D3(256, 256, 0, 0x03, 1, 0), 3)\n"
        "bad = cuda('cuArrayCreate_v2', ref(vp()), ref(D2(16, 16, 0x20, 3)))\n"
        "too_big = cuda('cuArrayCreate_v2', ref(vp()), ref(D2(65536, 65536, 0x20, 4)))\n"
        "for fn, arr in (('cuArrayDestroy', a), ('cuArrayDestroy', b), ('cuArrayDestroy', c),\n"
        "                ('cuMipmappedArrayDestroy', m)):\n"
        "    cuda.ok(fn, arr)\n"
        "emit(sizes=sizes, bad=bad, too_big=too_big, end=used(), twice=cuda('cuArrayDestroy', a))",
        gpu_env(memory_gib=8),
    )
    assert report == {
        "sizes": [1024 * 1024 * 16, 1000, 64 * 64 * 64 * 4, (256 * 256 + 128 * 128 + 64 * 64) * 4],
        "bad": 1,
        "too_big": 2,
        "end": 0,
        "twice": 400,
    }


def test_host_memory_is_real_and_uncharged(gpu_env: Env) -> None:
    report = run(
        SETUP + "p = vp()\n"
        "cuda.ok('cuMemHostAlloc', ref(p), sz(64 * MIB), 1)\n"
        "ctypes.memset(p, 1, 64 * MIB)\n"
        "q = vp()\n"
        "cuda.ok('cuMemAllocHost_v2', ref(q), sz(MIB))\n"
        "buf = ctypes.create_string_buffer(MIB)\n"
        "cuda.ok('cuMemHostRegister_v2', buf, sz(MIB), 0)\n"
        "twice = cuda('cuMemHostRegister_v2', buf, sz(MIB), 0)\n"
        "dp = u64()\n"
        "cuda.ok('cuMemHostGetDevicePointer_v2', ref(dp), p, 0)\n"
        "charged = used()\n"
        "cuda.ok('cuMemHostUnregister', buf)\n"
        "cuda.ok('cuMemFreeHost', p)\n"
        "cuda.ok('cuMemFreeHost', q)\n"
        "bad_flags = cuda('cuMemHostAlloc', ref(p), sz(MIB), 8)\n"
        "emit(charged=charged, twice=twice, same_address=dp.value == p.value, bad_flags=bad_flags,\n"
        "     unregistered=cuda('cuMemHostUnregister', buf))",
        gpu_env(memory_gib=8),
    )
    assert report == {"charged": 0, "twice": 1, "same_address": True, "bad_flags": 1, "unregistered": 1}


def test_a_context_takes_its_memory_with_it(gpu_env: Env) -> None:
    report = run(
        SETUP + "cuda.alloc(GIB)\n"
        "ctx = vp()\n"
        "cuda.ok('cuCtxCreate_v2', ref(ctx), 0, 0)\n"
        "cuda.alloc(2 * GIB)\n"
        "both = used()\n"
        "cuda.ok('cuCtxDestroy_v2', ctx)\n"
        "cuda.use(0)\n"
        "after_destroy = used()\n"
        "cuda.ok('cuDevicePrimaryCtxRelease_v2', 0)\n"
        "still_retained = used()\n"  # use() retained twice
        "cuda.ok('cuDevicePrimaryCtxRelease_v2', 0)\n"
        "gone = cuda('cuMemGetInfo_v2', ref(sz()), ref(sz()))\n"
        "cuda.use(0)\n"
        "end = used()\n"
        "over_release = [cuda('cuDevicePrimaryCtxRelease_v2', 0), cuda('cuDevicePrimaryCtxRelease_v2', 0)]\n"
        "emit(both=both, after_destroy=after_destroy, still_retained=still_retained, gone=gone, end=end,\n"
        "     over_release=over_release)",
        gpu_env(memory_gib=8),
    )
    assert report == {
        "both": 3 * GIB,
        "after_destroy": GIB,
        "still_retained": GIB,
        "gone": 201,
        "end": 0,
        "over_release": [0, 201],
    }
