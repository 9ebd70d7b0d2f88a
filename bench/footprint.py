"""vgpud's footprint as a node runs it: resident memory with 2 GPUs and 200 live vGPU containers, and
process start -> SERVING.

One local node (tests/e2e/node.py: mock backend, profile a100-40gb-x2, NRI on) with one running vGPU
pod, and 200 more containers created through CRI in that pod's sandbox with its claim, never started
(bench/lib/localnode.py): real registrations of real containers in vgpud's NRI cache, through
containerd. Then vgpud is restarted (SIGTERM, same flags) three times: the time from process start to
its health service answering SERVING ('' service), with containerd's Synchronize of every container in
it, and the resident set (VmRSS, VmHWM of the process tree) once its cache holds every container again.
The reference, measured in the same run: a bare `python -c 'import vgpud.cli'` (its peak RSS and wall
time), so the ratios say what running the daemon costs beyond loading its code. Goals: RSS <= 80 MB and
start -> SERVING <= 1.5 s. Exits 1 when vgpud's cache does not hold every container.

    flock /tmp/vgpud-e2e.lock .venv/bin/python bench/footprint.py [--containers N] [--restarts N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.localnode import VgpuSandbox, usable, vgpu_sandbox
from bench.lib.results import Figure, emit
from tests.e2e import workload as w
from tests.e2e.leftovers import stop_on_signals
from tests.e2e.node import GPU_PROFILE, LocalNode
from vgpud.observe.client import Endpoint, get_json

RSS_GOAL_MB, START_GOAL_S = 80.0, 1.5
SERVING = 1  # grpc.health.v1 HealthCheckResponse.SERVING
REPO = Path(__file__).resolve().parent.parent


def tree_pids(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc/<pid>/task/*/children)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            todo += [int(c) for c in (task / "children").read_text().split()]
    return pids


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of the process tree under `pid`, in MiB."""
    rss = hwm = 0
    for member in tree_pids(pid):
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{member}/status").read_text().splitlines())
        rss += int(fields["VmRSS"].split()[0])
        hwm += int(fields["VmHWM"].split()[0])
    return rss / 1024, hwm / 1024


def cached_containers(node: LocalNode) -> set[str]:
    """The container IDs in vgpud's NRI cache (its debug state)."""
    state = get_json(Endpoint(unix_path=node.debug_socket), "/debug/state?calls=0")
    return {cid for entry in state["nri"]["cache"]["directories"].values() for cid in entry["container_ids"]}


def wait_cached(node: LocalNode, cids: set[str], timeout: float = 60) -> None:
    w.wait_for(lambda: cids <= cached_containers(node), timeout=timeout, interval=0.1, what="vgpud's cache")


def start_to_serving(node: LocalNode) -> float:
    """Restart vgpud; seconds from its process start to health SERVING."""
    import grpc

    node.stop_vgpud()
    began = time.monotonic()
    node.start_vgpud()
    deadline = began + 60
    while time.monotonic() < deadline:
        try:
            if node.vgpud_health("") == SERVING:
                return time.monotonic() - began
        except grpc.RpcError:
            pass
        time.sleep(0.005)  # a poll interval well under the figure's resolution
    raise RuntimeError("vgpud not SERVING within 60 s of its start")


#: the reference process: loads what `vgpud run` loads first, then reports its own memory
BARE = "import vgpud.cli, pathlib; print(pathlib.Path('/proc/self/status').read_text())"


def bare_import() -> tuple[float, float]:
    """(peak RSS MiB, wall seconds) of `python -c 'import vgpud.cli'`, from the child's own
    /proc/self/status (a wait4 rusage would count the forking parent's pages before exec)."""
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-c", BARE], cwd=REPO, check=True, capture_output=True, text=True)
    took = time.monotonic() - began
    fields = dict(line.split(":", 1) for line in out.stdout.splitlines() if ":" in line)
    return int(fields["VmHWM"].split()[0]) / 1024, took


