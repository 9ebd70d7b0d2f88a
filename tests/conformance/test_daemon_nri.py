"""`vgpud run` with NRISupport: lazy mode when the runtime's NRI socket answers at start, the NRI plugin
registered and synchronized before health says SERVING, eager mode (a fallback) when it does not.

The start-up probe's connection is the plugin's first session: a connection that hangs up without
registering is what containerd logs as "failed to start external plugin" (issue 12 item 5)."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

import trio

from tests.kubeapi import ApiServer, free_port
from tests.unit.nri.fakeruntime import RuntimeConnection, fake_runtime
from tests.vgpudproc import SERVING, Vgpud, ensure_node
from vgpud.observe.client import Endpoint, get_json

NODE = "nri-node"
NRI = ["--feature-gates", "NRISupport=true"]


async def _wait_serving(vgpud: Vgpud) -> None:
    await trio.to_thread.run_sync(vgpud.wait_serving, abandon_on_cancel=True)


async def test_lazy_mode_registers_with_the_runtime_before_serving(
    short_tmp: Path, kube_apiserver: ApiServer
) -> None:
    ensure_node(kube_apiserver, NODE)
    socket_path = short_tmp / "var/run/nri/nri.sock"
    socket_path.parent.mkdir(parents=True)
    registered: list[RuntimeConnection] = []
    accepted: list[RuntimeConnection] = []

    async def handshake_each(plugins: trio.MemoryReceiveChannel[RuntimeConnection]) -> None:
        """Every connection vgpud makes must register (the probe's included)."""
        async with trio.open_nursery() as nursery:
            async for connection in plugins:
                accepted.append(connection)
                nursery.start_soon(handshake, connection)

    async def handshake(connection: RuntimeConnection) -> None:
        await connection.handshake()
        registered.append(connection)

    async with fake_runtime(socket_path) as plugins, trio.open_nursery() as nursery:
        nursery.start_soon(handshake_each, plugins)
        vgpud = Vgpud(short_tmp, node=NODE, port=free_port(), kubeconfig=kube_apiserver.kubeconfig, extra=NRI)
        try:
            with trio.fail_after(30):
                await _wait_serving(vgpud)
            assert len(registered) == len(accepted) == 1, vgpud.output()
            identity = registered[0].registered
            assert identity is not None
            assert (identity.plugin_name, identity.plugin_idx) == ("manager.nvidia.com", "00")
            assert vgpud.health() == SERVING
            assert vgpud.stop(signal.SIGTERM) == 0
        finally:
            vgpud.kill()
        nursery.cancel_scope.cancel()
    log = vgpud.output()
    assert "lazy mode (per-container directories)" in log
    assert "NRI: registered as 00-manager.nvidia.com" in log


async def test_without_a_runtime_socket_nri_support_falls_back_to_eager_visibly(
    short_tmp: Path, kube_apiserver: ApiServer
) -> None:
    """The fallback shows in the log, the metrics (with its reason), the debug state and the health
    detail, without making the node unhealthy (issue 12 item 2)."""
    ensure_node(kube_apiserver, NODE)
    metrics_port = free_port()
    extra = [*NRI, "--metrics-address", f"127.0.0.1:{metrics_port}"]
    vgpud = Vgpud(short_tmp, node=NODE, port=free_port(), kubeconfig=kube_apiserver.kubeconfig, extra=extra)
    try:
        with trio.fail_after(30):
            await _wait_serving(vgpud)
        debug = Endpoint(unix_path=short_tmp / "var/lib/kubelet/plugins/manager.nvidia.com/debug.sock")
        state = await trio.to_thread.run_sync(get_json, debug, "/debug/state")
        metrics = await trio.to_thread.run_sync(_get, f"http://127.0.0.1:{metrics_port}/metrics")
        assert vgpud.stop(signal.SIGTERM) == 0
    finally:
        vgpud.kill()
    log = vgpud.output()
    reason = f"the NRI socket {short_tmp}/var/run/nri/nri.sock does not answer: No such file or directory"
    assert f"NRISupport is on but {reason}: eager mode" in log
    assert "NRI: registered" not in log
    assert state["mode"] == "eager" and state["nri_fallback"] == {"reason": reason}
    assert state["healthy"] is True  # visible, but not a failure of the node
    component = state["components"]["nri-plugin"]
    assert component["state"] == "stopped" and component["reason"] == f"eager-mode fallback: {reason}"
    assert component["counts_for_health"] is False
    assert f'vgpud_nri_eager_fallback_info{{reason="{reason}"}} 1.0' in metrics


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.read().decode()
