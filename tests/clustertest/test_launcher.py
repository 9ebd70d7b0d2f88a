"""The cluster's launcher (`python -m tests.e2e.cluster`, `make cluster`) as the node's: SIGTERM tears
every node and the control plane down, and the next start clears what a SIGKILLed launcher left:
its nodes' processes, mounts and node IPs on `lo`, and its dir."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.e2e.cluster import NodeSpec, started
from tests.e2e.leftovers import mounts_under, pids_naming
from tests.e2e.nodeip import NODE_IP_FILE, host_addresses
from tests.launcher.test_launcher import EXIT_TIMEOUT_S, start_launcher

#: what the cluster launcher prints once ready; group 1: the cluster's dir
CLUSTER_READY = r"local cluster of \d+ nodes in (\S+)"
ARGV = ("tests.e2e.cluster", "--nodes", "2", "--nri", "on,off")


def node_ips(workdir: Path) -> set[str]:
    return {f.read_text().strip() for f in workdir.glob(f"*/{NODE_IP_FILE}")}


def gone(workdir: Path, ips: set[str]) -> None:
    assert pids_naming(workdir) == []
    assert mounts_under(workdir) == []
    assert not workdir.exists()
    assert not ips & host_addresses(), "node IPs left on lo"


def test_sigterm_tears_the_cluster_down(tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    launcher, workdir = start_launcher(log, ARGV, CLUSTER_READY)
    ips = node_ips(workdir)
    assert len(ips) == 2, ips
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(EXIT_TIMEOUT_S) == 0, log.read_text()[-3000:]
    gone(workdir, ips)


def test_after_sigkill_the_next_start_clears_the_dead_cluster(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    launcher, workdir = start_launcher(tmp_path / "launcher.log", ARGV, CLUSTER_READY)
    ips = node_ips(workdir)
    launcher.kill()
    launcher.wait()
    assert pids_naming(workdir), "a SIGKILLed launcher leaves its cluster running"
    with started([NodeSpec("node-0")]):
        said = capfd.readouterr().err
        assert f"removed {workdir}" in said, said
        for ip in ips:
            assert f"removed the node IP {ip} from lo" in said, said
        gone(workdir, ips)
