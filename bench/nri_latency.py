"""NRI CreateContainer round trip and Synchronize time: vgpud's plugin against the Go stub plugin.

One run of the Go harness (tests/conformance/nri/, README.md there) with containerd's own runtime side of
NRI in process drives, one after the other, vgpud's NRI plugin (tests/conformance/nri/plugin_under_test.py)
and a minimal Go plugin on NRI's own stub doing the same injection (directories, 5 mounts, 5 env vars):
CreateContainer p50/p99 and calls/s at concurrency 1 and 32 (the runtime serializes CreateContainer, so
at 32 a call's time includes its wait), the time to Synchronize 10,000 containers, and process start ->
synchronized. The ratio column is the figure. Builds the harness on first use (Go >= 1.24 and the Go
module proxy on a cold cache).

    .venv/bin/python bench/nri_latency.py [--calls N] [--nri v0.12|v0.6.1] [--verbose] [--profile OUT]

--profile samples the plugin under test with py-spy (a dev dependency) for its whole run and writes
py-spy's raw format (collapsed stacks with counts) to OUT; the figures then include py-spy's pauses.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.results import Figure, emit
from tests.conformance.nri import gobuild

#: the goals: CreateContainer's p99 and Synchronize's time as ratios to the Go stub plugin's in the
#: same run (an absolute p99 is the disk's: both plugins make the same directories, and the Go stub's
#: own c=1 p99 was 3-4 ms on this project's build machine)
GOAL_CREATE_RATIO = 1.3
GOAL_SYNC_RATIO = 1.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="CreateContainer calls per row")
    parser.add_argument("--nri", choices=list(gobuild.VARIANTS), default="v0.12", help="runtime NRI version")
    parser.add_argument("--plugin-cmd", help="the plugin under test as a JSON array (default: vgpud's)")
    parser.add_argument("--verbose", action="store_true", help="stream the runtime's and plugins' logs")
    parser.add_argument("--profile", type=Path, help="py-spy raw profile of the plugin under test, here")
    args = parser.parse_args()

    if not gobuild.go_usable():
        print(f"nri_latency: needs Go >= {'.'.join(map(str, gobuild.MIN_GO))} on PATH", file=sys.stderr)
        return 2
    plugin_cmd = json.loads(args.plugin_cmd) if args.plugin_cmd else gobuild.plugin_under_test_cmd()
    if not args.plugin_cmd and not gobuild.PLUGIN_UNDER_TEST.exists():
        print(f"nri_latency: {gobuild.PLUGIN_UNDER_TEST} is missing", file=sys.stderr)
        return 2
    try:
        harness = gobuild.build("harness", args.nri, log=sys.stderr)
        goplugin = gobuild.build("goplugin", "v0.12", log=sys.stderr)
    except gobuild.BuildError as err:
        print(err, file=sys.stderr)
        return 1
    label = "plugin under test" if args.plugin_cmd else "vgpud (Python)"
    if args.profile is not None:
        plugin_cmd = [sys.executable, __file__, PROFILED, str(args.profile.resolve()), "--", *plugin_cmd]
    bench_args = ["-test.run", "^TestBench$", "-test.timeout", "3000s", "-vgpud.bench"]
    bench_args += [f"-vgpud.bench-calls={args.calls}", f"-vgpud.bench-label={label}"]
    with tempfile.TemporaryFile("w+") as log, tempfile.TemporaryDirectory() as scratch:
        figures_json = Path(scratch) / "figures.json"
        bench_args.append(f"-vgpud.bench-json={figures_json}")
        result = gobuild.run(
            harness,
            bench_args,
            plugin_cmd=plugin_cmd,
            goplugin_cmd=[str(goplugin)],
            timeout=3600,
            echo_stdout=sys.stdout,
            echo_stderr=sys.stderr if args.verbose else log,
        )
        if result.returncode != 0 and not args.verbose:
            log.seek(0)
            tail = log.read().splitlines()[-60:]
            print("\n".join(["nri_latency: the harness failed; last log lines:", *tail]), file=sys.stderr)
        ok = result.returncode == 0 and figures_json.is_file()
        emit("nri_latency", summary_figures(json.loads(figures_json.read_text())) if ok else [], ok=ok)
    return 0 if ok else 1


def summary_figures(rows: list[dict]) -> list[Figure]:
    """The harness's figures (plugin under test first, the Go stub second) as summary lines."""
    ours, go = rows
    figures = []
    for conc in (1, 32):
        mine, ref = ours[f"create_c{conc}"]["p99_ms"], go[f"create_c{conc}"]["p99_ms"]
        ratio = mine / ref
        met = ratio <= GOAL_CREATE_RATIO
        goal = f"<= {GOAL_CREATE_RATIO}x"
        figures.append(
            Figure(f"NRI CreateContainer p99, c={conc}", mine, "ms", "Go stub plugin", ratio, goal, met)
        )
    ratio = ours["sync_ms"] / go["sync_ms"]
    figures.append(
        Figure(
            "NRI Synchronize, 10,000 containers",
            ours["sync_ms"],
            "ms",
            "Go stub plugin",
            ratio,
            f"<= {GOAL_SYNC_RATIO}x",
            ratio <= GOAL_SYNC_RATIO,
        )
    )
    return figures


PROFILED = "--run-profiled"
PY_SPY = Path(sys.executable).with_name("py-spy")


def run_profiled(out: str, cmd: list[str]) -> int:
    """Run `cmd` (the harness adds its arguments) under py-spy attached by PID, so the plugin still
    gets the harness's SIGTERM itself and exits with its own status; py-spy writes `out` when it ends."""
    plugin = subprocess.Popen(cmd)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda sig, _frame: plugin.send_signal(sig))
    spy = subprocess.Popen(
        [str(PY_SPY), "record", "--pid", str(plugin.pid), "--rate", "250", "--format", "raw", "-o", out],
        stdout=subprocess.DEVNULL,
    )
    status = plugin.wait()
    spy.wait()
    return status


if __name__ == "__main__":
    if sys.argv[1:2] == [PROFILED]:
        sys.exit(run_profiled(sys.argv[2], sys.argv[4:]))
    sys.exit(main())
