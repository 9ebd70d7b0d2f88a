"""Other NRI plugins beside vgpud on the local node (tests/e2e/test_node_coexistence.py): external plugins
on the node's NRI socket, built and cached by tests/conformance/nri/gobuild.py, started and stopped by PID.

- UlimitAdjuster: containerd/nri's own sample plugin `ulimit-adjuster` (nri v0.4.0), index 10. It sets
  the rlimits that the pod annotation `ulimits.nri.containerd.io/container.<name>` lists on that
  container. It keeps no record and cannot be told a socket path, so it gets a connection made for it
  (tests/e2e/nri_connect.py); its stub exits when the runtime closes that connection, so a process
  still running is still on its first connection.
- SidePlugin: ours (tests/conformance/nri/sideplugin, NRI's Go stub), index 20: sets the env that
  ANNOTATION_ENV lists on every container of the pod and reports each CreateContainer as the runtime
  sent it (the env keys, mount destinations and rlimits that lower-index plugins already added) with the
  wall-clock time it was called.

`start()` of either waits until the runtime lists the process in its plugin invocation order, which
containerd (1.7 and 2.x) logs at info level whenever a plugin has registered and been synchronized.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.e2e.node import LocalNode
from tests.kubeapi import log_tail

CONNECT = Path(__file__).resolve().parent / "nri_connect.py"
#: the sample's annotation: a YAML list of {type, soft, hard} for the named container
ULIMIT_ANNOTATION_PREFIX = "ulimits.nri.containerd.io/container."
ANNOTATION_ENV = "side-adjuster.vgpud.test/env"
#: registered and synchronized within this
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0

_ORDER_HEADER = 'msg="plugin invocation order"'
_ORDER_ENTRY = re.compile(r'msg="  #\d+: \\"([^"\\]+)\\" \((?:external|builtin):[^)\[]*(?:\[(\d+)\])?\)"')


def invocation_order(node: LocalNode) -> list[tuple[str, int | None]]:
    """The runtime's last logged plugin invocation order: (indexed name, PID of an external plugin)."""
    lines = node.log("containerd").read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if _ORDER_HEADER in line]
    order: list[tuple[str, int | None]] = []
    for line in lines[starts[-1] + 1 :] if starts else []:
        match = _ORDER_ENTRY.search(line)
        if match is None:
            break
        order.append((match[1], int(match[2]) if match[2] else None))
    return order


def ulimit_annotation(container: str, limits: dict[str, tuple[int, int]]) -> dict[str, str]:
    """The annotation asking the sample for these limits (type -> (soft, hard)) on `container`."""
    body = "".join(f"- type: {typ}\n  soft: {soft}\n  hard: {hard}\n" for typ, (soft, hard) in limits.items())
    return {ULIMIT_ANNOTATION_PREFIX + container: body}


@dataclass
class PluginProcess(ABC):
    """One external plugin process on `node`'s NRI socket."""

    node: LocalNode
    binary: Path
    name: str
    idx: str
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.node.log(f"nri-plugin-{self.idx}-{self.name}")

    @property
    def full_name(self) -> str:
        """The name the runtime knows it by (in its log and its conflict errors)."""
        return f"{self.idx}-{self.name}"

    @property
    def socket(self) -> Path:
        return self.node.nri_root / "nri.sock"

    @abstractmethod
    def argv(self) -> list[str]:
        """The command line that starts it."""

    def start(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Start the process, wait until the runtime lists it; returns the seconds that took."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"{self.full_name} already runs (PID {self.proc.pid})")
        began = time.monotonic()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        listed = (self.full_name, self.proc.pid)
        while time.monotonic() - began < timeout_s:
            if listed in invocation_order(self.node):
                return time.monotonic() - began
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"the runtime did not list {listed} in its plugin invocation order in {timeout_s} s;"
            f" the plugin's log:\n{log_tail(self.log)}"
        )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL after STOP_TIMEOUT_S. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{self.full_name} ignored SIGTERM for {STOP_TIMEOUT_S} s") from None


@dataclass
class UlimitAdjuster(PluginProcess):
    """containerd/nri's sample `ulimit-adjuster`; Go's default action for SIGTERM ends it."""

    name: str = "ulimit-adjuster"
    idx: str = "10"

    def argv(self) -> list[str]:
        plugin = [str(self.binary), "-idx", self.idx, "-name", self.name, "-verbose"]
        return [sys.executable, str(CONNECT), str(self.socket), *plugin]


@dataclass
class SidePlugin(PluginProcess):
    """tests/conformance/nri/sideplugin; exits 0 on SIGTERM."""

    name: str = "side-adjuster"
    idx: str = "20"
    report: Path = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.report = self.node.workdir / f"nri-plugin-{self.idx}-{self.name}.jsonl"

    def argv(self) -> list[str]:
        flags = {"--socket": self.socket, "--idx": self.idx, "--name": self.name, "--report": self.report}
        return [str(self.binary), *(str(x) for pair in flags.items() for x in pair)]

    def created(self, pod_uid: str, container: str) -> list[dict[str, Any]]:
        """The CreateContainer calls it got for this container of this pod, oldest first."""
        try:
            lines = self.report.read_text().splitlines()
        except FileNotFoundError:
            return []
        entries = [json.loads(line) for line in lines if line.strip()]
        return [e for e in entries if e["pod_uid"] == pod_uid and e["container"] == container]


P = TypeVar("P", bound=PluginProcess)


@contextmanager
def started(plugin: P) -> Iterator[P]:
    """The plugin started, and stopped whatever happens in the block."""
    try:
        plugin.start()
        yield plugin
    finally:
        plugin.stop()
