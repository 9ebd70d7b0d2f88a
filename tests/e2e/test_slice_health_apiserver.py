"""Device health in the ResourceSlice against a real kube-apiserver (1.36): SliceKeeper with the real
client taints a sick GPU's device (the server keeps the taint, NoSchedule, timeAdded as sent) and
removes the taint on recovery; on a server with DRADeviceTaints off, which drops the field, it notices
and leaves the sick device out of the slice instead, and puts it back on recovery."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.kubeapi import ApiServer, api_request, start_apiserver
from tests.vgpudproc import node_slices, run_keeper
from vgpud.gpu import open_inventory
from vgpud.gpu.health import DeviceHealth, HealthBoard
from vgpud.gpu.mock import PROFILES_DIR

GPUS = open_inventory("mock", profile=PROFILES_DIR / "a100-40gb-x2.yaml").gpus()
GPU0, GPU1 = GPUS[0].uuid, GPUS[1].uuid
SINCE = 1796119200.0  # 2026-12-01T10:00:00Z
XID79 = DeviceHealth(GPU0, healthy=False, reason="XID 79: GPU has fallen off the bus", since=SINCE, xid=79)
WAIT_S = 30


@pytest.fixture(scope="module")
def taintless_apiserver() -> Iterator[ApiServer]:
    """A second server, with DRADeviceTaints off (a cluster that does not serve device taints)."""
    workdir = Path(tempfile.mkdtemp(prefix="vgt", dir="/tmp"))
    server = start_apiserver(workdir, feature_gates=["DRADeviceTaints=false"])
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def unique(what: str) -> tuple[str, str]:
    """A node name and a driver name no other test uses (tests share one API server)."""
    tag = uuid.uuid4().hex[:8]
    return f"{what}-{tag}", f"{tag}.vgpu.test"


def devices(api: ApiServer, node: str, driver: str) -> dict[str, list[dict[str, Any]]]:
    """Device name -> its taints, as the server holds the slice ({} while there is none)."""
    slices = node_slices(api, node, driver)
    assert len(slices) <= 1
    return {d["name"]: d.get("taints", []) for s in slices for d in s["spec"]["devices"]}


async def until(check: Callable[[], bool]) -> None:
    """Ask the server (in a thread) until `check` holds; fail after WAIT_S."""
    with trio.fail_after(WAIT_S):
        while True:
            if await trio.to_thread.run_sync(check):
                return
            await trio.sleep(0.1)


async def test_a_sick_device_is_tainted_and_the_taint_goes_on_recovery(kube_apiserver: ApiServer) -> None:
    api = kube_apiserver
    node, driver = unique("taint")
    board = HealthBoard([GPU0, GPU1])
    now = partial(devices, api, node, driver)

    async def body() -> None:
        assert await trio.to_thread.run_sync(now) == {"vgpu-0": [], "vgpu-1": []}
        board.update(XID79)
        await until(lambda: now()["vgpu-0"] != [])
        assert await trio.to_thread.run_sync(now) == {
            "vgpu-0": [
                {
                    "key": f"{driver}/unhealthy",
                    "value": "xid-79",
                    "effect": "NoSchedule",
                    "timeAdded": "2026-12-01T10:00:00Z",
                }
            ],
            "vgpu-1": [],
        }
        board.update(DeviceHealth(GPU0, healthy=True, since=SINCE + 60))
        await until(lambda: now() == {"vgpu-0": [], "vgpu-1": []})

    keeper = await run_keeper(api, node, driver, body, gpus=GPUS, board=board)
    assert not keeper.leaves_out_sick
    assert keeper.repairs == 0, "our own writes are not taken for someone else's"
    (slice_,) = await trio.to_thread.run_sync(node_slices, api, node, driver)
    assert slice_["spec"]["pool"]["generation"] == 3, "published, tainted, restored"


async def test_a_server_without_device_taints_gets_the_sick_device_left_out(
    taintless_apiserver: ApiServer,
) -> None:
    api = taintless_apiserver
    node, driver = unique("leave")
    # the premise: this server drops the field (else the test proves nothing)
    probe = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"probe-{node}"},
        "spec": {
            "driver": driver,
            "nodeName": "nowhere",
            "pool": {"name": "nowhere", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "d", "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}],
        },
    }
    created = api_request(api, "POST", "/apis/resource.k8s.io/v1/resourceslices", probe)
    assert "taints" not in created["spec"]["devices"][0]

    board = HealthBoard([GPU0, GPU1])
    now = partial(devices, api, node, driver)

    async def body() -> None:
        board.update(XID79)
        await until(lambda: list(now()) == ["vgpu-1"])
        board.update(DeviceHealth(GPU0, healthy=True, since=SINCE + 60))
        await until(lambda: now() == {"vgpu-0": [], "vgpu-1": []})

    keeper = await run_keeper(api, node, driver, body, gpus=GPUS, board=board)
    assert keeper.leaves_out_sick
    assert keeper.repairs == 0
