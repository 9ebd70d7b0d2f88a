"""Stream-ordered allocations in the fake driver: reserved at the call, shown by NVML only when the
stream's earlier work has ended; on a capturing stream an address and no memory."""

from __future__ import annotations

from tests.unit.fakes.conftest import Env
from tests.unit.fakes.gpu import GIB, run

# CUDA ordinal 0 is NVML index 1 (the lower PCI bus id). One kernel of 300 blocks at 1 ms per block
# keeps the stream busy for 0.3 s.
BUSY = """
cuda.init()
cuda.use(0)
nvml = Nvml(os.environ["FAKE_NVML_LIB"])
def seen():
    total, free, used = nvml.memory(1)
    return dict(procs=nvml.processes(1).get(os.getpid(), 0), used=used)
s = cuda.stream()
"""


def test_allocation_becomes_visible_when_the_stream_gets_there(gpu_env: Env) -> None:
    report = run(
        BUSY + "cuda.launch(cuda.kernel(), 300, s)\n"
        "a = u64()\n"
        "cuda.ok('cuMemAllocAsync', ref(a), sz(2 * GIB), vp(s))\n"
        "queued = seen()\n"
        "free, total = cuda.mem_info()\n"
        "over = cuda('cuMemAlloc_v2', ref(u64()), sz(6 * GIB + 1))\n"
        "cuda.ok('cuStreamSynchronize', vp(s))\n"
        "synced = seen()\n"
        "idle = u64()\n"
        "cuda.ok('cuMemAllocAsync', ref(idle), sz(GIB), vp(s))\n"
        "emit(queued=queued, driver_free=free, over=over, synced=synced, idle=seen())",
        gpu_env(memory_gib=8, FAKE_GPU_NS_PER_BLOCK="1000000"),
    )
    assert report == {
        "queued": {"procs": 0, "used": 0},  # NVML: not yet
        "driver_free": 6 * GIB,  # the driver counts it at once
        "over": 2,  # and so does the next allocation's free-memory check
        "synced": {"procs": 2 * GIB, "used": 2 * GIB},
        "idle": {"procs": 3 * GIB, "used": 3 * GIB},  # nothing queued: at once
    }


def test_capturing_stream_hands_out_an_address_and_charges_nothing(gpu_env: Env) -> None:
    report = run(
        BUSY + "cuda.ok('cuStreamBeginCapture_v2', vp(s), 0)\n"
        "a = u64()\n"
        "rc = cuda('cuMemAllocAsync', ref(a), sz(6 * GIB), vp(s))\n"
        "b = u64()\n"
        "again = cuda('cuMemAllocAsync', ref(b), sz(6 * GIB), vp(s))\n"
        "captured = seen()\n"
        "free, total = cuda.mem_info()\n"
        "freed = cuda('cuMemFreeAsync', a, vp(s))\n"
        "cuda.ok('cuStreamEndCapture', vp(s), ref(vp()))\n"
        "emit(rc=rc, again=again, distinct=a.value != b.value > 0, captured=captured, driver_free=free,\n"
        "     freed=freed)",
        gpu_env(memory_gib=8),
    )
    assert report == {
        "rc": 0,
        "again": 0,  # 12 GiB on an 8 GiB device: nothing was allocated
        "distinct": True,
        "captured": {"procs": 0, "used": 0},
        "driver_free": 8 * GIB,
        "freed": 0,
    }
