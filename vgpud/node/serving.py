"""The components the kubelet and the container runtime talk to: the DRA and registration sockets
(with the kubelet's device health stream), the NRI plugin's session, and the gRPC health service.

Each function here is, or returns, a component's run (`vgpud.supervisor`'s contract); the one whose
setting is off returns None.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import trio

from vgpud.dra.service import DeviceHealthService, node_services, probes
from vgpud.dra.slicebuild import device_names
from vgpud.gpu.exclusion import shared_gpus
from vgpud.grpcserve import serve
from vgpud.health import HealthService
from vgpud.node.parts import Node
from vgpud.nri.conn import Identity, run_session
from vgpud.ready import Ready
from vgpud.supervisor import ComponentRun


async def serve_dra(node: Node, ready: Ready) -> None:
    """The DRA socket first, then the registration socket: the kubelet dials the former once it
    finds the latter."""
    settings = node.settings
    async with trio.open_nursery() as nursery:
        await nursery.start(
            _serve_socket, node_services(node.driver, health_stream(node)), settings.dra_socket
        )
        await nursery.start(_serve_socket, [node.registration], settings.registration_socket)
        ready()


def health_stream(node: Node) -> DeviceHealthService:
    """The kubelet's device health stream: the board's devices in the slice's pool (the GPUs vgpud
    shares), or UNIMPLEMENTED."""
    if node.watched_health is None:
        return DeviceHealthService()
    return DeviceHealthService(
        node.watched_health,
        pool=node.settings.node_name,
        devices=device_names(shared_gpus(node.startup.gpus)),
    )


async def _serve_socket(
    handlers: list[object], path: Path, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    await serve(handlers, path=path, ready=lambda _bound: task_status.started())


def nri_session(node: Node) -> ComponentRun | None:
    """The NRI plugin's session with the runtime, over the node's dialer; None in eager mode."""
    if node.nri is None or node.nri_dialer is None:
        return None
    identity = Identity(node.settings.driver_name, node.settings.nri_plugin_idx)
    return partial(run_session, node.nri_dialer, node.nri, identity, link=node.nri_link)


def health_server(node: Node) -> ComponentRun | None:
    """The gRPC health service on --healthcheck-port (the pod's probes); None when it is negative."""
    if node.settings.healthcheck_port < 0:
        return None
    return partial(_serve_health, node)


async def _serve_health(node: Node, ready: Ready) -> None:
    settings = node.settings
    service = HealthService(node.health, probes(settings.registration_socket, settings.dra_socket))
    await serve(
        [service],
        host=settings.healthcheck_address,
        port=settings.healthcheck_port,
        ready=lambda _bound: ready(),
    )
