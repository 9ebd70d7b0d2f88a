"""Run by the cuda-clients venv's Python (hack/install-cuda-clients.sh), not by pytest: numba-cuda on
CUDA device 0, one `key value...` line per check, for tests/conformance/test_numba_cuda.py.

    numba_probe.py SECONDS GRID   the memory checks, then a @cuda.jit kernel of GRID blocks of 128
                                  threads launched for SECONDS (16 at a time, then a synchronize, as a
                                  training step would); `ready` is printed before the launch loop

The kernel's result is not checked: on the fake driver kernels compute nothing, they take simulated
SM time."""

from __future__ import annotations

import sys
import time

import numpy as np
from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError

MIB = 1 << 20
STEP = 256 * MIB
#: arrays per fill at most: 2 GiB, past a 1 GiB limit without reaching the GPU's 40 GiB
MAX_STEPS = 8
BLOCK = 128
BATCH = 16


def say(key: str, *values: object) -> None:
    """One `key value...` line."""
    print(key, *values, flush=True)


def memory() -> None:
    """The context's memory view, device_array until it fails, and bytes through a device array."""
    context = cuda.current_context()
    say("info", *context.get_memory_info())
    held: list[object] = []
    error = 0
    while len(held) < MAX_STEPS:
        try:
            held.append(cuda.device_array(STEP, dtype=np.uint8))
        except CudaAPIError as e:
            error = int(e.code)
            break
    say("fill", len(held), error)
    held.clear()
    context.memory_manager.deallocations.clear()  # numba frees in batches: free them now
    say("info_after", *context.get_memory_info())
    data = np.arange(1024, dtype=np.int32)
    say("copy", int(np.array_equal(cuda.to_device(data).copy_to_host(), data)))


@cuda.jit
def bump(a):  # numba infers the argument's type at the first launch
    i = cuda.grid(1)
    if i < a.size:
        a[i] += 1


def launches(seconds: float, grid: int) -> None:
    """Launch `bump` (compiled at the first launch) in batches for `seconds`."""
    array = cuda.to_device(np.zeros(grid * BLOCK, dtype=np.float32))
    bump[grid, BLOCK](array)
    cuda.synchronize()
    say("ready", 1)
    count, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(BATCH):
            bump[grid, BLOCK](array)
        count += BATCH
        cuda.synchronize()
    say("launches", count, f"{time.monotonic() - start:.3f}")


def main() -> None:
    say("devices", len(cuda.gpus))
    name = cuda.get_current_device().name
    say("name", name.decode() if isinstance(name, bytes) else name)
    memory()
    launches(float(sys.argv[1]), int(sys.argv[2]))


if __name__ == "__main__":
    main()
