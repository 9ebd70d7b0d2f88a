"""The fakes' shared state across real processes: NVML sees what each process's libcuda did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import built
from tests.unit.fakes.conftest import Env
from tests.unit.fakes.gpu import GIB, Child, run, start

# A child that allocates `size` on CUDA ordinal `ordinal`, reports its pid, and holds until released.
HOLDER = """
cuda.init()
cuda.use({ordinal})
rc = cuda('cuMemAlloc_v2', ref(u64()), sz({size}))
emit(pid=os.getpid(), rc=rc, info=cuda.mem_info())
hold()
"""

# NVML as a third process sees it: processes (v1 and v3 structs) and memory of each NVML index.
OBSERVER = """
nvml = Nvml(os.environ["FAKE_NVML_LIB"])
out = {}
for i in (0, 1):
    out[i] = dict(v1=nvml.processes(i), v3=nvml.processes(i, "nvmlDeviceGetComputeRunningProcesses_v3"),
                  graphics=nvml.processes(i, "nvmlDeviceGetGraphicsRunningProcesses"), memory=nvml.memory(i))
emit(**{str(k): v for k, v in out.items()})
"""


def holder(env: dict[str, str], size: int, ordinal: int = 0) -> tuple[Child, dict]:
    child = start(HOLDER.format(size=size, ordinal=ordinal), env)
    return child, child.read()


def observe(env: dict[str, str]) -> dict:
    report = run(OBSERVER, env)
    return {
        int(i): {k: ({int(p): b for p, b in v.items()} if isinstance(v, dict) else v) for k, v in d.items()}
        for i, d in report.items()
    }


def test_two_processes_allocate_and_nvml_lists_both(gpu_env: Env) -> None:
    env = gpu_env(memory_gib=8)
    first, a = holder(env, GIB)
    second, b = holder(env, 3 * GIB)
    # CUDA ordinal 0 is NVML index 1 (the lower PCI bus id)
    seen = observe(env)
    assert seen[1]["v1"] == {a["pid"]: GIB, b["pid"]: 3 * GIB}
    assert seen[1]["v3"] == seen[1]["v1"]
    assert seen[1]["graphics"] == {}
    assert seen[1]["memory"] == [8 * GIB, 4 * GIB, 4 * GIB]
    assert seen[0]["v1"] == {} and seen[0]["memory"] == [8 * GIB, 8 * GIB, 0]
    assert b["info"] == [4 * GIB, 8 * GIB]  # the second process's cuMemGetInfo counts the first's bytes
    # a third process cannot have more than what is left
    third, c = holder(env, 4 * GIB + 1)
    assert c["rc"] == 2
    # ...but the process with a context and no memory is still listed, as with a real driver
    assert observe(env)[1]["v1"] == {a["pid"]: GIB, b["pid"]: 3 * GIB, c["pid"]: 0}
    for child in (first, second, third):
        child.finish()
    assert observe(env)[1]["v1"] == {}


def test_graphics_processes_are_those_that_say_so(gpu_env: Env) -> None:
    env = gpu_env()
    child, a = holder({**env, "FAKE_GPU_GRAPHICS": "1"}, GIB, ordinal=1)
    seen = observe(env)
    child.finish()
    assert seen[0]["graphics"] == {a["pid"]: GIB} == seen[0]["v1"]


def test_a_killed_process_is_reaped(gpu_env: Env) -> None:
    env = gpu_env()
    waited, a = holder(env, GIB)
    zombie, b = holder(env, 2 * GIB)
    assert observe(env)[1]["v1"] == {a["pid"]: GIB, b["pid"]: 2 * GIB}
    os.kill(a["pid"], signal.SIGKILL)
    waited.proc.wait(timeout=30)
    os.kill(b["pid"], signal.SIGKILL)
    # not waited for: a zombie, which kill(pid, 0) still finds; the state file must not count it
    deadline = time.monotonic() + 30
    stat = Path(f"/proc/{b['pid']}/stat")
    while not stat.read_text().rsplit(") ", 1)[1].startswith("Z"):
        assert time.monotonic() < deadline, "the killed child never became a zombie"
        time.sleep(0.01)
    seen = observe(env)
    zombie.proc.wait(timeout=30)
    assert seen[1]["v1"] == {}
    assert seen[1]["memory"][2] == 0


def test_the_state_file_belongs_to_one_profile(gpu_env: Env) -> None:
    run("cuda.init(); emit()", gpu_env(memory_gib=8))
    child = start("emit(rc=cuda('cuInit', 0))", gpu_env(memory_gib=16))
    assert child.read() == {"rc": 999}
    assert "was created for other GPUs than this profile's" in child.finish()


def test_nvml_in_one_process_follows_allocations(gpu_env: Env) -> None:
    # both fakes in one process, as under a real driver: NVML sees this pid's allocations
    report = run(
        "nvml = Nvml(os.environ['FAKE_NVML_LIB'])\n"
        "cuda.init()\n"
        "cuda.use(1)\n"
        "p = cuda.alloc(GIB)\n"
        "during = nvml.processes(0)\n"
        "cuda.free(p)\n"
        "emit(pid=os.getpid(), during=during, after=nvml.processes(0), memory=nvml.memory(0))",
        gpu_env(memory_gib=8),
    )
    assert report["during"] == {str(report["pid"]): GIB}
    assert report["after"] == {str(report["pid"]): 0}
    assert report["memory"] == [8 * GIB, 8 * GIB, 0]


def test_concurrent_processes_and_threads_lose_no_update(gpu_env: Env) -> None:
    env = gpu_env(memory_gib=8)
    script = (
        "import threading\n"
        "cuda.init()\n"
        "ctx = cuda.use(0)\n"
        "def work():\n"
        "    cuda.ok('cuCtxSetCurrent', vp(ctx))\n"
        "    ptrs = [cuda.alloc(1 << 20) for _ in range(200)]\n"
        "    for p in ptrs[:100]:\n"
        "        cuda.free(p)\n"
        "threads = [threading.Thread(target=work) for _ in range(4)]\n"
        "for t in threads: t.start()\n"
        "for t in threads: t.join()\n"
        "emit(pid=os.getpid())\n"
        "hold()\n"
    )
    children = [start(script, env) for _ in range(4)]
    pids = [c.read()["pid"] for c in children]
    seen = observe(env)
    for c in children:
        c.finish()
    # each process: 4 threads x (200 - 100) MiB
    assert seen[1]["v1"] == {pid: 400 << 20 for pid in pids}
    assert seen[1]["memory"][2] == 4 * (400 << 20)


def test_a_dead_pids_memory_never_causes_an_oom(gpu_env: Env) -> None:
    env = gpu_env(memory_gib=8)
    # a long-lived allocator: one allocation per line it reads, its CUresult reported
    allocator = start(
        "cuda.init()\ncuda.use(0)\nemit(ready=True)\n"
        "for line in sys.stdin:\n"
        "    emit(rc=cuda('cuMemAlloc_v2', ref(u64()), sz(int(line))))\n",
        env,
    )
    allocator.read()
    hog, h = holder(env, 8 * GIB)
    assert h["rc"] == 0
    assert allocator.proc.stdin is not None
    allocator.proc.stdin.write(f"{GIB}\n")
    allocator.proc.stdin.flush()
    assert allocator.read() == {"rc": 2}  # full
    hog.proc.kill()
    hog.proc.wait(timeout=30)
    # at once, in the allocator that already saw the hog: the allocation drops the dead pid first
    allocator.proc.stdin.write(f"{8 * GIB}\n")
    allocator.proc.stdin.flush()
    assert allocator.read() == {"rc": 0}
    allocator.finish()


def test_pynvml_reads_the_shared_state(gpu_env: Env) -> None:
    env = gpu_env(memory_gib=8, FAKE_GPU_NS_PER_BLOCK="100000")
    report = run(
        "import pynvml\n"
        "cuda.init()\ncuda.use(0)\n"
        "t0 = time.time_ns() // 1000 - 1\n"
        "cuda.alloc(GIB)\n"
        "cuda.launch(cuda.kernel(), 1000)\n"
        "cuda.ok('cuCtxSynchronize')\n"
        "pynvml.nvmlInit()\n"
        "h = pynvml.nvmlDeviceGetHandleByIndex(1)\n"
        "procs = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]\n"
        "mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)\n"
        "util = [(s.pid, s.smUtil > 0) for s in pynvml.nvmlDeviceGetProcessUtilization(h, t0)]\n"
        "infos = [(s.pid, s.smUtil > 0) for s in pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, t0)]\n"
        "other = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "try:\n"
        "    pynvml.nvmlDeviceGetProcessUtilization(other, t0)\n"
        "    idle = 'no error'\n"
        "except pynvml.NVMLError_NotFound:\n"
        "    idle = 'not found'\n"
        "emit(pid=os.getpid(), procs=procs, used=mem.used, free=mem.free, util=util, infos=infos, idle=idle)",
        {**env, "LD_LIBRARY_PATH": str(Path(env["FAKE_NVML_LIB"]).parent)},
    )
    pid = report["pid"]
    assert report["procs"] == [[pid, GIB]]
    assert (report["used"], report["free"]) == (GIB, 7 * GIB)
    assert report["util"] == report["infos"] == [[pid, True]]
    assert report["idle"] == "not found"


FORKED = """
cuda.init()
cuda.use(0)
cuda.alloc(GIB)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    codes = [cuda("cuInit", 0), cuda("cuMemAlloc_v2", ref(u64()), sz(1))]
    codes.append(cuda("cuDeviceGetCount", ref(ctypes.c_int())))
    os.write(w, json.dumps(codes).encode())
    os._exit(0)
os.waitpid(pid, 0)
emit(child=json.loads(os.read(r, 100)), parent=cuda.mem_info())
"""


def test_a_fork_child_cannot_use_the_parents_driver(gpu_env: Env) -> None:
    report = run("import json\n" + FORKED, gpu_env(memory_gib=8))
    assert report == {"child": [3, 3, 3], "parent": [7 * GIB, 8 * GIB]}  # CUDA_ERROR_NOT_INITIALIZED


def test_forked_processes_queue_kernels_without_losing_one(gpu_env: Env) -> None:
    # a parent and its fork child each queue n one-microsecond kernels behind a 1 s kernel, in C:
    # their launches must exclude each other (each process opens the state file for itself), so
    # every one lands after the one before it, none on top of another
    driver = built("fakecuda/tests/fork_race")
    env = gpu_env(FAKE_GPU_NS_PER_BLOCK="1000")
    done = subprocess.run(
        [str(driver), env["FAKE_CUDA_LIB"], "100000"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["ms"] == pytest.approx(report["expected"], abs=0.0005)
