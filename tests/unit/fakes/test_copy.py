"""The fake libcuda's copies: bytes copied into a device allocation come back out (host bytes mapped
behind it on its first copy), a range outside one allocation is refused, and a synchronous copy waits
for the kernels before it while an Async one does not."""

from __future__ import annotations

from tests.unit.fakes.conftest import Env
from tests.unit.fakes.gpu import run

NS = 100_000  # FAKE_GPU_NS_PER_BLOCK: 0.1 ms per block

SETUP = """
cuda.init()
cuda.use(0)
def put(name, dst, data, *stream):
    return cuda(name, u64(dst), ctypes.c_char_p(data), sz(len(data)), *stream)
def get(name, src, n, *stream):
    buf = ctypes.create_string_buffer(n)
    rc = cuda(name, buf, u64(src), sz(n), *stream)
    return [rc, buf.raw.decode(errors='replace')]
"""


def test_bytes_round_trip_through_every_copy(gpu_env: Env) -> None:
    report = run(
        SETUP + "a, b = cuda.alloc(MIB), cuda.alloc(MIB)\n"
        "cuda.ok('cuMemcpyHtoD_v2', u64(a + 100), ctypes.c_char_p(b'hello'), sz(5))\n"
        "cuda.ok('cuMemcpyDtoD_v2', u64(b), u64(a + 100), sz(5))\n"
        "s = cuda.stream()\n"
        "put('cuMemcpyHtoDAsync_v2', b + 5, b' world', vp(s))\n"
        "cuda.ok('cuMemcpyDtoDAsync_v2', u64(a), u64(b), sz(11), vp(s))\n"
        "cuda.ok('cuStreamSynchronize', vp(s))\n"
        "put('cuMemcpyHtoD_v2_ptds', a + MIB - 3, b'end')\n"
        "m = u64()\n"
        "cuda.ok('cuMemAllocManaged', ref(m), sz(MIB), 1)\n"
        "put('cuMemcpyHtoD_v2', m.value, b'managed')\n"
        "big = cuda.alloc(6 * GIB)\n"  # of 8 GiB: only the pages copied to use host memory
        "put('cuMemcpyHtoD_v2', big + 6 * GIB - 4, b'last')\n"
        "emit(sync=get('cuMemcpyDtoH_v2', b, 5), async_=get('cuMemcpyDtoHAsync_v2', a, 11, vp(s)),\n"
        "     ptds=get('cuMemcpyDtoH_v2_ptds', a + MIB - 3, 3),\n"
        "     managed=ctypes.string_at(m.value, 7).decode(),\n"
        "     big=get('cuMemcpyDtoH_v2', big + 6 * GIB - 4, 4),\n"
        "     untouched=get('cuMemcpyDtoH_v2', b + 11, 4))",
        gpu_env(memory_gib=8),
    )
    assert report == {
        "sync": [0, "hello"],
        "async_": [0, "hello world"],
        "ptds": [0, "end"],
        "managed": "managed",  # managed memory is the host's: a copy writes it in place
        "big": [0, "last"],
        "untouched": [0, "\0\0\0\0"],  # the backing starts zeroed
    }


def test_a_range_outside_one_allocation_is_refused(gpu_env: Env) -> None:
    report = run(
        SETUP + "a = cuda.alloc(MIB)\n"
        "gone = cuda.alloc(MIB)\n"
        "cuda.free(gone)\n"
        "s = cuda.stream()\n"
        "cuda.ok('cuStreamBeginCapture_v2', vp(s), 0)\n"
        "capturing = put('cuMemcpyHtoDAsync_v2', a, b'x', vp(s))\n"
        "cuda.ok('cuStreamEndCapture', vp(s), ref(vp()))\n"
        "cuda.ok('cuCtxSetCurrent', None)\n"
        "no_context = put('cuMemcpyHtoD_v2', a, b'x')\n"
        "cuda.use(0)\n"
        "emit(past_end=put('cuMemcpyHtoD_v2', a + MIB - 1, b'xy'),\n"
        "     freed=get('cuMemcpyDtoH_v2', gone, 1)[0],\n"
        "     unknown=put('cuMemcpyHtoD_v2', 0x1234, b'x'), zero=put('cuMemcpyHtoD_v2', 0x1234, b''),\n"
        "     dtod_over=cuda('cuMemcpyDtoD_v2', u64(a), u64(a + 1), sz(MIB)),\n"
        "     null_host=cuda('cuMemcpyDtoH_v2', None, u64(a), sz(1)),\n"
        "     capturing=capturing, no_context=no_context)",
        gpu_env(),
    )
    assert report == {
        "past_end": 1,  # CUDA_ERROR_INVALID_VALUE
        "freed": 1,
        "unknown": 1,
        "zero": 0,
        "dtod_over": 1,
        "null_host": 1,
        "capturing": 900,  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: the fake's graphs have no memcpy nodes
        "no_context": 201,  # CUDA_ERROR_INVALID_CONTEXT
    }


def test_a_synchronous_copy_waits_for_the_kernels_before_it(gpu_env: Env) -> None:
    report = run(
        SETUP + "a = cuda.alloc(MIB)\n"
        "fn = cuda.kernel()\n"
        "s = cuda.stream()\n"
        "cuda.launch(fn, 2000, s)\n"  # 0.2 s on a created stream, which the legacy stream waits for
        "t0 = time.time_ns()\n"
        "get('cuMemcpyDtoHAsync_v2', a, 4, vp(s))\n"
        "t1 = time.time_ns()\n"
        "get('cuMemcpyDtoH_v2', a, 4)\n"
        "t2 = time.time_ns()\n"
        "emit(async_ns=t1 - t0, sync_ns=t2 - t0)",
        gpu_env(FAKE_GPU_NS_PER_BLOCK=str(NS)),
    )
    assert report["async_ns"] < 1000 * NS
    assert report["sync_ns"] >= 2000 * NS


def test_the_copies_resolve_through_get_proc_address(gpu_env: Env) -> None:
    report = run(
        "emit(**{f'{name}/{flags}': cuda.proc(name, 12000, flags)[2] == 0 and\n"
        "        cuda.proc(name, 12000, flags)[1] == cuda.address(export)\n"
        "        for name, flags, export in [\n"
        "            ('cuMemcpyHtoD', 0, 'cuMemcpyHtoD_v2'), ('cuMemcpyDtoH', 2, 'cuMemcpyDtoH_v2_ptds'),\n"
        "            ('cuMemcpyDtoD', 0, 'cuMemcpyDtoD_v2'),\n"
        "            ('cuMemcpyHtoDAsync', 2, 'cuMemcpyHtoDAsync_v2_ptsz'),\n"
        "            ('cuMemcpyDtoHAsync', 0, 'cuMemcpyDtoHAsync_v2'),\n"
        "            ('cuMemcpyDtoDAsync', 2, 'cuMemcpyDtoDAsync_v2_ptsz')]})",
        gpu_env(),
    )
    assert report and all(report.values()), report
