"""The fake libcuda's library API (cuLibrary*, cuKernel*), which cuda.core and numba-cuda load and
launch every kernel through: a library loads without a context, its kernel launches where a function
does and costs its grid's blocks, and reports the attributes of a small kernel."""

from __future__ import annotations

from tests.unit.fakes.conftest import Env
from tests.unit.fakes.gpu import run

NS = 100_000  # FAKE_GPU_NS_PER_BLOCK: 0.1 ms per block

SETUP = """
u = ctypes.c_uint
PTX = b'.version 8.0\\n.target sm_80\\n.address_size 64\\n.visible .entry one()\\n{ ret; }\\n' \\
      b'.visible .entry two(.param .u64 p)\\n{ ret; }\\n'
def load(image):
    lib = vp()
    rc = cuda('cuLibraryLoadData', ref(lib), ctypes.c_char_p(image), None, None, u(0), None, None, u(0))
    return rc, lib
def kernel(lib, name):
    k = vp()
    rc = cuda('cuLibraryGetKernel', ref(k), lib, name)
    return rc, k
"""


def test_a_library_kernel_launches_like_a_function(gpu_env: Env) -> None:
    report = run(
        SETUP + "cuda.init()\n"
        "rc, lib = load(PTX)\n"  # no context is current yet: a library does not need one
        "got = [rc, kernel(lib, b'one')[0], kernel(lib, b'two')[0], kernel(lib, b'three')[0]]\n"
        "k = kernel(lib, b'two')[1]\n"
        "f = vp()\n"
        "no_context = cuda('cuKernelGetFunction', ref(f), k)\n"
        "cuda.use(0)\n"
        "cuda.ok('cuKernelGetFunction', ref(f), k)\n"
        "class Config(ctypes.Structure):\n"
        "    _fields_ = [('grid', u * 3), ('block', u * 3), ('shared', u), ('stream', vp),\n"
        "                ('attrs', vp), ('numAttrs', u)]\n"
        "t0 = time.time_ns()\n"
        "config = Config((u * 3)(1000, 1, 1), (u * 3)(128, 1, 1), 0, None, None, 0)\n"
        "cuda.ok('cuLaunchKernelEx', ref(config), k, None, None)\n"
        "cuda.launch(k.value, 1000)\n"
        "cuda.ok('cuCtxSynchronize')\n"
        "elapsed = time.time_ns() - t0\n"
        "cuda.ok('cuLibraryUnload', lib)\n"
        "cubin = load(b'\\x7fELF' + bytes(60))\n"  # a binary image: any name is one of its kernels
        "emit(got=got, no_context=no_context, same=f.value == k.value, elapsed=elapsed,\n"
        "     unloaded=kernel(lib, b'one')[0], twice=cuda('cuLibraryUnload', lib),\n"
        "     cubin=[cubin[0], kernel(cubin[1], b'anything')[0]], garbage=load(b'not an image')[0])",
        gpu_env(FAKE_GPU_NS_PER_BLOCK=str(NS)),
    )
    elapsed = report.pop("elapsed")
    assert elapsed >= 2000 * NS  # both launches' blocks
    assert report == {
        "got": [0, 0, 0, 500],  # CUDA_ERROR_NOT_FOUND for a name the PTX has no entry of
        "no_context": 201,  # CUDA_ERROR_INVALID_CONTEXT
        "same": True,
        "unloaded": 400,  # CUDA_ERROR_INVALID_HANDLE
        "twice": 400,
        "cubin": [0, 0],
        "garbage": 200,  # CUDA_ERROR_INVALID_IMAGE
    }


#: CUfunction_attribute -> the fake's value on a compute capability 8.0 GPU
ATTRIBUTES = {0: 1024, 1: 0, 2: 0, 3: 0, 4: 32, 5: 80, 6: 80, 8: 49152, 9: -1}


def test_kernel_attributes_are_a_small_kernels(gpu_env: Env) -> None:
    report = run(
        SETUP + "cuda.init()\n"
        "lib = load(PTX)[1]\n"
        "k = kernel(lib, b'one')[1]\n"
        "v = ctypes.c_int(-7)\n"
        "def attribute(a, kern=k, device=0):\n"
        "    rc = cuda('cuKernelGetAttribute', ref(v), a, kern, device)\n"
        "    return v.value if rc == 0 else f'error {rc}'\n"
        f"emit(got={{a: attribute(a) for a in {sorted(ATTRIBUTES)}}}, bad_device=attribute(0, device=2),\n"
        "     bad_attribute=attribute(99), bad_kernel=attribute(0, kern=lib))",
        gpu_env(),
    )
    assert report == {
        "got": {str(a): v for a, v in ATTRIBUTES.items()},
        "bad_device": "error 101",  # CUDA_ERROR_INVALID_DEVICE
        "bad_attribute": "error 1",
        "bad_kernel": "error 400",  # a library is no kernel
    }
