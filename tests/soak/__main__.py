"""`make soak`: one local node, SOAK_N seeded operations (default 100), the invariants after each.

Environment: SOAK_N, SOAK_SEED (default: a random one, printed first; the same seed replays the same
sequence), SOAK_TRACK (nri, the default, or eager). Exit 1 on a broken invariant, with the seed, the
step and the replay command.
"""

from __future__ import annotations

import os
import random
import sys
import time

from tests.e2e.conftest import TRACKS
from tests.e2e.leftovers import stop_on_signals
from tests.e2e.node import INSTALL_HINT, LocalNode, node_available
from tests.soak.runner import SoakFailure, run_soak

DEFAULT_N = 100


def _count(name: str, default: int | None) -> int | None:
    value = os.environ.get(name, "")
    if not value:
        return default
    if not value.isdigit():
        raise SystemExit(f"soak: {name}={value!r} is not a non-negative integer")
    return int(value)


def main() -> int:
    n = _count("SOAK_N", DEFAULT_N)
    assert n is not None
    seed = _count("SOAK_SEED", None)
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    track = os.environ.get("SOAK_TRACK") or "nri"
    if track not in TRACKS:
        raise SystemExit(f"soak: SOAK_TRACK={track!r}: one of {', '.join(sorted(TRACKS))}")
    if os.geteuid() != 0:
        raise SystemExit("soak: the local node needs root (containerd, runc, the kubelet)")
    if not node_available():
        raise SystemExit(f"soak: the local node is not installed: {INSTALL_HINT}")
    print(
        f"soak: seed {seed}, {n} steps, {track} track "
        f"(replay: SOAK_SEED={seed} SOAK_N={n} SOAK_TRACK={track})",
        flush=True,
    )
    started = time.monotonic()
    node = LocalNode(nri=TRACKS[track], keep=bool(os.environ.get("VGPUD_KEEP_NODE")))
    with stop_on_signals():
        try:
            node.start()
            print(f"soak: node ready in {time.monotonic() - started:.1f} s: {node.workdir}", flush=True)
            result = run_soak(node, seed, n, track=track)
        except SoakFailure as failure:
            print(failure, file=sys.stderr, flush=True)
            return 1
        finally:
            node.stop()
    print(result.report(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
