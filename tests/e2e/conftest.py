"""The local node fixture: one real node per track (NRI on: lazy, per-container directories; NRI off:
eager, per-partition directories) for the whole session; tests isolate themselves by namespace."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.e2e.leftovers import stop_on_signals
from tests.e2e.node import INSTALL_HINT, LocalNode, node_available
from tests.support import require

TRACKS = {"nri": True, "eager": False}


@pytest.fixture(scope="session", params=sorted(TRACKS))
def node(request: pytest.FixtureRequest) -> Iterator[LocalNode]:
    """A running local node (kubelet, containerd, vgpud ...) for one track."""
    require(os.geteuid() == 0, "root (containerd, runc and the kubelet need it)", "run the tests as root")
    require(node_available(), "the local node (containerd, runc, kubelet, images)", INSTALL_HINT)
    started = time.monotonic()
    local = LocalNode(nri=TRACKS[request.param], keep=bool(os.environ.get("VGPUD_KEEP_NODE")))
    with stop_on_signals():  # a SIGTERM'd or SIGHUP'd test run still tears its node down
        local.start()
        took = time.monotonic() - started
        print(f"\nlocal node ({request.param} track) ready in {took:.1f} s: {local.workdir}")
        try:
            yield local
        finally:
            local.stop()
