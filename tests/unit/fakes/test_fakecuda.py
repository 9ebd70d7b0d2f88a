"""The fake libcuda.so.1 on its own: init, devices, errors, entry points, contexts (one process each)."""

from __future__ import annotations

import pytest

from tests.unit.fakes.conftest import Env
from tests.unit.fakes.gpu import GIB, UUID_A, UUID_B, run, start


def test_init_without_profile_fails_and_says_why(gpu_env: Env) -> None:
    env = gpu_env()
    del env["FAKE_NVML_PROFILE"]
    child = start("emit(init=cuda('cuInit', 0), count=cuda('cuDeviceGetCount', ref(ctypes.c_int())))", env)
    assert child.read() == {"init": 999, "count": 3}  # CUDA_ERROR_UNKNOWN, then NOT_INITIALIZED
    assert "fakecuda: FAKE_NVML_PROFILE is not set" in child.finish()


def test_calls_before_init_and_bad_flags(gpu_env: Env) -> None:
    report = run(
        "n = ctypes.c_int()\n"
        "before = cuda('cuDeviceGetCount', ref(n))\n"
        "v = ctypes.c_int()\n"
        "version = cuda('cuDriverGetVersion', ref(v))\n"
        "emit(before=before, version=[version, v.value], flags=cuda('cuInit', 1), init=cuda('cuInit', 0))",
        gpu_env(cuda="12.4"),
    )
    assert report == {"before": 3, "version": [0, 12040], "flags": 1, "init": 0}


def test_devices_follow_the_profile_in_pci_order(gpu_env: Env) -> None:
    report = run(
        "cuda.init()\n"
        "name = ctypes.create_string_buffer(64)\n"
        "cuda.ok('cuDeviceGetName', name, 64, 0)\n"
        "total = sz()\n"
        "cuda.ok('cuDeviceTotalMem_v2', ref(total), 0)\n"
        "small = ctypes.c_uint()\n"
        "cuda.ok('cuDeviceTotalMem', ref(small), 0)\n"
        "emit(count=cuda.count(), uuids=[cuda.uuid(0), cuda.uuid(1), cuda.uuid(0, 'cuDeviceGetUuid')],\n"
        "     name=name.value.decode(), total=total.value, small=small.value,\n"
        "     attrs=[cuda.attribute(a, 0) for a in (16, 39, 89, 75, 76)],\n"
        "     bad_ordinal=cuda('cuDeviceGet', ref(ctypes.c_int()), 2),\n"
        "     bad_attr=cuda('cuDeviceGetAttribute', ref(ctypes.c_int()), 0, 0))",
        gpu_env(memory_gib=40),
    )
    assert report == {
        "count": 2,
        "uuids": [UUID_B, UUID_A, UUID_B],  # UUID_B has the lower PCI bus id
        "name": "NVIDIA A100-SXM4-40GB",
        "total": 40 * GIB,
        "small": 0xFFFFFFFF,
        "attrs": [108, 2048, 1, 8, 0],
        "bad_ordinal": 101,
        "bad_attr": 1,
    }


@pytest.mark.parametrize(
    ("visible", "uuids", "init"),
    [
        ("1,0", [UUID_A, UUID_B], 0),
        ("1", [UUID_A], 0),
        (UUID_A, [UUID_A], 0),
        ("GPU-aaaa", [UUID_B], 0),  # a unique UUID prefix
        ("0,7,1", [UUID_B], 0),  # stops at the first unusable entry
        ("1,1", [UUID_A], 0),  # and at a repeat
        ("GPU-", [], 100),  # an ambiguous prefix: nothing visible
        ("", [], 100),
    ],
)
def test_cuda_visible_devices_reorders_ordinals(
    gpu_env: Env, visible: str, uuids: list[str], init: int
) -> None:
    report = run(
        "rc = cuda('cuInit', 0)\n"
        "n = ctypes.c_int()\n"
        "cuda.ok('cuDeviceGetCount', ref(n))\n"
        "emit(init=rc, uuids=[cuda.uuid(i) for i in range(n.value)])",
        gpu_env(CUDA_VISIBLE_DEVICES=visible),
    )
    assert report == {"init": init, "uuids": uuids}


def test_error_names_and_strings(gpu_env: Env) -> None:
    report = run(
        "out = []\n"
        "for code in (0, 2, 201, 12345):\n"
        "    name, text = ctypes.c_char_p(), ctypes.c_char_p()\n"
        "    rn = cuda('cuGetErrorName', code, ref(name))\n"
        "    rs = cuda('cuGetErrorString', code, ref(text))\n"
        "    out.append([rn, name.value and name.value.decode(), rs, text.value and text.value.decode()])\n"
        "emit(out=out)",
        gpu_env(),
    )
    assert report["out"] == [
        [0, "CUDA_SUCCESS", 0, "no error"],
        [0, "CUDA_ERROR_OUT_OF_MEMORY", 0, "out of memory"],
        [0, "CUDA_ERROR_INVALID_CONTEXT", 0, "invalid device context"],
        [1, None, 1, None],
    ]


