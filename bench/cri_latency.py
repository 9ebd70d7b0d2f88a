"""CRI CreateContainer through containerd on the local node: what vgpud's NRI plugin adds.

One local node (tests/e2e/node.py, NRI on) with one running vGPU pod; `crictl create` makes containers
in that pod's sandbox using its claim, never started (bench/lib/localnode.py). The same creates are
timed with vgpud running (its plugin attached to containerd's NRI) and with vgpud stopped (containerd
calls no plugin), alternating phases, same node, same image, same configs. Each create is one crictl
process, so a figure is crictl + CRI + containerd (+ vgpud's hook): the plugin-off phases are the
reference and the figure is what the plugin adds (goal: <= 1.0 ms at the median). Exits 1 when a
container created with the plugin on lacks vgpud's injection, or one created with it off has it.

    flock /tmp/vgpud-e2e.lock .venv/bin/python bench/cri_latency.py [--containers N] [--cycles N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.localnode import VgpuSandbox, usable, vgpu_sandbox
from bench.lib.results import Figure, emit
from bench.lib.stats import percentile
from tests.e2e.leftovers import stop_on_signals
from tests.e2e.node import LocalNode

GOAL_MS = 1.0
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=40, help="creates per phase (default 40)")
    parser.add_argument("--cycles", type=int, default=2, help="on/off phase pairs (default 2)")
    args = parser.parse_args()
    if args.containers < 1 or args.cycles < 1:
        parser.error("--containers and --cycles must be at least 1")
    why = usable()
    if why:
        print(f"cri_latency: {why}", file=sys.stderr)
        emit("cri_latency", [], ok=False)
        return 2
    times: dict[bool, list[float]] = {True: [], False: []}
    wrong: list[str] = []
    node = LocalNode(nri=True)
    with stop_on_signals():
        started = time.monotonic()
        node.start()
        try:
            print(f"local node ready in {time.monotonic() - started:.1f} s: {node.workdir}")
            box = vgpu_sandbox(node)
            for cycle in range(args.cycles):
                for plugin_on in (True, False):
                    tag = f"{'on' if plugin_on else 'off'}{cycle}"
                    if plugin_on and "vgpud" not in node.procs:
                        node.start_vgpud()
                        node.wait_vgpud(time.monotonic() + 60)
                    elif not plugin_on:
                        node.stop_vgpud()
                    settle(box, plugin_on, tag)
                    phase_times, cids = phase(box, args.containers, tag)
                    times[plugin_on] += phase_times
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
    on, off = times[True], times[False]
    print(f"crictl create of a vGPU container, {len(on)} per column, milliseconds")
    print(f"{'':10} {'plugin off':>11} {'plugin on':>11} {'added':>8} {'ratio':>7}")
    figures = {}
    for q in (50, 99):
        base, value = percentile(off, q) * 1e3, percentile(on, q) * 1e3
        figures[q] = (value - base, value / base)
        print(f"{'p' + str(q):10} {base:>11.2f} {value:>11.2f} {value - base:>8.2f} {value / base:>6.2f}x")
    for line in wrong:
        print(f"FAILED: {line}", file=sys.stderr)
    added50, ratio50 = figures[50]
    emit(
        "cri_latency",
        [
            Figure(
                "CRI CreateContainer, median added by vgpud",
                added50,
                "ms",
                reference="same creates, vgpud stopped",
                ratio=ratio50,
                goal=f"<= {GOAL_MS:.1f} ms",
                met=added50 <= GOAL_MS,
            ),
            Figure(
                "CRI CreateContainer, p99 added by vgpud",
                figures[99][0],
                "ms",
                reference="same creates, vgpud stopped",
                ratio=figures[99][1],
            ),
        ],
        ok=not wrong,
    )
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
