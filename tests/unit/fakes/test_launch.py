"""Kernel launches, streams, events and graphs of the fake libcuda, and the utilization NVML derives.

Launch costs are checked exactly through events: an event recorded behind a long "spacer" kernel
marks that kernel's simulated end, so two events around launches differ by exactly their cost.
"""

from __future__ import annotations

import pytest

from tests.unit.fakes.conftest import Env
from tests.unit.fakes.gpu import Child, run, start

NS = 100_000  # FAKE_GPU_NS_PER_BLOCK in these tests: 0.1 ms per block

SETUP = """
cuda.init()
cuda.use(0)
fn = cuda.kernel("spin")
def event():
    e = vp()
    cuda.ok("cuEventCreate", ref(e), 0)
    return e
def cost(launch, stream=0):
    # ms of device time launch() queues on `stream`, read from events behind a 0.2 s spacer
    cuda.launch(fn, 2000, stream)
    e0, e1 = event(), event()
    cuda.ok("cuEventRecord", e0, vp(stream))
    launch()
    cuda.ok("cuEventRecord", e1, vp(stream))
    cuda.ok("cuEventSynchronize", e1)
    ms = ctypes.c_float()
    cuda.ok("cuEventElapsedTime", ref(ms), e0, e1)
    return ms.value
u = ctypes.c_uint
"""


def test_launches_cost_grid_blocks(gpu_env: Env) -> None:
    report = run(
        SETUP + "class Config(ctypes.Structure):\n"
        "    _fields_ = [('grid', u * 3), ('block', u * 3), ('shared', u), ('stream', vp),\n"
        "                ('attrs', vp), ('numAttrs', u)]\n"
        "cfg = Config((u * 3)(7, 2, 1), (u * 3)(64, 1, 1), 0, None, None, 0)\n"
        "s = cuda.stream()\n"
        "coop = lambda: cuda.ok('cuLaunchCooperativeKernel', vp(fn), u(5), u(1), u(1), u(32), u(1), u(1),\n"
        "                       u(0), None, None)\n"
        "def legacy():\n"
        "    cuda.ok('cuFuncSetBlockShape', vp(fn), 32, 1, 1)\n"
        "    cuda.ok('cuLaunchGrid', vp(fn), 3, 3)\n"
        "emit(plain=cost(lambda: cuda.launch(fn, 10)),\n"
        "     grid3d=cost(lambda: cuda.ok('cuLaunchKernel', vp(fn), u(2), u(3), u(4), u(8), u(8), u(1),\n"
        "                                 u(0), None, None, None)),\n"
        "     ex=cost(lambda: cuda.ok('cuLaunchKernelEx', ref(cfg), vp(fn), None, None)),\n"
        "     ptsz=cost(lambda: cuda.launch(fn, 30, s, 'cuLaunchKernel_ptsz'), s),\n"
        "     coop=cost(coop), legacy=cost(legacy),\n"
        "     two=cost(lambda: (cuda.launch(fn, 10), cuda.launch(fn, 20))))",
        gpu_env(FAKE_GPU_NS_PER_BLOCK=str(NS)),
    )
    ms = NS / 1e6
    assert report == pytest.approx(
        {
            "plain": 10 * ms,
            "grid3d": 24 * ms,
            "ex": 14 * ms,
            "ptsz": 30 * ms,
            "coop": 5 * ms,
            "legacy": 9 * ms,
            "two": 30 * ms,
        },
        rel=1e-5,
    )


def test_launch_errors(gpu_env: Env) -> None:
    report = run(
        SETUP + "m = vp()\n"
        "f = vp()\n"
        "ptx = b'.version 8.0\\n.target sm_80\\n.visible .entry spin()\\n{ ret; }\\n'\n"
        "cuda.ok('cuModuleLoadData', ref(m), ctypes.c_char_p(ptx))\n"
        "launch = lambda *dims: cuda('cuLaunchKernel', vp(fn), *map(u, dims), u(0), None, None, None)\n"
        "emit(missing=cuda('cuModuleGetFunction', ref(f), m, b'nope'),\n"
        "     prefix=cuda('cuModuleGetFunction', ref(f), m, b'spi'),\n"
        "     garbage=cuda('cuModuleLoadData', ref(m), ctypes.c_char_p(b'not an image')),\n"
        "     zero_grid=launch(0, 1, 1, 32, 1, 1), big_block=launch(1, 1, 1, 1025, 1, 1),\n"
        "     bad_fn=cuda('cuLaunchKernel', vp(m.value), *map(u, (1, 1, 1, 1, 1, 1, 0)), None, None, None),\n"
        "     bad_stream=cuda('cuLaunchKernel', vp(fn), *map(u, (1, 1, 1, 1, 1, 1, 0)), vp(fn), None, None))",
        gpu_env(),
    )
    assert report == {
        "missing": 500,
        "prefix": 500,
        "garbage": 200,
        "zero_grid": 1,
        "big_block": 1,
        "bad_fn": 400,
        "bad_stream": 400,
    }


