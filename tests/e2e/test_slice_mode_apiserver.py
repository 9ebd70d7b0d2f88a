"""The NRI-mode attribute in the ResourceSlice against a real kube-apiserver: a node published in eager
mode and restarted in NRI mode has every device say `nriMode: true` (the server keeps the bool as
sent), with the next pool generation; restarted in eager mode again, false."""

from __future__ import annotations

import uuid
from typing import Any

import trio

from tests.kubeapi import ApiServer
from tests.vgpudproc import ensure_node, node_slices
from vgpud.dra.slices import SliceKeeper
from vgpud.gpu import open_inventory
from vgpud.gpu.mock import PROFILES_DIR
from vgpud.kube.client import KubeClient
from vgpud.relaxations import NRI_MODE_ATTRIBUTE

GPUS = open_inventory("mock", profile=PROFILES_DIR / "a100-40gb-x2.yaml").gpus()


async def publish(api: ApiServer, node: str, driver: str, *, nri_mode: bool) -> dict[str, Any]:
    """One keeper session (a daemon start in that mode) with the real client, until it has published;
    the slice as the server then holds it."""
    client = KubeClient.from_config(api.kubeconfig)
    keeper = SliceKeeper(
        client,
        driver=driver,
        node_name=node,
        gpus=GPUS,
        cores_ratio=100,
        memory_ratio=100,
        nri_mode=nri_mode,
        sysfs=None,
    )
    try:
        async with trio.open_nursery() as nursery:

            async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                await keeper.run(task_status.started)

            await nursery.start(serve)  # ready() is called once the server holds the slice
            nursery.cancel_scope.cancel()
    finally:
        client.close()
    (slice_,) = await trio.to_thread.run_sync(node_slices, api, node, driver)
    return slice_


def modes(slice_: dict[str, Any]) -> dict[str, Any]:
    return {d["name"]: d["attributes"][NRI_MODE_ATTRIBUTE] for d in slice_["spec"]["devices"]}


async def test_a_restart_in_the_other_mode_updates_every_device(kube_apiserver: ApiServer) -> None:
    api = kube_apiserver
    tag = uuid.uuid4().hex[:8]
    node, driver = f"mode-{tag}", f"{tag}.vgpu.test"
    await trio.to_thread.run_sync(ensure_node, api, node)

    eager = await publish(api, node, driver, nri_mode=False)
    assert modes(eager) == {"vgpu-0": {"bool": False}, "vgpu-1": {"bool": False}}
    nri = await publish(api, node, driver, nri_mode=True)
    assert modes(nri) == {"vgpu-0": {"bool": True}, "vgpu-1": {"bool": True}}
    assert nri["spec"]["pool"]["generation"] == eager["spec"]["pool"]["generation"] + 1
    again = await publish(api, node, driver, nri_mode=False)
    assert modes(again) == {"vgpu-0": {"bool": False}, "vgpu-1": {"bool": False}}
    assert again["spec"]["pool"]["generation"] == nri["spec"]["pool"]["generation"] + 1
    same = await publish(api, node, driver, nri_mode=False)
    assert same["spec"]["pool"]["generation"] == again["spec"]["pool"]["generation"], "nothing changed"
