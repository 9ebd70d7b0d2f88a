"""The vmem_node.config ledger in real processes: oversubscription past real_memory goes to
managed memory charged there; normal exit and SIGTERM drop a process's entries, a SIGKILLed
process's entries are reaped when they would cause a refusal."""

from __future__ import annotations

import signal
import struct
from pathlib import Path

from tests.unit.libvgpu.conftest import MIB, Container, read_result

# vgpu_files.h: header, devices @128 with stride 16392: 1024 x {i32 pid, u32 pad, u64 used},
# processes_size u32 @+16384.
DEVICES = 128
STRIDE = 16392
MAGIC = 0x564D4E44


def ledger(root: Path, device: int = 0) -> dict[int, int]:
    """pid -> bytes charged on `device`, read from the file the library wrote."""
    data = (root / "vmem" / "vmem_node.config").read_bytes()
    magic, layout, size, count = struct.unpack_from("<4I", data, 0)
    assert (magic, layout, size, count) == (MAGIC, 1, 262400, 16)
    base = DEVICES + device * STRIDE
    (n,) = struct.unpack_from("<I", data, base + 16384)
    entries = [struct.unpack_from("<iIQ", data, base + 16 * i) for i in range(n)]
    return {pid: used for pid, _, used in entries}


OVERSOLD = {"CUDA_MEM_LIMIT_0": "1024m", "CUDA_MEM_RATIO_0": "2"}


def test_oversubscription_spills_to_managed_memory_in_the_ledger(container: Container) -> None:
    holder = container.start("fill", "direct", str(128 * MIB), "hold", **OVERSOLD)
    try:
        got = read_result(holder, ("count", "total", "error"))
        # 512 MiB of device memory (real_memory = limit / ratio), then 512 MiB managed.
        assert (got["count"], got["error"]) == ("8", "2")
        assert ledger(container.root) == {holder.pid: 512 * MIB}
        seen = container.run("info", preload=False)
        assert int(seen["nvml_used"]) == 512 * MIB
    finally:
        holder.communicate(timeout=30)
    assert holder.returncode == 0
    assert ledger(container.root) == {}  # atexit dropped the entry


def test_sigterm_drops_the_entries(container: Container) -> None:
    holder = container.start("fill", "managed", str(256 * MIB), "hold", CUDA_MEM_LIMIT_0="1024m")
    assert read_result(holder, ("count", "total", "error"))["count"] == "4"
    assert ledger(container.root) == {holder.pid: 1024 * MIB}
    holder.send_signal(signal.SIGTERM)
    holder.wait(timeout=30)
    assert holder.returncode == -signal.SIGTERM  # the default action still ran
    assert ledger(container.root) == {}


def test_sigkilled_entries_are_reaped_before_a_refusal(container: Container) -> None:
    victim = container.start("fill", "managed", str(256 * MIB), "hold", CUDA_MEM_LIMIT_0="1024m")
    assert read_result(victim, ("count", "total", "error"))["count"] == "4"
    victim.kill()
    victim.wait()
    assert ledger(container.root) == {victim.pid: 1024 * MIB}  # nobody could clean up
    got = container.run("fill", "managed", str(256 * MIB), CUDA_MEM_LIMIT_0="1024m")
    assert got["count"] == "4"
    assert victim.pid not in ledger(container.root)


def test_free_retires_the_charge(container: Container) -> None:
    got = container.run("cycle", "managed", str(512 * MIB), "5", CUDA_MEM_LIMIT_0="1024m")
    # Five rounds of alloc + free of the whole limit: each free gave its charge back.
    assert got["rounds"] == "5"
    assert ledger(container.root) == {}


def test_threads_of_one_process_lose_no_ledger_update(container: Container) -> None:
    holder = container.start("threads", "8", "100", str(MIB), CUDA_MEM_LIMIT_0="1024m")
    try:
        assert read_result(holder, ("allocated",))["allocated"] == "800"
        assert ledger(container.root) == {holder.pid: 800 * MIB}
    finally:
        holder.communicate(timeout=30)
