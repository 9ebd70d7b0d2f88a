"""A node's observable parts for the observe tests: a real DraDriver over the fake API (tests.draharness),
real NriHooks in lazy mode, one recorder, and the debug server on a unix socket in a temp dir; and a
prepared claim whose containers' directories hold the library's files (`prepared_node`,
`container_dir`, `write_limits`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from tests import objects as o
from tests.draharness import GPUS, REF, Harness, single_container_claim
from tests.unit.gpu.healthshim import ScriptedNvml
from vgpud._pb.nri.pkg.api.v1alpha1 import Container, CreateContainerRequest, PodSandbox
from vgpud.componenthealth import HealthRegistry, HealthState
from vgpud.containers.store import ContainerStore
from vgpud.gpu import GpuInfo
from vgpud.gpu.health import HealthBoard
from vgpud.gpu.healthrules import APPLICATION_XIDS
from vgpud.gpu.healthwatch import HealthRules, HealthWatcher
from vgpud.hotplug.node import HotPlug
from vgpud.kube.informer import claim_informer, pod_informer
from vgpud.nri.hooks import NriHooks
from vgpud.observe.app import ObserveApp
from vgpud.observe.drift import DriftChecker
from vgpud.observe.hub import StreamHub
from vgpud.observe.metrics import NodeMetrics
from vgpud.observe.serve import run_debug_server
from vgpud.observe.state import DebugState, NodeIdentity, StreamStats, WatchedDevices
from vgpud.observe.usage import UsageReader
from vgpud.partition import libfiles as F
from vgpud.partition.lazy import LazyAssigner
from vgpud.recorder import Recorder
from vgpud.registry.server import RegistryServer


@dataclass
class Node:
    """The parts the readers read, and the readers (`rebuild` makes them again after a part changed)."""

    harness: Harness
    identity: NodeIdentity
    health: HealthRegistry
    nri: NriHooks | None
    registry: RegistryServer | None
    board: HealthBoard
    #: the device-health watcher (not running until a test runs it); None: no device health shown
    watcher: HealthWatcher | None
    stream: StreamStats
    drift: DriftChecker
    usage: UsageReader
    hub: StreamHub
    #: the NVML the device-health watcher reads
    gpu_shim: ScriptedNvml
    hotplug: HotPlug | None = None
    #: the inventory the readers show (the harness's driver serves GPUS whatever it is)
    gpus: list[GpuInfo] = field(default_factory=lambda: list(GPUS))
    metrics: NodeMetrics = field(init=False)
    state: DebugState = field(init=False)

    def __post_init__(self) -> None:
        self.rebuild()

    @property
    def recorder(self) -> Recorder:
        return self.harness.recorder

    @property
    def store(self) -> ContainerStore | None:
        return self.nri.containers if self.nri is not None else None

    def make_metrics(self, **changes: Any) -> NodeMetrics:
        """Metrics over this node's parts, some of them replaced."""
        devices = WatchedDevices(self.board, self.watcher) if self.watcher is not None else None
        parts: dict[str, Any] = {
            "recorder": self.recorder,
            "health": self.health,
            "driver": self.harness.driver,
            "stream": self.stream,
            "nri": self.nri,
            "devices": devices,
            "hotplug": self.hotplug,
            "drift": self.drift,
            "usage": self.usage,
            "gpus": self.gpus,
        }
        return NodeMetrics(self.identity, **{**parts, **changes})

    def rebuild(self) -> None:
        devices = WatchedDevices(self.board, self.watcher) if self.watcher is not None else None
        self.metrics = self.make_metrics()
        self.state = DebugState(
            self.identity,
            recorder=self.recorder,
            health=self.health,
            driver=self.harness.driver,
            layout=self.harness.layout,
            stream=self.stream,
            nri=self.nri,
            registry=self.registry,
            devices=devices,
            hotplug=self.hotplug,
            drift=self.drift,
            usage=self.usage,
            gpus=self.gpus,
        )

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
            containers=None,
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
    identity = NodeIdentity("node-a", "lazy" if lazy else "eager", nri_fallback)
    store = nri.containers if nri is not None else None
    stream = StreamStats()
    drift = DriftChecker(Path(h.layout.claims_dir), h.driver, store, interval=1.0)
    usage = UsageReader(h.layout, h.driver.index, store, interval=1.0)
    hub = StreamHub(h.recorder, stream, buffer=stream_buffer)
    return Node(h, identity, health, nri, registry, board, watcher, stream, drift, usage, hub, shim)


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


#: the pod of `container_dir`'s containers
POD = PodSandbox(id="sb", name="train", namespace=o.NAMESPACE, uid=o.POD1_UID)


async def prepared_node(root: Path, *, lazy: bool) -> Node:
    """A node with one prepared single-container claim (o.CLAIM_UID) and its pod."""
    node = make_node(root, lazy=lazy)
    claim, pod = single_container_claim()
    node.harness.kube.add_claim(claim)
    node.harness.kube.add_pod(pod)
    assert (await node.harness.driver.prepare([REF]))[o.CLAIM_UID].error == ""
    return node


async def container_dir(node: Node, name: str) -> Path:
    """Container `name` of POD created through the NRI hooks on the prepared claim: its directory."""
    assert node.nri is not None
    env = [f"MANAGER_VGPU_CLAIM_UID={o.CLAIM_UID}"]
    await node.nri.create_container(
        CreateContainerRequest(
            pod=POD, container=Container(id=f"id-{name}", pod_sandbox_id="sb", name=name, env=env)
        )
    )
    return Path(node.harness.layout.container_partition(o.CLAIM_UID, POD.uid, name).base)


def write_limits(directory: Path, index: int, uuid: str, memory: int, cores: int) -> None:
    """The vgpu.config the library writes: `memory` bytes and `cores`% on GPU `index` (`uuid`)."""
    devices = [F.DeviceLimits()] * 16
    devices[index] = F.DeviceLimits(
        uuid=uuid, total_memory=memory, hard_core=cores, memory_limit=True, core_limit=True, activate=True
    )
    (directory / "config" / F.VGPU_CONFIG_FILE).write_bytes(
        F.build_vgpu_config(F.VgpuConfig(devices=tuple(devices)))
    )
