"""`vgpud run` with NRISupport: lazy mode when the runtime's NRI socket answers at start, the NRI plugin
registered and synchronized before health says SERVING, eager mode (a fallback) when it does not."""

from __future__ import annotations

import signal
from pathlib import Path

import trio

from tests.kubeapi import ApiServer, free_port
from tests.unit.nri.fakeruntime import RuntimeConnection, fake_runtime
from tests.vgpudproc import SERVING, Vgpud, ensure_node

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

    async def handshake_each(plugins: trio.MemoryReceiveChannel[RuntimeConnection]) -> None:
        """vgpud's start-up probe connects and hangs up; the plugin's session registers."""
        async with trio.open_nursery() as nursery:
            async for connection in plugins:
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
            assert len(registered) == 1, vgpud.output()
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


async def test_without_a_runtime_socket_nri_support_falls_back_to_eager(
    short_tmp: Path, kube_apiserver: ApiServer
) -> None:
    ensure_node(kube_apiserver, NODE)
    vgpud = Vgpud(short_tmp, node=NODE, port=free_port(), kubeconfig=kube_apiserver.kubeconfig, extra=NRI)
    try:
        with trio.fail_after(30):
            await _wait_serving(vgpud)
        assert vgpud.stop(signal.SIGTERM) == 0
    finally:
        vgpud.kill()
    log = vgpud.output()
    assert "does not answer" in log and "eager mode" in log
    assert "nri-plugin" not in log