# (symbol, cudaVersion, flags) -> the exported function cuGetProcAddress must return
PROCS = [
    ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"),
    ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
    ("cuMemAlloc", 3010, 0, "cuMemAlloc"),
    ("cuMemAlloc", 12000, 2, "cuMemAlloc_v2"),  # no per-thread variant: the legacy one
    ("cuLaunchKernel", 12000, 0, "cuLaunchKernel"),
    ("cuLaunchKernel", 12000, 1, "cuLaunchKernel"),
    ("cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"),
    ("cuMemAllocAsync", 11020, 2, "cuMemAllocAsync_ptsz"),
    ("cuStreamGetCaptureInfo", 11030, 0, "cuStreamGetCaptureInfo_v2"),
    ("cuStreamGetCaptureInfo", 12030, 2, "cuStreamGetCaptureInfo_v3_ptsz"),
    ("cuStreamGetCaptureInfo", 10010, 0, "cuStreamGetCaptureInfo"),
    ("cuCtxCreate", 12000, 0, "cuCtxCreate_v3"),
    ("cuCtxCreate", 13000, 0, "cuCtxCreate_v4"),
    ("cuGraphInstantiate", 12000, 0, "cuGraphInstantiateWithFlags"),
    ("cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"),
    ("cuGraphExecUpdate", 12000, 0, "cuGraphExecUpdate_v2"),
    ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
    ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
    ("cuMemGetInfo", 12000, 0, "cuMemGetInfo_v2"),
    ("cuDeviceTotalMem", 12000, 0, "cuDeviceTotalMem_v2"),
    ("cuDeviceGetUuid", 12000, 0, "cuDeviceGetUuid_v2"),
    ("cuDevicePrimaryCtxRelease", 12000, 0, "cuDevicePrimaryCtxRelease_v2"),
]


def test_get_proc_address_returns_the_versioned_function(gpu_env: Env) -> None:
    report = run(
        f"procs = {[p[:3] for p in PROCS]!r}\n"
        f"names = {[p[3] for p in PROCS]!r}\n"
        "emit(got=[cuda.proc(*p) for p in procs], want=[[0, cuda.address(n), 0] for n in names])",
        gpu_env(cuda="13.0"),
    )
    assert report["got"] == report["want"]
    assert len(set(tuple(w) for w in report["want"])) == len({p[3] for p in PROCS})  # distinct functions


def test_get_proc_address_failures(gpu_env: Env) -> None:
    report = run(
        "emit(unknown=cuda.proc('cuNoSuchFunction', 12000),\n"
        "     too_old=cuda.proc('cuMemAllocAsync', 11010),\n"
        "     newer_than_driver=cuda.proc('cuMemAlloc', 12050),\n"
        "     bad_flags=cuda.proc('cuMemAlloc', 12000, 4),\n"
        "     both_flags=cuda.proc('cuMemAlloc', 12000, 3),\n"
        "     versioned_name=cuda.proc('cuMemAlloc_v2', 12000))",
        gpu_env(cuda="12.4"),
    )
    assert report == {
        "unknown": [500, 0, 1],  # CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
        "too_old": [500, 0, 2],  # CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
        "newer_than_driver": [1, 0, -1],
        "bad_flags": [1, 0, -1],
        "both_flags": [1, 0, -1],
        "versioned_name": [500, 0, 1],  # lookups are by base name
    }


def test_get_proc_address_v1_has_four_arguments(gpu_env: Env) -> None:
    report = run(
        "fn = vp()\n"
        "rc = cuda('cuGetProcAddress', b'cuMemAlloc', ref(fn), 12000, ctypes.c_uint64(0))\n"
        "emit(rc=rc, fn=fn.value, want=cuda.address('cuMemAlloc_v2'))",
        gpu_env(),
    )
    assert report["rc"] == 0 and report["fn"] == report["want"]


def test_contexts(gpu_env: Env) -> None:
    report = run(
        "cuda.init()\n"
        "no_ctx = cuda('cuMemAlloc_v2', ref(u64()), sz(1))\n"
        "primary = cuda.use(1)\n"
        "dev = ctypes.c_int()\n"
        "cuda.ok('cuCtxGetDevice', ref(dev))\n"
        "ctx = vp()\n"
        "cuda.ok('cuCtxCreate_v2', ref(ctx), 0, 0)\n"
        "cur = vp()\n"
        "cuda.ok('cuCtxGetCurrent', ref(cur))\n"
        "created_current = cur.value == ctx.value\n"
        "cuda.ok('cuCtxGetDevice', ref(dev))\n"
        "dev_created = dev.value\n"
        "cuda.ok('cuCtxPopCurrent_v2', ref(cur))\n"
        "cuda.ok('cuCtxGetCurrent', ref(cur))\n"
        "back = cur.value == primary\n"
        "v4 = vp()\n"
        "cuda.ok('cuCtxCreate_v4', ref(v4), None, 0, 1)\n"
        "cuda.ok('cuCtxDestroy_v2', v4)\n"
        "emit(no_ctx=no_ctx, created_current=created_current, dev_created=dev_created, back=back,\n"
        "     destroyed=cuda('cuCtxSetCurrent', v4), sync=cuda('cuCtxSynchronize'))",
        gpu_env(),
    )
    assert report == {
        "no_ctx": 201,
        "created_current": True,
        "dev_created": 0,
        "back": True,
        "destroyed": 201,
        "sync": 0,
    }
