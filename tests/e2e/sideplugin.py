"""A second NRI plugin beside vgpud on the local node: tests/conformance/nri/sideplugin (Go, NRI's own
stub, built and cached by tests/conformance/nri/gobuild.py) as an external plugin on the node's NRI
socket, started and stopped by PID.

It adjusts every container of a pod that carries its annotations (ANNOTATION_NOFILE: RLIMIT_NOFILE;
ANNOTATION_ENV: environment variables) and appends one JSON line per Synchronize and CreateContainer to
its report: for CreateContainer, the wall-clock time it was called and the env keys and mount
destinations of the container as the runtime sent it (with the adjustments of lower-index plugins
already applied)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.node import LocalNode
from tests.kubeapi import log_tail

NAME = "side-adjuster"
IDX = "10"
ANNOTATION_NOFILE = "side-adjuster.vgpud.test/nofile"
ANNOTATION_ENV = "side-adjuster.vgpud.test/env"
#: the NRI socket is there and the plugin answered Synchronize within this
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0


@dataclass
class SidePlugin:
    """One side plugin process on `node`'s NRI socket; `start()` waits until the runtime synchronized it."""

    node: LocalNode
    binary: Path
    idx: str = IDX
    name: str = NAME
    proc: subprocess.Popen[bytes] | None = None
    report: Path = field(init=False)
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.report = self.node.workdir / f"sideplugin-{self.idx}.jsonl"
        self.log = self.node.log(f"sideplugin-{self.idx}")

    @property
    def full_name(self) -> str:
        """The name the runtime knows it by (in its log and its conflict errors)."""
        return f"{self.idx}-{self.name}"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Start the process and wait for its next Synchronize; returns the seconds that took."""
        if self.running():
            raise RuntimeError(f"the side plugin already runs (PID {self.proc.pid if self.proc else '?'})")
        synced = len(self.entries("Synchronize"))
        argv = [str(self.binary), "--socket", str(self.node.nri_root / "nri.sock"), "--idx", self.idx]
        argv += ["--name", self.name, "--report", str(self.report)]
        began = time.monotonic()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        while time.monotonic() - began < timeout_s:
            if len(self.entries("Synchronize")) > synced:
                return time.monotonic() - began
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the side plugin was not synchronized in {timeout_s} s:\n{log_tail(self.log)}")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM by PID (it exits 0), SIGKILL after STOP_TIMEOUT_S. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the side plugin ignored SIGTERM for {STOP_TIMEOUT_S} s") from None

    def entries(self, event: str | None = None) -> list[dict[str, Any]]:
        """The report's lines (of one event kind), oldest first."""
        try:
            lines = self.report.read_text().splitlines()
        except FileNotFoundError:
            return []
        parsed = [json.loads(line) for line in lines if line.strip()]
        return [e for e in parsed if event is None or e["event"] == event]

    def created(self, pod_uid: str, container: str) -> list[dict[str, Any]]:
        """The CreateContainer calls it got for this container of this pod."""
        return [
            e
            for e in self.entries("CreateContainer")
            if e["pod_uid"] == pod_uid and e["container"] == container
        ]


@contextmanager
def side_plugin(node: LocalNode, binary: Path) -> Iterator[SidePlugin]:
    """A started side plugin, stopped whatever happens in the block."""
    plugin = SidePlugin(node, binary)
    try:
        plugin.start()
        yield plugin
    finally:
        plugin.stop()
