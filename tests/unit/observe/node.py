"""A node's observable parts for the observe tests: a real DraDriver over the fake API (tests.draharness),
real NriHooks in lazy mode, one recorder, and the debug server on a unix socket in a temp dir."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from tests.draharness import GPUS, Harness
from tests.unit.gpu.healthshim import ScriptedNvml
from vgpud.gpu.health import HealthBoard
from vgpud.gpu.healthrules import APPLICATION_XIDS
from vgpud.gpu.healthwatch import HealthRules, HealthWatcher
from vgpud.kube.informer import claim_informer, pod_informer
from vgpud.nri.hooks import NriHooks
from vgpud.observe.app import ObserveApp
from vgpud.observe.drift import DriftChecker
from vgpud.observe.hub import StreamHub
from vgpud.observe.metrics import NodeMetrics
from vgpud.observe.serve import run_debug_server
from vgpud.observe.state import DebugState, NodeParts, StreamStats
from vgpud.observe.usage import UsageReader
from vgpud.partition.lazy import LazyAssigner
from vgpud.registry.server import RegistryServer
from vgpud.supervisor import HealthRegistry, HealthState


@dataclass
class Node:
    harness: Harness
    parts: NodeParts
    stream: StreamStats
    drift: DriftChecker
    usage: UsageReader
    metrics: NodeMetrics
    hub: StreamHub
    state: DebugState
    #: the NVML the device-health watcher (parts.health_watch, not running until a test runs it) reads
    gpu_shim: ScriptedNvml

    @property
    def nri(self) -> NriHooks:
        assert self.parts.nri is not None
        return self.parts.nri

    def app(self) -> ObserveApp:
        return ObserveApp(self.metrics, state=self.state, hub=self.hub)


def make_node(
    root: Path,
    *,
    lazy: bool = True,
    client_mode: bool = False,
    stream_buffer: int = 64,
    nri_fallback: str = "",
) -> Node:
    """Must run inside Trio (the health registry reads Trio's clock)."""
    h = Harness(root, lazy=lazy, client_mode=client_mode)
    health = HealthRegistry()
    health.register("dra-plugin")
    health.set("dra-plugin", HealthState.HEALTHY)
    health.register("metrics", counts_for_health=False)
    nri = None
    if lazy:
        assigner = LazyAssigner(h.layout, driver=h.driver.driver)
        nri = NriHooks(assigner=assigner, admission=h.driver.index, recorder=h.recorder)
    registry = None
    if client_mode:
        registry = RegistryServer(
            layout=h.layout,
            assigner=h.driver.ctx.assigner,
            nri_cache=None,
            claims=h.driver.index,
            pods=pod_informer(h.kube, "node-a"),
            claim_objects=claim_informer(h.kube),
            recorder=h.recorder,
            driver_name=h.driver.driver,
            proc_root=root / "proc",
            cgroup_root=root / "cgroup",
        )
    board = HealthBoard(gpu.uuid for gpu in GPUS)
    rules = HealthRules(frozenset(APPLICATION_XIDS), recovery_seconds=60, wait_ms=50)
    shim = ScriptedNvml(len(GPUS))
    watcher = HealthWatcher(board, GPUS, lambda: shim, rules)
    parts = NodeParts(
        node_name="node-a",
        mode="lazy" if lazy else "eager",
        nri_fallback=nri_fallback,
        layout=h.layout,
        recorder=h.recorder,
        health=health,
        driver=h.driver,
        nri=nri,
        registry=registry,
        device_health=board,
        health_watch=watcher,
    )
    stream = StreamStats()
    drift = DriftChecker(parts, interval=1.0)
    usage = UsageReader(parts, interval=1.0)
    metrics = NodeMetrics(parts, stream=stream, drift=drift, usage=usage)
    hub = StreamHub(h.recorder, stream, buffer=stream_buffer)
    state = DebugState(parts, stream=stream, drift=drift, usage=usage)
    return Node(h, parts, stream, drift, usage, metrics, hub, state, shim)


@asynccontextmanager
async def serving(
    node: Node, socket_path: Path | None, address: tuple[str, int] | None = None
) -> AsyncIterator[trio.Nursery]:
    """The debug server on `socket_path` (and `address`) until the block ends; then its orderly stop
    (1001 to stream clients)."""
    async with trio.open_nursery() as nursery:
        ready = trio.Event()
        nursery.start_soon(
            partial(run_debug_server, node.app(), node.hub, ready.set, unix_path=socket_path, address=address)
        )
        with trio.fail_after(10):
            await ready.wait()
        yield nursery
        nursery.cancel_scope.cancel()
