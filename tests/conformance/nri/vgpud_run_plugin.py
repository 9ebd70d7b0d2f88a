"""`vgpud run` as the harness's plugin process: the whole daemon, not the plugin under test.

    vgpud_run_plugin.py [vgpud run flags...]   (the harness appends its own, README.md "contract")

The harness's flags become `vgpud run` flags: `--socket DIR/nri.sock` -> `--nri-root DIR`,
`--manager-root R` -> `--host-manager-dir R`, `--idx` -> `--nri-plugin-idx`. The others describe the
plugin under test's stand-ins (prepared claims, delays, sync reports) and are dropped: the daemon learns
its prepared claims from its checkpoint, through DRA. The daemon replaces this process (exec), so the
harness's SIGTERM reaches it directly.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main() -> None:
    harness = argparse.ArgumentParser(add_help=False)
    harness.add_argument("--socket", required=True, type=Path)
    harness.add_argument("--manager-root", required=True)
    harness.add_argument("--idx", default="00")
    for dropped in ("--backoff", "--sync-report", "--name"):
        harness.add_argument(dropped)
    for dropped in ("--prepared-claim", "--delay-container"):
        harness.add_argument(dropped, action="append")
    known, daemon_flags = harness.parse_known_args()
    if known.socket.name != "nri.sock":
        sys.exit(f"vgpud_run_plugin: the runtime's socket must be named nri.sock, got {known.socket}")
    argv = [
        sys.executable,
        "-m",
        "vgpud",
        "run",
        *daemon_flags,
        "--nri-root",
        str(known.socket.parent),
        "--host-manager-dir",
        known.manager_root,
        "--nri-plugin-idx",
        known.idx,
    ]
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
