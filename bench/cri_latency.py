"""CRI CreateContainer through containerd on the local node: what vgpud's NRI plugin adds.

One local node (tests/e2e/node.py, NRI on) with one running vGPU pod; `crictl create` makes containers
in that pod's sandbox using its claim, never started (bench/lib/localnode.py). The same creates are
timed in three kinds of phase, alternating, same node, same image, same configs: vgpud running (its
plugin attached to containerd's NRI), vgpud stopped and the Go stub plugin of the NRI bench
(tests/conformance/nri/goplugin: the same injection on NRI's own Go stub) attached instead, and no
plugin at all. Each create is one crictl process, so a figure is crictl + CRI + containerd (+ a
plugin's hook): the no-plugin phases are the reference, and the figure is what vgpud adds at the median,
beside what the Go plugin adds through the same containerd code (goal: vgpud's within 0.5 ms of the Go
plugin's, measured in the same run; both include the disk's directories, 2-3 ms each on this
project's build machine, so an absolute bound would measure the disk). Exits 1
when a container created with a plugin attached lacks its injection, or one created without has it.

    flock /tmp/vgpud-e2e.lock .venv/bin/python bench/cri_latency.py [--containers N] [--cycles N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.localnode import VgpuSandbox, usable, vgpu_sandbox
from bench.lib.results import Figure, emit
from bench.lib.stats import percentile
from tests.conformance.nri import gobuild
from tests.e2e.leftovers import stop_on_signals
from tests.e2e.node import LocalNode
from vgpud.metrics_names import HOOK_DURATION

#: vgpud's added median at most this much above the Go stub plugin's
GOAL_OVER_GO_MS = 0.5
#: the phases of one cycle: which plugin containerd calls ("" for none)
PHASES = ("vgpud", "go", "")
LABELS = {"vgpud": "vgpud", "go": "Go stub", "": "no plugin"}
#: attempts to see the plugin's state change take effect on containerd's side (a create each)
SETTLE_TRIES = 50


def settle(box: VgpuSandbox, plugin_on: bool, tag: str) -> None:
    """Create containers until one is injected exactly when the plugin is on: containerd learns of a
    plugin's connection (or its loss) a moment after vgpud's health says so."""
    config = box.config(f"settle-{tag}")
    for _ in range(SETTLE_TRIES):
        cid, _ = box.create(config)
        seen = box.injected(cid)
        box.remove([cid])
        if seen == plugin_on:
            return
    raise RuntimeError(f"containerd still {'without' if plugin_on else 'with'} vgpud's plugin")


def phase(box: VgpuSandbox, containers: int, tag: str) -> tuple[list[float], list[str]]:
    """Time `containers` creates (vGPU configs); the IDs, to check and remove after timing."""
    times, cids = [], []
    configs = [box.config(f"{tag}-{i}") for i in range(containers)]
    for config in configs:
        cid, seconds = box.create(config)
        times.append(seconds)
        cids.append(cid)
    return times, cids


@contextmanager
def go_plugin(box: VgpuSandbox, binary: Path) -> Iterator[None]:
    """The Go stub plugin attached to the node's containerd, injecting the bench's claim; stopped by
    PID on leaving."""
    with tempfile.TemporaryDirectory(prefix="goplugin-", dir=box.node.workdir) as root:
        argv = [str(binary), "--socket", str(box.node.nri_root / "nri.sock"), "--manager-root", root]
        argv += ["--prepared-claim", box.claim_uid, "--name", "bench-go-stub"]
        with box.node.log("goplugin").open("ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def attached(node: LocalNode, box: VgpuSandbox, plugin: str, goplugin: Path) -> AbstractContextManager[None]:
    """vgpud running for "vgpud", else stopped (and the Go stub attached for "go")."""
    if plugin == "vgpud":
        if "vgpud" not in node.procs:
            node.start_vgpud()
            node.wait_vgpud(time.monotonic() + 60)
    else:
        node.stop_vgpud()
    return go_plugin(box, goplugin) if plugin == "go" else nullcontext()


def hook_seconds(node: LocalNode) -> tuple[float, float]:
    """(seconds, calls) vgpud has spent in NRI CreateContainer so far, by its own histogram."""
    totals = {"_sum": 0.0, "_count": 0.0}
    for suffix in totals:
        for labels, value in node.metric_samples(HOOK_DURATION.name + suffix):
            if labels.get("component") == "nri" and labels.get("call") == "CreateContainer":
                totals[suffix] += value
    return totals["_sum"], totals["_count"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=40, help="creates per phase (default 40)")
    parser.add_argument(
        "--cycles", type=int, default=2, help="vgpud / Go stub / no plugin phase triples (default 2)"
    )
    args = parser.parse_args()
    if args.containers < 1 or args.cycles < 1:
        parser.error("--containers and --cycles must be at least 1")
    why = usable()
    if why:
        print(f"cri_latency: {why}", file=sys.stderr)
        emit("cri_latency", [], ok=False)
        return 2
    try:
        goplugin = gobuild.build("goplugin", "v0.12", log=sys.stderr)
    except gobuild.BuildError as err:
        print(f"cri_latency: {err}", file=sys.stderr)
        emit("cri_latency", [], ok=False)
        return 1
    times: dict[str, list[float]] = {plugin: [] for plugin in PHASES}
    #: vgpud's own time in the timed creates (its histogram's sum), and how many
    inside = [0.0, 0.0]
    wrong: list[str] = []
    node = LocalNode(nri=True)
    with stop_on_signals():
        started = time.monotonic()
        node.start()
        try:
            print(f"local node ready in {time.monotonic() - started:.1f} s: {node.workdir}")
            box = vgpu_sandbox(node)
            for cycle in range(args.cycles):
                for plugin in PHASES:
                    tag = f"{plugin or 'none'}{cycle}"
                    plugin_on = bool(plugin)
                    with attached(node, box, plugin, goplugin):
                        settle(box, plugin_on, tag)
                        before = hook_seconds(node) if plugin == "vgpud" else (0.0, 0.0)
                        phase_times, cids = phase(box, args.containers, tag)
                        if plugin == "vgpud":
                            after = hook_seconds(node)
                            inside = [inside[0] + after[0] - before[0], inside[1] + after[1] - before[1]]
                    times[plugin] += phase_times
                    bad = [cid for cid in cids if box.injected(cid) != plugin_on]
                    if bad:
                        state = "without" if plugin_on else "with"
                        wrong.append(f"{tag}: {len(bad)} of {len(cids)} containers {state} the injection")
                    box.remove(cids)
            if "vgpud" not in node.procs:  # leave the node as it was for its own teardown
                node.start_vgpud()
                node.wait_vgpud(time.monotonic() + 60)
        finally:
            node.stop()
    if inside[1] != len(times["vgpud"]):
        wrong.append(f"vgpud counted {inside[1]:.0f} CreateContainer calls for {len(times['vgpud'])} creates")
    report(times, inside[0] / max(inside[1], 1) * 1e3, wrong)
    return 1 if wrong else 0


def report(times: dict[str, list[float]], inside_ms: float, wrong: list[str]) -> None:
    """The table, and the summary line: vgpud's added median against the goal, the Go stub's beside it."""
    print(f"crictl create of a vGPU container, {len(times[''])} per column, milliseconds")
    print(f"{'':6} {'no plugin':>10} {'vgpud':>8} {'added':>7} {'Go stub':>8} {'added':>7}  vgpud/Go added")
    added: dict[tuple[str, int], float] = {}
    ratio: dict[tuple[str, int], float] = {}
    for q in (50, 99):
        base, ours, go = (percentile(times[p], q) * 1e3 for p in ("", "vgpud", "go"))
        for plugin, value in (("vgpud", ours), ("go", go)):
            added[plugin, q], ratio[plugin, q] = value - base, value / base
        versus = f"{(ours - base) / (go - base):.2f}x" if go > base else "-"
        row = f"{base:>10.2f} {ours:>8.2f} {ours - base:>7.2f} {go:>8.2f} {go - base:>7.2f}"
        print(f"{'p' + str(q):6} {row}  {versus}")
    print(f"vgpud's own time in CreateContainer (its hook histogram), mean: {inside_ms:.2f} ms")
    for line in wrong:
        print(f"FAILED: {line}", file=sys.stderr)
    reference = "same creates, no plugin"
    emit(
        "cri_latency",
        [
            Figure(
                "CRI CreateContainer, median added by vgpud",
                added["vgpud", 50],
                "ms",
                reference,
                ratio["vgpud", 50],
            ),
            Figure(
                "CRI CreateContainer, median added: vgpud - Go",
                added["vgpud", 50] - added["go", 50],
                "ms",
                "the Go stub plugin's added median",
                None,
                goal=f"<= {GOAL_OVER_GO_MS:.1f} ms",
                met=added["vgpud", 50] - added["go", 50] <= GOAL_OVER_GO_MS,
            ),
            Figure(
                "CRI CreateContainer, median added by Go stub",
                added["go", 50],
                "ms",
                reference,
                ratio["go", 50],
            ),
            Figure(
                "CRI CreateContainer, p99 added by vgpud",
                added["vgpud", 99],
                "ms",
                reference,
                ratio["vgpud", 99],
            ),
        ],
        ok=not wrong,
    )


if __name__ == "__main__":
    raise SystemExit(main())
