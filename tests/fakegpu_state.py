"""Make the fake GPUs sick: raise an XID on one, or make one lost and restore it.

The fake NVML (csrc/fakenvml) reads each GPU's health from the shared state file (FAKE_GPU_STATE)
that it, the fake libcuda and the tests share; the layout is csrc/fakestate's alone, so these helpers
call the fake NVML's test entry points (`fakegpuRaiseXid`, `fakegpuSetLost`) with the file's path
instead of mirroring it. They work from any process, while vgpud and containers use the file, once a
fake has created it (its first nvmlInit or cuInit).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from tests.support import BUILD

NVML_LIBRARY = BUILD / "fakenvml" / "libnvidia-ml.so.1"


class FakeGpuStateError(RuntimeError):
    """The state file could not be changed (missing, another version, no such GPU)."""


@functools.cache
def _library(path: Path) -> ctypes.CDLL:
    if not path.exists():
        raise FakeGpuStateError(f"{path} is missing: run `make build`")
    lib = ctypes.CDLL(str(path))
    lib.fakegpuRaiseXid.argtypes = [
        ctypes.c_char_p,
        ctypes.c_uint,
        ctypes.c_ulonglong,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    lib.fakegpuSetLost.argtypes = [
        ctypes.c_char_p,
        ctypes.c_uint,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    return lib


def _check(rc: int, why: ctypes.Array[ctypes.c_char]) -> None:
    if rc != 0:
        raise FakeGpuStateError(why.value.decode(errors="replace"))


def raise_xid(state_file: str | Path, gpu_index: int, xid: int, *, library: Path = NVML_LIBRARY) -> None:
    """Raise XID `xid` on the GPU of NVML index `gpu_index`: every NVML event set registered for it
    (in any process sharing `state_file`) delivers it as an nvmlEventTypeXidCriticalError event."""
    why = ctypes.create_string_buffer(512)
    _check(_library(library).fakegpuRaiseXid(str(state_file).encode(), gpu_index, xid, why, len(why)), why)


def set_lost(state_file: str | Path, gpu_index: int, lost: bool, *, library: Path = NVML_LIBRARY) -> None:
    """Make the GPU lost (NVML calls on it return NVML_ERROR_GPU_IS_LOST, 15, and a waiting event set
    reports the loss once) or restore it (`lost=False`)."""
    why = ctypes.create_string_buffer(512)
    _check(
        _library(library).fakegpuSetLost(str(state_file).encode(), gpu_index, int(lost), why, len(why)), why
    )
