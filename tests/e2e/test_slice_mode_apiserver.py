"""The NRI-mode attribute in the ResourceSlice against a real kube-apiserver: a node published in eager
mode and restarted in NRI mode has every device say `nriMode: true` (the server keeps the bool as
sent), with the next pool generation; restarted in eager mode again, false. And the daemon publishes
the mode it decided: NRISupport on with no NRI socket falls back to eager (false), and says why in an
Event on the node; with a socket that answers, NRI mode (true)."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from typing import Any

import trio

from tests.kubeapi import ApiServer, described_events, free_port
from tests.vgpudproc import Vgpud, ensure_node, node_slices, run_keeper
from vgpud.gpu import open_inventory
from vgpud.gpu.mock import PROFILES_DIR
from vgpud.relaxations import NRI_MODE_ATTRIBUTE

GPUS = open_inventory("mock", profile=PROFILES_DIR / "a100-40gb-x2.yaml").gpus()


async def publish(api: ApiServer, node: str, driver: str, *, nri_mode: bool) -> dict[str, Any]:
    """One keeper session (a daemon start in that mode) with the real client, until it has published;
    the slice as the server then holds it."""
    await run_keeper(api, node, driver, trio.lowlevel.checkpoint, gpus=GPUS, nri_mode=nri_mode)
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


def daemon_modes(
    api: ApiServer, root: Path, node: str, *, after: str = "", event: str = ""
) -> dict[str, Any]:
    """Run `vgpud run` (NRISupport on, mock GPUs) until its slice is published with a pool generation
    above `after`'s (and, with `event`, until the node has vgpud's Event of that reason); the devices'
    attribute then, and the node's vgpud Events of `event`. The daemon need not become SERVING:
    nothing here answers its NRI plugin."""
    d = Vgpud(
        root,
        node=node,
        port=free_port(),
        kubeconfig=api.kubeconfig,
        extra=["--feature-gates", "NRISupport=true"],
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert d.proc.poll() is None, d.output()
            slices = node_slices(api, node)
            events = described_events(api, "Node", node, node, reason=event) if event else []
            if slices and slices[0]["spec"]["pool"]["generation"] > int(after or 0) and (events or not event):
                return {
                    "generation": slices[0]["spec"]["pool"]["generation"],
                    "modes": modes(slices[0]),
                    "log": d.output(),
                    "events": events,
                }
            time.sleep(0.1)
        raise AssertionError(f"no ResourceSlice published:\n{d.output()}")
    finally:
        d.kill()


def test_the_daemon_publishes_the_mode_it_decided(kube_apiserver: ApiServer, short_tmp: Path) -> None:
    api, node = kube_apiserver, f"decided-{uuid.uuid4().hex[:8]}"
    ensure_node(api, node)
    fallback = daemon_modes(api, short_tmp, node, event="NRIFallbackToEager")
    assert "NRISupport is on but the NRI socket" in fallback["log"], "the premise: it fell back"
    assert fallback["modes"] == {"vgpu-0": {"bool": False}, "vgpu-1": {"bool": False}}
    [told] = fallback["events"]  # `kubectl describe node` shows why
    assert (told["type"], told["source"]) == ("Warning", {"component": "vgpud", "host": node})
    assert told["message"].startswith("NRISupport is on but the NRI socket "), told
    assert "eager mode (no per-container injection)" in told["message"], told
    nri_socket = short_tmp / "var/run/nri/nri.sock"
    nri_socket.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(nri_socket))  # the probe's connect succeeds from the backlog: NRI mode
        listener.listen(8)
        lazy = daemon_modes(api, short_tmp, node, after=str(fallback["generation"]))
    assert "lazy mode" in lazy["log"], "the premise: it chose NRI mode"
    assert lazy["modes"] == {"vgpu-0": {"bool": True}, "vgpu-1": {"bool": True}}
