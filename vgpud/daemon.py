"""`vgpud run`: check the node, build its parts, then run every component under one supervisor until
SIGTERM.

What can fail for good is checked before Trio starts and fails the pod loudly (`vgpud.node.checks`).
The parts are built in `vgpud.node.build`, `vgpud.node.observability` and `vgpud.node.parts`; the
sockets the kubelet and the runtime reach are served by `vgpud.node.serving`. What runs, and how, is
`components` below: each component runs inside one `trio_asyncio.open_loop()` (which grpclib needs),
restarts with backoff and turns the health service NOT_SERVING only after failing for the grace
period, and only if it counts for health.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import trio
import trio_asyncio

from vgpud import __version__
from vgpud.config import Settings
from vgpud.node.checks import Startup, check_node
from vgpud.node.names import (
    CLAIM_CACHE,
    DEBUG_HTTP,
    DEVICE_HEALTH,
    DRA_CLEANUP,
    DRA_PLUGIN,
    DRIFT,
    EVENTS,
    HEALTH,
    HOTPLUG,
    METRICS,
    NRI_PLUGIN,
    POD_CACHE,
    REGISTRY,
    RESOURCE_SLICES,
    USAGE,
)
from vgpud.node.observability import Observability, build_observability, debug_server, metrics_server
from vgpud.node.parts import Node, build_node
from vgpud.node.serving import health_server, nri_session, serve_dra
from vgpud.ready import Ready
from vgpud.supervisor import Backoff, ComponentRun, HealthAfter, Restart, Supervisor

log = logging.getLogger("vgpud")

EXIT_OK, EXIT_FAILURE = 0, 1
#: the restart of a component that lists and watches the API server: jittered, so the nodes of a
#: DaemonSet that lost the server together come back spread over half a backoff step
API_CLIENT = Restart(Backoff(jitter=0.5))


@dataclass(frozen=True)
class Component:
    """One row of the supervision table; `run` is None where the node lacks the part (no row runs)."""

    name: str
    run: ComponentRun | None
    restart: Restart
    #: its failure, after HealthAfter's grace, turns the node NOT_SERVING
    counts_for_health: bool


def components(node: Node, observe: Observability) -> tuple[Component, ...]:
    """Which components run, in the order they start. The DRA side (sockets, ResourceSlice, cleanup),
    the NRI plugin and the registry count for health; the Events' writer, the device-health watcher
    (without NVML the GPUs stay published), the caches, the hot-plug API and the readers of the node's
    state do not (a taken port never restarts vgpud)."""
    dialer = node.nri_dialer
    # a runtime that restarts is dialed as soon as it binds its socket again, whatever the backoff
    nri_wake = dialer.replaced if dialer is not None else None
    return (
        Component(EVENTS, node.events.run, Restart(), counts_for_health=False),
        Component(DRA_PLUGIN, partial(serve_dra, node), Restart(), counts_for_health=True),
        Component(RESOURCE_SLICES, node.slices.run, API_CLIENT, counts_for_health=True),
        Component(DRA_CLEANUP, node.driver.run_cleanup, Restart(), counts_for_health=True),
        Component(DEVICE_HEALTH, run_of(node.health_watch), Restart(), counts_for_health=False),
        Component(CLAIM_CACHE, run_of(node.caches.claim_watch), API_CLIENT, counts_for_health=False),
        Component(POD_CACHE, run_of(node.caches.pods), API_CLIENT, counts_for_health=False),
        Component(NRI_PLUGIN, nri_session(node), Restart(wake=nri_wake), counts_for_health=True),
        Component(REGISTRY, run_of(node.registry), Restart(), counts_for_health=True),
        Component(HOTPLUG, run_of(node.hotplug), Restart(), counts_for_health=False),
        Component(HEALTH, health_server(node), Restart(), counts_for_health=False),
        Component(METRICS, metrics_server(node.settings, observe), Restart(), counts_for_health=False),
        Component(DEBUG_HTTP, debug_server(node.settings, observe), Restart(), counts_for_health=False),
        Component(DRIFT, run_of(observe.drift), Restart(), counts_for_health=False),
        Component(USAGE, run_of(observe.usage), Restart(), counts_for_health=False),
    )


def supervise(supervisor: Supervisor, table: tuple[Component, ...]) -> None:
    """Start each present row; every component also waits HealthAfter's grace before FAILING."""
    for row in table:
        if row.run is not None:
            supervisor.supervise(
                row.name, row.run, row.restart, HealthAfter(), counts_for_health=row.counts_for_health
            )


class _Runs(Protocol):
    """A part that is a component by itself: its `run` follows the supervisor's contract."""

    async def run(self, ready: Ready) -> None: ...


def run_of(part: _Runs | None) -> ComponentRun | None:
    """The part's `run`, or None where the node has no such part."""
    return part.run if part is not None else None


def run_daemon(settings: Settings) -> int:
    """`vgpud run`: the exit status once SIGTERM has stopped every component (1: the checks failed)."""
    log.info(
        "vgpud %s starting on node %s (driver %s, gates %s)",
        __version__,
        settings.node_name,
        settings.driver_name,
        settings.feature_gates,
    )
    startup = check_node(settings)
    if startup is None:
        return EXIT_FAILURE
    trio.run(_main, startup)
    log.info("vgpud stopped")
    return EXIT_OK


async def _main(startup: Startup) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio_asyncio.open_loop():
            node = await build_node(startup)
            observe = build_observability(node)
            shutdown_timeout = startup.settings.shutdown_timeout
            async with Supervisor(shutdown_timeout=shutdown_timeout, health=node.health) as supervisor:
                supervise(supervisor, components(node, observe))
                async for signum in signals:
                    log.info("%s received: stopping every component", signal.Signals(signum).name)
                    supervisor.cancel()
                    break
            node.recorder.close()
