"""`vgpud top` on the local node while vGPU pods run: two pods of the fake-GPU track, each holding fake
GPU memory under its own limits, shown under their GPU by `--once` and redrawn by the live view in a
real terminal (a detached tmux session on a private server), which quits on `q` with exit code 0."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import fakegpu
from tests.e2e import workload as w
from tests.e2e.node import LocalNode
from tests.support import require
from vgpud.observe.top import size

MiB, GiB = 1 << 20, 1 << 30
#: pod -> (claim memory, cores %, what its probe takes); both on the GPU with minor 0
PODS = {"top-a": ("1Gi", 30, 256 * MiB), "top-b": ("2Gi", 20, 512 * MiB)}
LIMITS = {"top-a": GiB, "top-b": 2 * GiB}
SESSION = "top"

pytestmark = pytest.mark.parametrize("node", ["nri-fakegpu"], indirect=True)


def vgpud_top(node: LocalNode, *argv: str) -> subprocess.CompletedProcess[str]:
    """`vgpud top ARGV` on the node's debug socket, this tree's vgpud (PYTHONPATH passes through)."""
    return subprocess.run(
        [sys.executable, "-m", "vgpud", "top", "--socket", str(node.debug_socket), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k not in {"COLUMNS", "LINES"}},
        check=False,
    )


def shown(node: LocalNode, ns: str) -> dict[str, tuple[int, dict[str, Any]]]:
    """pod -> (its GPU's index, its container's entry) in `vgpud top --json`, for this namespace."""
    result = vgpud_top(node, "--json")
    assert result.returncode == 0, result.stderr
    return {
        v["pod"]: (g["index"], v)
        for g in json.loads(result.stdout)["gpus"]
        for v in g["vgpus"]
        if v["namespace"] == ns
    }


def all_read(node: LocalNode, ns: str) -> dict[str, tuple[int, dict[str, Any]]] | None:
    """Both pods' containers shown with their limits and the memory their probes hold."""
    found = shown(node, ns)
    ready = set(found) == set(PODS) and all(
        found[pod][1]["memory_used_bytes"] == PODS[pod][2] for pod in PODS
    )
    return found if ready else None


class Tmux:
    """A private tmux server (its own socket), never the user's."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def __call__(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-S", str(self.socket), *argv], capture_output=True, text=True, timeout=30, check=True
        )

    def capture(self) -> list[str]:
        return self("capture-pane", "-p", "-t", SESSION).stdout.splitlines()

    def wait_screen(self, predicate: Any, what: str, timeout: float = 30) -> list[str]:
        screens: list[list[str]] = []

        def check() -> bool:
            screens.append(self.capture())
            return predicate(screens[-1])

        try:
            w.wait_for(check, timeout=timeout, interval=0.3, what=what)
        except AssertionError as err:
            raise AssertionError(f"{err}; the pane shows:\n" + "\n".join(screens[-1])) from None
        return screens[-1]


@contextmanager
def tmux_server() -> Iterator[Tmux]:
    directory = Path(tempfile.mkdtemp(prefix="vgtmux", dir="/tmp"))  # a unix socket's path is short
    tmux = Tmux(directory / "tmux.sock")
    try:
        yield tmux
    finally:
        subprocess.run(["tmux", "-S", str(tmux.socket), "kill-server"], capture_output=True, check=False)
        shutil.rmtree(directory, ignore_errors=True)


def gpu_blocks(lines: list[str]) -> dict[int, list[str]]:
    """GPU index -> its row and the lines under it, from `vgpud top`'s table."""
    blocks: dict[int, list[str]] = {}
    current = None
    for line in lines:
        head = line[:3].strip()
        if head.isdigit() and line[3:5] == "  ":
            current = int(head)
            blocks[current] = []
        if current is not None:
            blocks[current].append(line)
    return blocks


def test_top_shows_the_pods_under_their_gpu_and_follows_them_live(node: LocalNode) -> None:
    require(shutil.which("tmux") is not None, "tmux", "install Debian's tmux (apt-get install tmux)")
    ns = w.namespace(node)
    try:
        for pod, (memory, cores, take) in PODS.items():
            w.create_claim(node, ns, pod, [w.on_gpu(w.vgpu_request("gpu", memory, str(cores)), 0)])
            probe = fakegpu.probe_container(node, "main", None, "take", str(take))
            fakegpu.create_probe_pod(node, ns, pod, [probe], pod)
        for pod in PODS:
            w.wait_running(node, ns, pod)
        found = w.wait_for(lambda: all_read(node, ns), timeout=60, what="both containers in vgpud top --json")
        (index,) = {i for i, _ in found.values()}

        # (a) one reading: each container under its GPU with its limits, the GPU's allocated = their sum
        once = vgpud_top(node, "--once")
        assert (once.returncode, once.stderr) == (0, ""), once.stderr
        lines = once.stdout.splitlines()
        assert all(len(line) <= 120 for line in lines), lines
        block = gpu_blocks(lines)[index]
        gpu = next(g for g in json.loads(vgpud_top(node, "--json").stdout)["gpus"] if g["index"] == index)
        assert gpu["memory_allocated_bytes"] == sum(v["memory_limit_bytes"] for v in gpu["vgpus"])
        assert gpu["memory_allocated_bytes"] >= sum(LIMITS.values())
        assert f" {size(gpu['memory_allocated_bytes'])} " in block[0], block
        for pod, (_, cores, take) in PODS.items():
            (row,) = [line for line in block if f"{ns}/{pod}/main " in line]
            assert f" {size(LIMITS[pod])} " in row and f" {size(take)} " in row and f" {cores}% " in row, row

        # (b) the live view in a 120x40 terminal: both pods, then one gone, then q and exit 0
        command = (
            f"{shlex.quote(sys.executable)} -m vgpud top --socket {shlex.quote(str(node.debug_socket))} "
            "--interval 0.5; echo EXIT=$?; sleep 30"
        )
        with tmux_server() as tmux:
            pythonpath = os.environ.get("PYTHONPATH", "")
            tmux(
                *("new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40"),
                *("-e", f"PYTHONPATH={pythonpath}", f"sh -c {shlex.quote(command)}"),
            )
            rows = [f"{ns}/{pod}/main " for pod in PODS]
            screen = tmux.wait_screen(
                lambda s: all(any(r in line for line in s) for r in rows), "both pods in the live view"
            )
            title = f"vgpud top every 0.5s (q quits) reading unix:{node.debug_socket}"
            assert screen[0] == (title if len(title) <= 120 else title[:119] + "…"), screen
            w.delete_pod(node, ns, "top-b")
            screen = tmux.wait_screen(
                lambda s: not any(rows[1] in line for line in s) and any(rows[0] in line for line in s),
                "top-b gone from the live view",
            )
            tmux("send-keys", "-t", SESSION, "q")
            screen = tmux.wait_screen(lambda s: "EXIT=0" in s or any("EXIT=" in x for x in s), "top to exit")
            assert "EXIT=0" in screen, screen
    finally:
        for pod in PODS:
            remove_pod(node, ns, pod)
            w.release_claim(node, ns, pod)


def remove_pod(node: LocalNode, ns: str, pod: str) -> None:
    """Delete the pod and wait until it is gone, unless it is gone already."""
    try:
        w.get_pod(node, ns, pod)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return
        raise
    w.delete_pod(node, ns, pod)
