"""The local node fixture: one real node per track (NRI on: lazy, per-container directories; NRI off:
eager, per-partition directories) for the whole session; tests isolate themselves by namespace.

The chart track (CHART_TRACKS, tests/e2e/chart.py) is the NRI track with vgpud installed by
`helm install`: the DaemonSet's pod and the webhook's Deployment instead of a host process. A test that
holds for it too takes WITH_CHART.

A module that needs vgpud on the simulated GPUs (tests/e2e/fakegpu.py) parametrizes `node` indirectly
with FAKE_GPU_TRACKS. It is the same fixture, so pytest stops one node before it starts the next: two
nodes never run at once (they would share /run/containerd and the kubepods cgroups)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.e2e.chart import INSTALL_HINT as CHART_INSTALL_HINT
from tests.e2e.chart import chart_available
from tests.e2e.leftovers import stop_on_signals
from tests.e2e.node import INSTALL_HINT, LocalNode, fake_gpu_available, node_available
from tests.support import require

TRACKS = {"nri": True, "eager": False}
#: the same tracks with vgpud on the fake NVML and the fake driver for containers
FAKE_GPU_TRACKS = {"nri-fakegpu": True, "eager-fakegpu": False}
#: the NRI track with vgpud installed by the Helm chart
CHART_TRACKS = {"chart": True}
#: the default tracks and the chart track
WITH_CHART = pytest.mark.parametrize("node", [*sorted(TRACKS), *CHART_TRACKS], indirect=True)


@pytest.fixture(scope="session", params=sorted(TRACKS))
def node(request: pytest.FixtureRequest) -> Iterator[LocalNode]:
    """A running local node (kubelet, containerd, vgpud ...) for one track."""
    require(os.geteuid() == 0, "root (containerd, runc and the kubelet need it)", "run the tests as root")
    require(node_available(), "the local node (containerd, runc, kubelet, images)", INSTALL_HINT)
    fake_gpu = request.param in FAKE_GPU_TRACKS
    if fake_gpu:
        require(fake_gpu_available(), "the fake GPU driver and the dynamic-libc image", INSTALL_HINT)
    chart = request.param in CHART_TRACKS
    if chart:
        require(chart_available(), "helm and the vgpud image", CHART_INSTALL_HINT)
    started = time.monotonic()
    local = LocalNode(
        nri={**TRACKS, **FAKE_GPU_TRACKS, **CHART_TRACKS}[request.param],
        fake_gpu=fake_gpu,
        chart=chart,
        keep=bool(os.environ.get("VGPUD_KEEP_NODE")),
    )
    with stop_on_signals():  # a SIGTERM'd or SIGHUP'd test run still tears its node down
        local.start()
        took = time.monotonic() - started
        print(f"\nlocal node ({request.param} track) ready in {took:.1f} s: {local.workdir}")
        try:
            yield local
        finally:
            local.stop()
