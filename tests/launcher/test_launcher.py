"""The local node's launcher tears its node down on SIGTERM and SIGHUP as on Ctrl-C, and the next
start clears what a SIGKILLed launcher left running.

These start nodes of their own, so they must not run beside the e2e suite's session node (containerd
and the kubelet share host-wide state): `make test` runs this directory in a pytest run of its own.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.leftovers import cgroup_dirs, mounts_under, pids_naming
from tests.e2e.node import INSTALL_HINT, LocalNode, node_available
from tests.support import REPO, require

READY_TIMEOUT_S = 150.0
EXIT_TIMEOUT_S = 90.0


@pytest.fixture(autouse=True)
def _needs_a_node() -> None:
    require(os.geteuid() == 0, "root (containerd, runc and the kubelet need it)", "run the tests as root")
    require(node_available(), "the local node (containerd, runc, kubelet, images)", INSTALL_HINT)


#: what the node launcher prints once its node is ready; group 1: the node's work dir
NODE_READY = r"local node \S+ \(containerd \S+, NRI \w+\) in (\S+)"


def start_launcher(
    log: Path, argv: tuple[str, ...] = ("tests.e2e.node", "--nri", "off"), ready: str = NODE_READY
) -> tuple[subprocess.Popen[str], Path]:
    """`python -m <argv>` until it prints a line matching `ready`; (the launcher, the work dir that
    line names).

    Its output is read on a thread, so a launcher that hangs without printing fails the test at the
    deadline (and is torn down with SIGTERM) instead of blocking the read."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_forward_lines, args=(launcher, lines), daemon=True).start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            tear_down(launcher)
            took = f"{READY_TIMEOUT_S:.0f} s"
            pytest.fail(f"the launcher did not get ready in {took}:\n{log.read_text()[-3000:]}")
        if line is None:
            pytest.fail(f"the launcher ended without a node:\n{log.read_text()[-3000:]}")
        found = re.match(ready, line)
        if found:
            return launcher, Path(found[1])


def _forward_lines(launcher: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """Every line of the launcher's stdout into `lines`, then None at its end."""
    assert launcher.stdout is not None
    for line in launcher.stdout:
        lines.put(line)
    lines.put(None)


def tear_down(launcher: subprocess.Popen[str]) -> None:
    """SIGTERM (the launcher stops its node), SIGKILL if it does not exit in time."""
    launcher.terminate()
    try:
        launcher.wait(EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_tears_the_node_down_like_ctrl_c(sig: signal.Signals, tmp_path: Path) -> None:
    launcher_log = tmp_path / "launcher.log"
    cgroups_before = cgroup_dirs()
    launcher, workdir = start_launcher(launcher_log)
    assert pids_naming(workdir), "the node's processes name its work dir"
    launcher.send_signal(sig)
    assert launcher.wait(EXIT_TIMEOUT_S) == 0, launcher_log.read_text()[-3000:]
    assert f"{sig.name} received" in launcher_log.read_text()
    assert pids_naming(workdir) == []
    assert mounts_under(workdir) == []
    assert not workdir.exists()
    assert cgroup_dirs() - cgroups_before == set()


def test_after_sigkill_the_next_start_clears_the_dead_node(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    launcher_log = tmp_path / "launcher.log"
    launcher, workdir = start_launcher(launcher_log)
    launcher.kill()
    launcher.wait()
    orphans = pids_naming(workdir)
    assert orphans, "a SIGKILLed launcher leaves its node running (what the next start must clear)"
    commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in orphans]
    assert any(b"vgpud" in c for c in commands) and any(b"kubelet" in c for c in commands)
    node = LocalNode(nri=False)
    try:
        node.start()
        said = capfd.readouterr().err
        assert f"removed {workdir}" in said
        assert f"processes of the dead node {workdir}" in said
        assert pids_naming(workdir) == []
        assert mounts_under(workdir) == []
        assert not workdir.exists()
    finally:
        node.stop()
