"""The readers of the node's state, and the servers that show them.

This is the one module of the composition root that knows `vgpud.observe` (tests/unit/test_layering):
the components never import it; each reader is handed the parts it reads. None of these components
counts for health: a taken metrics port must never make the node NOT_SERVING or restart the daemon.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from vgpud.config import Settings
from vgpud.node.build import registry_enabled
from vgpud.node.parts import Node
from vgpud.observe.app import ObserveApp
from vgpud.observe.drift import DriftChecker
from vgpud.observe.hub import StreamHub
from vgpud.observe.metrics import NodeMetrics
from vgpud.observe.serve import run_debug_server, run_metrics_server
from vgpud.observe.state import DebugState, NodeIdentity, StreamStats, WatchedDevices
from vgpud.observe.usage import UsageReader
from vgpud.registry.identity import container_pids, default_cgroup_root
from vgpud.supervisor import ComponentRun


@dataclass
class Observability:
    """The readers of the node's state: metrics, the debug endpoint with its stream, the drift check,
    the reader of each container's library files."""

    metrics: NodeMetrics
    hub: StreamHub
    state: DebugState
    drift: DriftChecker | None
    usage: UsageReader | None


def build_observability(node: Node) -> Observability:
    """Every reader of `node`; the drift check and the usage reader only when their interval is set."""
    settings, startup = node.settings, node.startup
    identity = NodeIdentity(settings.node_name, startup.mode.value, startup.nri_fallback)
    store = node.nri.containers if node.nri is not None else None
    devices = WatchedDevices(node.device_health, node.health_watch) if node.health_watch is not None else None
    stream = StreamStats()
    drift = None
    if settings.drift_interval > 0:
        drift = DriftChecker(Path(startup.layout.claims_dir), node.driver, store, settings.drift_interval)
    usage = None
    if settings.usage_interval > 0:
        memory = startup.inventory.process_memory if startup.inventory is not None else None
        # cgroup mode: no pids.config; a container's PIDs are those of its cgroup
        pids = (
            None
            if registry_enabled(settings)
            else partial(container_pids, default_cgroup_root(), settings.systemd_cgroups)
        )
        usage = UsageReader(
            startup.layout,
            node.driver.index,
            store,
            settings.usage_interval,
            process_memory=memory,
            container_pids=pids,
        )
    metrics = NodeMetrics(
        identity,
        recorder=node.recorder,
        health=node.health,
        driver=node.driver,
        stream=stream,
        nri=node.nri,
        devices=devices,
        hotplug=node.hotplug,
        drift=drift,
        usage=usage,
        gpus=startup.gpus,
        events=node.events,
        preset_components=preset_components(node),
    )
    state = DebugState(
        identity,
        recorder=node.recorder,
        health=node.health,
        driver=node.driver,
        layout=startup.layout,
        stream=stream,
        nri=node.nri,
        registry=node.registry,
        devices=devices,
        hotplug=node.hotplug,
        drift=drift,
        usage=usage,
        gpus=startup.gpus,
    )
    return Observability(metrics, StreamHub(node.recorder, stream), state, drift, usage)


def preset_components(node: Node) -> list[str]:
    """The components whose calls this node makes (vgpud.metrics_names.NODE_CALLS)."""
    components = ["dra"]
    if node.nri is not None:
        components.append("nri")
    if registry_enabled(node.settings):
        components.append("registry")
    return components


def metrics_server(settings: Settings, observe: Observability) -> ComponentRun | None:
    """The `metrics` component's run: `/metrics` on --metrics-address; None without one."""
    if settings.metrics_address is None:
        return None
    return partial(run_metrics_server, observe.metrics, settings.metrics_address)


def debug_server(settings: Settings, observe: Observability) -> ComponentRun | None:
    """The `debug-http` component's run: every route on the debug socket and/or address; None
    without either."""
    if settings.debug_socket_path is None and settings.debug_address is None:
        return None
    app = ObserveApp(observe.metrics, state=observe.state, hub=observe.hub)
    return partial(
        run_debug_server,
        app,
        observe.hub,
        unix_path=settings.debug_socket_path,
        address=settings.debug_address,
    )
