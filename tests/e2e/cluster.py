"""Several local nodes on this machine sharing one control plane: a cluster, as kubemark and kind's
variants run one, since nested VMs do not boot here. Each node is a LocalNode (tests/e2e/node.py) with
its own containerd (1.7 or 2.x, NRI on or off), kubelet (its root dir, its cgroupRoot `/vgc-<name>`,
its node IP on `lo`), fake GPUs and driver root, and vgpud; the control plane (etcd, API server,
controller manager, scheduler) lives in a work dir of its own. `stop()` tears the nodes down in reverse
order, then the control plane, by PID; a SIGKILLed launcher's leftovers are reaped at the next start
(tests/e2e/leftovers.py).

    python -m tests.e2e.cluster [--nodes N] [--nri on,off,...] [--containerd 1.7,2,...] [--chart]
        bring a cluster up, print where everything is, Ctrl-C stops it
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.controlplane import ControlPlane
from tests.e2e.leftovers import (
    CLUSTER_CGROUP_PREFIX,
    mark_owner,
    mounts_under,
    reap_dead_nodes,
    stop_on_signals,
)
from tests.e2e.node import CONTAINERD_1, CONTAINERD_2, READY_TIMEOUT_S, HostRunState, LocalNode


@dataclass(frozen=True)
class NodeSpec:
    """One node of the cluster: its name, NRI on or off, its containerd, the module vgpud runs as
    (tests/e2e/previous_vgpud.py plays an older release)."""

    name: str
    nri: bool = True
    containerd: str = CONTAINERD_1
    vgpud_module: str = "vgpud"


@dataclass
class LocalCluster:
    """The cluster; each node's work dir is `<workdir>/<node name>`, so that a path of one node is
    another's with the name changed (the chart's `hostPaths.nodeRoot` relies on it)."""

    specs: list[NodeSpec]
    keep: bool = False
    #: vgpud installed by the chart, one DaemonSet across the nodes (tests/e2e/chart.py), instead of
    #: a host process on each
    chart: bool = False
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="vgn", dir="/tmp")))
    control: ControlPlane | None = None
    nodes: dict[str, LocalNode] = field(default_factory=dict)
    _run_before: HostRunState | None = None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """The control plane, then each node in turn until it is Ready with vgpud serving (with
        `chart`: every node Ready, then the chart installed, then vgpud serving on each)."""
        for line in reap_dead_nodes(own=self.workdir):
            print(f"local cluster: {line}", file=sys.stderr, flush=True)
        mark_owner(self.workdir)
        self._run_before = HostRunState.now()
        try:
            if self.chart:
                self._share_workdir()
            self.control = ControlPlane(self.workdir, self.workdir / "logs")
            self.control.start(timeout_s)
            for spec in self.specs:
                node = LocalNode(
                    nri=spec.nri,
                    name=spec.name,
                    containerd=spec.containerd,
                    fake_gpu=True,
                    keep=self.keep,
                    workdir=self.workdir / spec.name,
                    control=self.control,
                    cgroup_root=f"/{CLUSTER_CGROUP_PREFIX}{spec.name}",
                    vgpud_module=spec.vgpud_module,
                    chart=self.chart,
                )
                self.nodes[spec.name] = node
                node.start(timeout_s, with_vgpud=not self.chart)
            if self.chart:
                from tests.e2e import chart

                deadline = time.monotonic() + timeout_s
                chart.install_on_cluster(list(self.nodes.values()), self.workdir, deadline)
                for node in self.nodes.values():
                    node.wait_serving(deadline)
        except BaseException:
            self.stop()
            raise

    def _share_workdir(self) -> None:
        """The chart mounts the work dir (`hostPaths.nodeRoot`) Bidirectional, which the runtime allows
        only on a shared mount, as / is on a systemd host (this machine's / is private): the dir is made
        a shared mount of its own."""
        root = str(self.workdir)
        subprocess.run(["mount", "--bind", root, root], check=True, capture_output=True)
        subprocess.run(["mount", "--make-rshared", root], check=True, capture_output=True)

    def stop(self) -> None:
        """Idempotent."""
        for name in reversed(list(self.nodes)):
            self.nodes.pop(name).stop()
        for point in mounts_under(self.workdir):  # the shared mount of `chart`
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        if self._run_before is not None:  # every containerd is stopped: their entries go
            self._run_before.remove_what_appeared()
            self._run_before = None
        if self.control is not None:
            self.control.stop()
            self.control = None
        if self.keep:
            print(f"local cluster: kept {self.workdir}", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def describe(self) -> str:
        assert self.control is not None and self.control.api is not None
        lines = [f"local cluster of {len(self.nodes)} nodes in {self.workdir}"]
        lines.append(f"  kubeconfig  {self.control.api.kubeconfig}")
        lines += [f"  {name}: {path}" for name, path in sorted(self.control.all_logs().items())]
        return "\n".join([*lines, *(node.describe() for node in self.nodes.values())])


@contextmanager
def started(specs: list[NodeSpec], *, chart: bool = False) -> Iterator[LocalCluster]:
    """A cluster of `specs`, started, and stopped on the way out whatever happened inside; its temp
    dirs (logs) kept when VGPUD_KEEP_CLUSTER=1."""
    cluster = LocalCluster(specs, chart=chart, keep=os.environ.get("VGPUD_KEEP_CLUSTER") == "1")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def per_node(
    parser: argparse.ArgumentParser, option: str, value: str, allowed: dict[str, Any], n: int
) -> list[Any]:
    """`value` (by commas, the last repeating) as one of `allowed`'s values per node; a word not in
    `allowed` is refused."""
    words = value.split(",")
    unknown = sorted(set(words) - set(allowed))
    if unknown:
        parser.error(f"{option}: {', '.join(unknown)} is not one of {', '.join(allowed)}")
    return [allowed[words[min(i, len(words) - 1)]] for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Bring up a local cluster of several nodes until Ctrl-C.")
    parser.add_argument("--nodes", type=int, default=2, help="how many nodes (default 2)")
    parser.add_argument(
        "--nri", default="on", help="NRI per node, by commas (on,off,...; default on); the last repeats"
    )
    parser.add_argument(
        "--containerd",
        default=CONTAINERD_1,
        help=f"containerd per node, by commas ({CONTAINERD_1} or {CONTAINERD_2}; default {CONTAINERD_1}); "
        "the last repeats",
    )
    parser.add_argument(
        "--chart",
        action="store_true",
        help="install vgpud with the Helm chart, one DaemonSet across the nodes (default: a host "
        "process on each)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dirs (logs) after stopping")
    args = parser.parse_args(argv)
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    modes = per_node(parser, "--nri", args.nri, {"on": True, "off": False}, args.nodes)
    runtimes = per_node(
        parser,
        "--containerd",
        args.containerd,
        {CONTAINERD_1: CONTAINERD_1, CONTAINERD_2: CONTAINERD_2},
        args.nodes,
    )
    specs = [NodeSpec(f"node-{i}", nri=modes[i], containerd=runtimes[i]) for i in range(args.nodes)]
    began = time.monotonic()
    cluster = LocalCluster(specs, keep=args.keep, chart=args.chart)
    with stop_on_signals():
        try:
            cluster.start()
            print(f"ready in {time.monotonic() - began:.1f} s\n{cluster.describe()}", flush=True)
            signal.pause()
        except KeyboardInterrupt:
            print()
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
