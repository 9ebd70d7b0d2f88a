"""`vgpud run`: discover GPUs, then run every component under one supervisor until SIGTERM.

GPU discovery happens before Trio starts: a node whose NVML is broken should fail its pod loudly
(exit 1, the kubelet restarts it) rather than publish nothing. Everything else runs as supervised
components inside one `trio_asyncio.open_loop()`, which grpclib needs.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from functools import partial

import trio
import trio_asyncio

from vgpud import __version__
from vgpud.config import Settings
from vgpud.gpu import GpuInfo, GpuInventoryError, open_inventory
from vgpud.grpcserve import serve
from vgpud.health import HealthService
from vgpud.observe.recorder import Recorder
from vgpud.supervisor import HealthAfter, Ready, Restart, Supervisor

log = logging.getLogger("vgpud")

EXIT_OK, EXIT_FAILURE = 0, 1


@dataclass
class Node:
    """What the components of one `vgpud run` share."""

    settings: Settings
    gpus: list[GpuInfo]
    recorder: Recorder
    supervisor: Supervisor


def run_daemon(settings: Settings) -> int:
    log.info(
        "vgpud %s starting on node %s (driver %s, gates %s)",
        __version__,
        settings.node_name,
        settings.driver_name,
        settings.feature_gates,
    )
    source = settings.gpu_source
    try:
        inventory = open_inventory(
            source.backend,
            profile=source.profile,
            nvml_library=str(source.nvml_library) if source.nvml_library else None,
        )
        gpus = inventory.gpus()
    except GpuInventoryError as err:
        log.error("GPU discovery failed: %s", err)
        return EXIT_FAILURE
    for gpu in gpus:
        log.info(
            "GPU %d: %s %s, %d MiB, minor %d",
            gpu.index,
            gpu.uuid,
            gpu.product_name,
            gpu.memory_total // 2**20,
            gpu.minor,
        )
    if not gpus:
        log.warning("no GPUs found (%s backend); nothing will be published", source.backend)
    trio.run(_main, settings, gpus)
    log.info("vgpud stopped")
    return EXIT_OK


async def _main(settings: Settings, gpus: list[GpuInfo]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio_asyncio.open_loop():
            async with Supervisor(shutdown_timeout=settings.shutdown_timeout) as supervisor:
                node = Node(settings, gpus, Recorder(), supervisor)
                _start_components(node)
                async for signum in signals:
                    log.info("%s received: stopping every component", signal.Signals(signum).name)
                    supervisor.cancel()
                    break
            node.recorder.close()


def _start_components(node: Node) -> None:
    """Add each component to the supervisor; later parts of vgpud add theirs here."""
    settings = node.settings
    restart = Restart()
    health_after = HealthAfter()
    if settings.healthcheck_port >= 0:
        node.supervisor.supervise(
            "health",
            partial(_serve_health, node),
            restart,
            health_after,
        )


async def _serve_health(node: Node, ready: Ready) -> None:
    service = HealthService(node.supervisor.health)
    await serve(
        [service],
        host=node.settings.healthcheck_address,
        port=node.settings.healthcheck_port,
        ready=lambda _bound: ready(),
    )