def test_synchronize_waits_for_the_simulated_kernel(gpu_env: Env) -> None:
    report = run(
        SETUP + "s = cuda.stream()\n"
        "t0 = time.time_ns()\n"
        "cuda.launch(fn, 2000, s)\n"  # 0.2 s
        "busy = cuda('cuStreamQuery', vp(s))\n"
        "cuda.ok('cuStreamSynchronize', vp(s))\n"
        "t1 = time.time_ns()\n"
        "cuda.launch(fn, 1000)\n"
        "cuda.ok('cuCtxSynchronize')\n"
        "t2 = time.time_ns()\n"
        "emit(busy=busy, done=cuda('cuStreamQuery', vp(s)), stream_ns=t1 - t0, ctx_ns=t2 - t1)",
        gpu_env(FAKE_GPU_NS_PER_BLOCK=str(NS)),
    )
    assert report["busy"] == 600 and report["done"] == 0  # CUDA_ERROR_NOT_READY, then ready
    assert report["stream_ns"] >= 2000 * NS
    assert report["ctx_ns"] >= 1000 * NS


def test_capture_builds_a_graph_and_a_launch_costs_its_blocks(gpu_env: Env) -> None:
    report = run(
        SETUP + "s = cuda.stream()\n"
        "status = ctypes.c_int()\n"
        "legacy_capture = cuda('cuStreamBeginCapture_v2', None, 0)\n"
        "cuda.ok('cuStreamBeginCapture_v2', vp(s), 0)\n"
        "cuda.ok('cuStreamIsCapturing', vp(s), ref(status))\n"
        "capturing = status.value\n"
        "for blocks in (10, 20, 30):\n"
        "    cuda.launch(fn, blocks, s)\n"
        "idle_while_capturing = cuda('cuStreamQuery', vp(s))\n"
        "cid, graph, deps, ndeps = u64(), vp(), vp(), sz()\n"
        "cuda.ok('cuStreamGetCaptureInfo_v2', vp(s), ref(status), ref(cid), ref(graph), ref(deps),\n"
        "        ref(ndeps))\n"
        "captured = vp()\n"
        "cuda.ok('cuStreamEndCapture', vp(s), ref(captured))\n"
        "same_graph = captured.value == graph.value\n"
        "n = sz()\n"
        "cuda.ok('cuGraphGetNodes', captured, None, ref(n))\n"
        "nodes = (vp * n.value)()\n"
        "cuda.ok('cuGraphGetNodes', captured, nodes, ref(n))\n"
        "grids = []\n"
        "for node in nodes:\n"
        "    t = ctypes.c_int()\n"
        "    cuda.ok('cuGraphNodeGetType', vp(node), ref(t))\n"
        "    params = (u64 * 9)()\n"  # CUDA_KERNEL_NODE_PARAMS_v2, 72 bytes
        "    cuda.ok('cuGraphKernelNodeGetParams_v2', vp(node), params)\n"
        "    grids.append([t.value, params[1] & 0xFFFFFFFF])\n"
        "outer = vp()\n"
        "cuda.ok('cuGraphCreate', ref(outer), 0)\n"
        "child = vp()\n"
        "cuda.ok('cuGraphAddChildGraphNode', ref(child), outer, None, sz(0), captured)\n"
        "class Params(ctypes.Structure):\n"
        "    _fields_ = [('func', vp), ('dims', u * 7), ('params', vp), ('extra', vp), ('kern', vp),\n"
        "                ('ctx', vp)]\n"
        "k = vp()\n"
        "cuda.ok('cuGraphAddKernelNode_v2', ref(k), outer, ref(child), sz(1),\n"
        "        ref(Params(fn, (u * 7)(40, 1, 1, 32, 1, 1, 0))))\n"
        "cuda.ok('cuGraphDestroy', captured)\n"  # the child node holds its own copy
        "exe = vp()\n"
        "cuda.ok('cuGraphInstantiateWithFlags', ref(exe), outer, u64(0))\n"
        "whole = cost(lambda: cuda.ok('cuGraphLaunch', exe, vp(s)), s)\n"
        "other = vp()\n"
        "cuda.ok('cuGraphCreate', ref(other), 0)\n"
        "five = Params(fn, (u * 7)(5, 1, 1, 32, 1, 1, 0))\n"
        "cuda.ok('cuGraphAddKernelNode_v2', ref(k), other, None, sz(0), ref(five))\n"
        "info = (u64 * 3)()\n"
        "changed = cuda('cuGraphExecUpdate_v2', exe, other, info)\n"
        "result = info[0] & 0xFFFFFFFF\n"
        "cuda.ok('cuGraphAddEmptyNode', ref(k), other, None, sz(0))\n"
        "twin = vp()\n"
        "cuda.ok('cuGraphAddChildGraphNode', ref(twin), other, None, sz(0), other)\n"
        "emit(legacy_capture=legacy_capture, capturing=capturing, idle=idle_while_capturing,\n"
        "     capture_status=status.value, ndeps=ndeps.value, same_graph=same_graph, grids=grids,\n"
        "     whole=whole,\n"
        "     changed=changed, result=result)",
        gpu_env(FAKE_GPU_NS_PER_BLOCK=str(NS)),
    )
    assert report["whole"] == pytest.approx(100 * NS / 1e6, rel=1e-5)  # 10 + 20 + 30 + 40 blocks
    del report["whole"]
    assert report == {
        "legacy_capture": 900,  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        "capturing": 1,
        "idle": 0,
        "capture_status": 1,
        "ndeps": 1,
        "same_graph": True,
        "grids": [[0, 10], [0, 20], [0, 30]],
        "changed": 910,  # CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
        "result": 2,  # CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED
    }


