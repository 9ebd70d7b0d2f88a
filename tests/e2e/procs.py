"""Starting and stopping the local node's daemons: by PID, each in a session of its own so a Ctrl-C in
the terminal reaches the test run and not them."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

STOP_TIMEOUT_S = 15.0


def spawn(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal reaches us, not the node's daemons
        )


def stop_proc(
    proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S
) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