def fill(box: VgpuSandbox, containers: int) -> set[str]:
    cids = set()
    for i in range(containers):
        cid, _ = box.create(box.config(f"fp-{i}"))
        cids.add(cid)
    return cids


@dataclass
class Run:
    #: seconds from process start to SERVING, and VmRSS / VmHWM (MiB) after it, per restart
    starts: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    hwm: list[float] = field(default_factory=list)
    #: VmRSS before the containers are created (the pod's own vGPU container only)
    before: float = 0.0
    #: the failed correctness check, if one failed
    wrong: str = ""


def measure(containers: int, restarts: int) -> Run:
    """A node, `containers` live vGPU containers, then `restarts` timed vgpud restarts."""
    run = Run()
    node = LocalNode(nri=True)
    node.start()
    try:
        box = vgpu_sandbox(node)
        run.before = memory_mb(node.procs["vgpud"].pid)[0]
        cids = fill(box, containers)
        for restart in range(restarts + 1):
            if restart:
                run.starts.append(start_to_serving(node))
            try:
                wait_cached(node, cids)
            except AssertionError:
                lacking = len(cids - cached_containers(node))
                run.wrong = f"after {restart} restarts vgpud's cache lacks {lacking} of the containers"
                break
            if restart:
                now, peak = memory_mb(node.procs["vgpud"].pid)
                run.rss.append(now)
                run.hwm.append(peak)
        box.remove(sorted(cids))
    finally:
        node.stop()
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=200, help="live vGPU containers (default 200)")
    parser.add_argument("--restarts", type=int, default=3, help="vgpud restarts timed (default 3)")
    args = parser.parse_args()
    if args.containers < 1 or args.restarts < 1:
        parser.error("--containers and --restarts must be at least 1")
    why = usable()
    if why:
        print(f"footprint: {why}", file=sys.stderr)
        emit("footprint", [], ok=False)
        return 2
    with stop_on_signals():
        run = measure(args.containers, args.restarts)
    starts, before, rss, hwm, wrong = run.starts, run.before, run.rss, run.hwm, run.wrong
    if wrong:
        print(f"FAILED: {wrong}", file=sys.stderr)
        emit("footprint", [], ok=False)
        return 1
    bare = [bare_import() for _ in range(3)]
    bare_rss = statistics.median(b[0] for b in bare)
    bare_time = statistics.median(b[1] for b in bare)
    start, resident, peak = statistics.median(starts), statistics.median(rss), statistics.median(hwm)
    print(f"vgpud run, GPU profile {GPU_PROFILE}, {args.containers} live vGPU containers + the pod's own")
    print(f"{'':28} {'vgpud':>10} {'reference':>10} {'ratio':>7}  reference: import vgpud.cli")
    for label, value, base in (
        ("RSS (MiB)", resident, bare_rss),
        ("peak RSS (MiB)", peak, bare_rss),
        ("start -> SERVING (s)", start, bare_time),
    ):
        print(f"{label:28} {value:>10.3f} {base:>10.3f} {value / base:>6.2f}x")
    added = resident - before
    print(
        f"{'RSS, 1 container (MiB)':28} {before:>10.3f}  (the {args.containers} containers: {added:+.1f} MiB)"
    )
    each = ", ".join(f"{s:.3f} s / {r:.1f} MiB" for s, r in zip(starts, rss, strict=True))
    print(f"(each of {args.restarts} restarts: {each})")
    emit(
        "footprint",
        [
            Figure(
                f"vgpud RSS, 2 GPUs, {args.containers} vGPU containers",
                resident * 1.048576,
                "MB",
                reference="python -c 'import vgpud.cli' peak RSS",
                ratio=resident / bare_rss,
                goal=f"<= {RSS_GOAL_MB:.0f} MB",
                met=resident * 1.048576 <= RSS_GOAL_MB,
            ),
            Figure(
                "vgpud process start -> SERVING",
                start,
                "s",
                reference="python -c 'import vgpud.cli' wall",
                ratio=start / bare_time,
                goal=f"<= {START_GOAL_S} s",
                met=start <= START_GOAL_S,
            ),
        ],
        ok=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