# A child that queues `blocks` of kernels on CUDA ordinal 0 (NVML index 1), waits for them (unless
# told not to), and reports when.
WORKER = """
cuda.init()
cuda.use(0)
fn = cuda.kernel()
before = time.time_ns()
cuda.launch(fn, {blocks})
after = time.time_ns()
if {sync}:
    cuda.ok("cuCtxSynchronize")
emit(pid=os.getpid(), before=before, after=after, done=time.time_ns())
hold()
"""

PROBE = """
nvml = Nvml(os.environ["FAKE_NVML_LIB"])
q0 = time.time_ns()
rc, samples = nvml.process_utilization(1, {since_us})
gpu = nvml.utilization(1)
q1 = time.time_ns()
emit(rc=rc, samples=samples, gpu=gpu, q0=q0, q1=q1)
"""


def worker(env: dict[str, str], blocks: int, sync: bool = True) -> tuple[Child, dict]:
    child = start(WORKER.format(blocks=blocks, sync=sync), env)
    return child, child.read()


def test_process_utilization_is_kernel_time_over_the_window(gpu_env: Env) -> None:
    env = gpu_env(FAKE_GPU_NS_PER_BLOCK=str(NS))
    child, w = worker(env, 3000)  # 0.3 s
    since_ns = w["before"] - 100_000_000  # the window starts 0.1 s before the launch
    probe = run(PROBE.format(since_us=since_ns // 1000), env)
    busy = 3000 * NS
    # the sample covers [since, now] with now between q0 and q1, so smUtil lies between these
    high = 100 * busy / (probe["q0"] - since_ns)
    low = 100 * busy / (probe["q1"] - since_ns)
    assert probe["rc"] == 0
    assert list(probe["samples"]) == [str(w["pid"])]
    assert int(low) <= probe["samples"][str(w["pid"])] <= round(high + 0.5)
    later = run(PROBE.format(since_us=probe["q1"] // 1000), env)
    future = run(PROBE.format(since_us=(probe["q1"] // 1000) + 10**9), env)
    child.finish()
    assert later["rc"] == 6 and future["rc"] == 6  # NVML_ERROR_NOT_FOUND: no kernel since


def test_processes_share_the_device_one_kernel_at_a_time(gpu_env: Env) -> None:
    env = gpu_env(FAKE_GPU_NS_PER_BLOCK=str(NS))
    first, a = worker(env, 2000, sync=False)  # 0.2 s queued, not waited for
    second, b = worker(env, 1)
    # the second process's one block ran after the first process's kernel: it waited for both
    assert b["done"] >= a["before"] + 2000 * NS
    since = a["before"] - 100_000_000
    probe = run(PROBE.format(since_us=since // 1000), env)
    first.finish()
    second.finish()
    samples = {int(p): v for p, v in probe["samples"].items()}
    assert set(samples) == {a["pid"], b["pid"]}
    assert samples[a["pid"]] >= int(100 * 2000 * NS / (probe["q1"] - since))
    assert samples[b["pid"]] <= 1  # 0.1 ms in a window of more than 0.3 s


def test_device_utilization_follows_the_queued_work(gpu_env: Env) -> None:
    env = gpu_env(FAKE_GPU_NS_PER_BLOCK="1000000")  # 1 ms per block
    launcher = start(
        "cuda.init()\ncuda.use(0)\nfn = cuda.kernel()\nt = time.time_ns()\ncuda.launch(fn, 2500)\n"
        "emit(before=t, after=time.time_ns())\nhold()",
        env,
    )
    w = launcher.read()  # 2.5 s of work queued on an idle device, starting between before and after
    watcher = start(
        "nvml = Nvml(os.environ['FAKE_NVML_LIB'])\n"
        f"while time.time_ns() < {w['after']} + 1_200_000_000:\n"
        "    time.sleep(0.01)\n"
        "q0 = time.time_ns()\ngpu = nvml.utilization(1)\nq1 = time.time_ns()\n"
        "emit(gpu=gpu, q0=q0, q1=q1)",
        env,
    )
    r = watcher.read()
    watcher.finish()
    launcher.finish()

    def busy_share(now: int, start: int) -> float:
        """The fraction of [now - 1 s, now] inside the kernel [start, start + 2.5 s]."""
        lo, hi = max(now - 1_000_000_000, start), min(now, start + 2_500_000_000)
        return max(0, hi - lo) / 1e9

    # the 1 s window ending at the query: fully busy unless the query was late past the kernel's end
    shares = [busy_share(q, s) for q in (r["q0"], r["q1"]) for s in (w["before"], w["after"])]
    assert round(100 * min(shares)) <= r["gpu"] <= round(100 * max(shares))
