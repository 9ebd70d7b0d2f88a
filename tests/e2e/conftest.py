"""The local node fixture: one real node per track (NRI on: lazy, per-container directories; NRI off:
eager, per-partition directories) for the whole session; tests isolate themselves by namespace.

The chart track (CHART_TRACKS, tests/e2e/chart.py) is the NRI track with vgpud installed by
`helm install`: the DaemonSet's pod and the webhook's Deployment instead of a host process. A test that
holds for it too takes WITH_CHART.

The containerd 2.x tracks (CD2_TRACKS) are the two default tracks on containerd 2.x (built from its Go
module, docs/containerd2.md) instead of 1.7: the scenarios where the runtimes differ (injection,
registration, cleanup, Synchronize after a restart, the NRI deadline) take WITH_CD2 or
WITH_CHART_AND_CD2, or NRI_TRACKS for the NRI track alone on both runtimes. VGPUD_E2E_CONTAINERD=2 runs
every other track on containerd 2.x too (the whole suite on 2.x, by hand; `make test` leaves it unset).

Every node is laid out like a GPU node (a fake driver root that vgpud's CDI edits hand to vGPU
containers, tests/e2e/node.py). On FAKE_GPU_TRACKS, the cgroup track and the chart track vgpud itself
reads the GPUs through NVML over that root (the nvml backend); elsewhere it uses the mock backend with
the same profile. A module that needs vgpud's NVML view (its usage metrics, device health)
parametrizes `node` indirectly with FAKE_GPU_TRACKS. It is the same fixture, so pytest stops one node
before it starts the next: two nodes never run at once (they would share /run/containerd and the
kubepods cgroups)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.e2e.chart import INSTALL_HINT as CHART_INSTALL_HINT
from tests.e2e.chart import chart_available
from tests.e2e.leftovers import stop_on_signals
from tests.e2e.node import (
    CONTAINERD_1,
    CONTAINERD_2,
    CONTAINERD_VERSIONS,
    INSTALL_HINT,
    LocalNode,
    node_available,
)
from tests.support import require

TRACKS = {"nri": True, "eager": False}
#: the same tracks with vgpud on the fake NVML and the fake driver for containers
FAKE_GPU_TRACKS = {"nri-fakegpu": True, "eager-fakegpu": False}
#: the NRI track on the fake GPUs in cgroup mode (DevicePluginClientMode off): the library finds its
#: container's processes by cgroup, nothing registers (tests/e2e/test_node_cgroup_mode.py)
CGROUP_TRACKS = {"nri-cgroup": True}
#: the NRI track with vgpud installed by the Helm chart, on the nvml backend over the driver root
CHART_TRACKS = {"chart": True}
#: the default tracks on containerd 2.x
CD2_TRACKS = {"eager-cd2": False, "nri-cd2": True}
#: the default tracks and the chart track
WITH_CHART = pytest.mark.parametrize("node", [*sorted(TRACKS), *CHART_TRACKS], indirect=True)
#: the default tracks on both runtimes
WITH_CD2 = pytest.mark.parametrize("node", [*sorted(TRACKS), *sorted(CD2_TRACKS)], indirect=True)
#: the default tracks on both runtimes and the chart track
WITH_CHART_AND_CD2 = pytest.mark.parametrize(
    "node", [*sorted(TRACKS), *CHART_TRACKS, *sorted(CD2_TRACKS)], indirect=True
)
#: the NRI track on both runtimes
NRI_TRACKS = pytest.mark.parametrize("node", ["nri", "nri-cd2"], indirect=True)
#: the runtime of every track but CD2_TRACKS
DEFAULT_CONTAINERD_ENV = "VGPUD_E2E_CONTAINERD"


def default_containerd() -> str:
    """The runtime of the tracks that do not name one: containerd 1.7 unless VGPUD_E2E_CONTAINERD says."""
    value = os.environ.get(DEFAULT_CONTAINERD_ENV, CONTAINERD_1)
    if value not in CONTAINERD_VERSIONS:
        raise pytest.UsageError(
            f"{DEFAULT_CONTAINERD_ENV}={value!r}: one of {', '.join(CONTAINERD_VERSIONS)}"
        )
    return value


def pytest_configure(config: pytest.Config) -> None:
    default_containerd()  # a bad VGPUD_E2E_CONTAINERD stops the run before a node starts


@pytest.fixture(scope="session", params=sorted(TRACKS))
def node(request: pytest.FixtureRequest) -> Iterator[LocalNode]:
    """A running local node (kubelet, containerd, vgpud ...) for one track."""
    require(os.geteuid() == 0, "root (containerd, runc and the kubelet need it)", "run the tests as root")
    containerd = CONTAINERD_2 if request.param in CD2_TRACKS else default_containerd()
    what = f"the local node (containerd {containerd}, runc, kubelet, images)"
    require(node_available(containerd), what, INSTALL_HINT)
    fake_gpu = request.param in {**FAKE_GPU_TRACKS, **CGROUP_TRACKS, **CHART_TRACKS}
    chart = request.param in CHART_TRACKS
    if chart:
        require(chart_available(), "helm and the vgpud image", CHART_INSTALL_HINT)
    started = time.monotonic()
    local = LocalNode(
        nri={**TRACKS, **FAKE_GPU_TRACKS, **CHART_TRACKS, **CD2_TRACKS, **CGROUP_TRACKS}[request.param],
        containerd=containerd,
        client_mode=request.param not in CGROUP_TRACKS,
        fake_gpu=fake_gpu,
        chart=chart,
        keep=bool(os.environ.get("VGPUD_KEEP_NODE")),
    )
    with stop_on_signals():  # a SIGTERM'd or SIGHUP'd test run still tears its node down
        local.start()
        took = time.monotonic() - started
        track = f"{request.param} track, containerd {containerd}"
        print(f"\nlocal node ({track}) ready in {took:.1f} s: {local.workdir}")
        try:
            yield local
        finally:
            local.stop()
