"""`Node`, every part of one `vgpud run`, and `build_node`, which makes them in order.

The order matters where one part reads another: the driver loads its checkpoint before the NRI hooks,
the caches and the registry read its claim index; the health entries of the parts that cannot run
(the NRI fallback, the hot-plug) are registered before any component's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vgpud.componenthealth import HealthRegistry, HealthState
from vgpud.config import Settings
from vgpud.dra.driver import DraDriver
from vgpud.dra.service import RegistrationService
from vgpud.dra.slices import SliceKeeper
from vgpud.gpu.health import HealthBoard
from vgpud.gpu.healthwatch import HealthWatcher
from vgpud.heap import freeze_when_listed
from vgpud.hotplug.node import HotPlug
from vgpud.kube.eventcorrelate import EventType
from vgpud.kube.events import EventRecorder, Reason
from vgpud.node.build import (
    Caches,
    build_assigner,
    build_caches,
    build_driver,
    build_health_watch,
    build_registry,
    start_hotplug,
    watch_claim_modes,
)
from vgpud.node.checks import Startup
from vgpud.node.names import NRI_PLUGIN
from vgpud.nri.conn import Dialer
from vgpud.nri.hooks import NriHooks
from vgpud.nri.runtime_link import RuntimeLink
from vgpud.partition.assigner import Mode
from vgpud.partition.lazy import LazyAssigner
from vgpud.recorder import Recorder
from vgpud.registry.server import RegistryServer


@dataclass
class Node:
    """What the components of one `vgpud run` share."""

    startup: Startup
    recorder: Recorder
    #: the Kubernetes Events the parts record, and their writer
    events: EventRecorder
    #: every component's health, and the entries of the parts that cannot run
    health: HealthRegistry
    driver: DraDriver
    registration: RegistrationService
    #: the ResourceSlice this node publishes
    slices: SliceKeeper
    nri: NriHooks | None
    #: the library's client registration (bit 200): only with DevicePluginClientMode
    registry: RegistryServer | None
    #: every GPU's health (all healthy unless the watcher says otherwise)
    device_health: HealthBoard
    #: its writer, with NVMLDeviceHealthCheck on and the nvml backend; None otherwise
    health_watch: HealthWatcher | None
    #: the watch-fed caches of claims and this node's pods
    caches: Caches
    #: the NRI plugin's calls to the runtime (the hot-plug's UpdateContainers)
    nri_link: RuntimeLink | None = None
    #: the NRI plugin's connections to the runtime (lazy mode only)
    nri_dialer: Dialer | None = None
    #: the hot-plug API (--hotplug-socket, lazy mode only)
    hotplug: HotPlug | None = None

    @property
    def watched_health(self) -> HealthBoard | None:
        """The board for the ResourceSlice's taints and the kubelet's health stream: only while a
        watcher writes it. Without one (the gate off, or mock GPUs) both stay as they were: no taint
        ever, the stream UNIMPLEMENTED and not advertised."""
        return watched(self.device_health, self.health_watch)

    @property
    def settings(self) -> Settings:
        return self.startup.settings


def watched(board: HealthBoard, watcher: HealthWatcher | None) -> HealthBoard | None:
    """`board` while `watcher` writes it, else None (see `Node.watched_health`)."""
    return board if watcher is not None else None


async def build_node(startup: Startup) -> Node:
    """Every part, built in order and not yet running (the driver's checkpoint is loaded)."""
    settings = startup.settings
    recorder = Recorder()
    events = EventRecorder(startup.kube, settings.node_name)
    assigner = build_assigner(startup)
    driver = build_driver(startup, assigner, recorder, events)
    await driver.load()
    nri = None
    if isinstance(assigner, LazyAssigner):
        nri = NriHooks(assigner=assigner, admission=driver.index, recorder=recorder, events=events)
    caches = build_caches(startup, driver.index)
    # the collector's one setting: start-up's objects frozen once the caches have listed
    freeze_when_listed([cache for cache in (caches.claims, caches.pods) if cache is not None])
    registry = build_registry(startup, assigner, driver, nri, recorder, caches=caches)
    health = HealthRegistry()
    link = RuntimeLink()
    hotplug = start_hotplug(startup, nri, link=link, driver=driver, recorder=recorder, health=health)
    if startup.nri_fallback:
        health.register(NRI_PLUGIN, counts_for_health=False)
        health.set(NRI_PLUGIN, HealthState.STOPPED, f"eager-mode fallback: {startup.nri_fallback}")
        events.record_node(
            EventType.WARNING,
            Reason.NRI_FALLBACK_TO_EAGER,
            f"NRISupport is on but {startup.nri_fallback}: eager mode (no per-container injection) "
            "until vgpud restarts with the NRI socket answering",
        )
    watch_claim_modes(health, driver)
    device_health = HealthBoard(gpu.uuid for gpu in startup.gpus)
    health_watch = build_health_watch(settings, startup.inventory, startup.gpus, device_health, events)
    return Node(
        startup=startup,
        recorder=recorder,
        events=events,
        health=health,
        driver=driver,
        registration=RegistrationService(
            settings.driver_name, settings.dra_socket, health_service=health_watch is not None
        ),
        slices=SliceKeeper(
            startup.kube,
            driver=settings.driver_name,
            node_name=settings.node_name,
            gpus=startup.gpus,
            cores_ratio=settings.device_cores_ratio,
            memory_ratio=settings.device_memory_ratio,
            # the mode decided at start (an NRI start that fell back to eager publishes false)
            nri_mode=startup.mode is Mode.LAZY,
            # mock GPUs have made-up PCI addresses: never look them up in this host's sysfs
            sysfs=None if settings.gpu_backend == "mock" else Path("/sys"),
            health=watched(device_health, health_watch),
        ),
        nri=nri,
        registry=registry,
        device_health=device_health,
        health_watch=health_watch,
        caches=caches,
        nri_link=link,
        nri_dialer=Dialer(str(settings.nri_socket), startup.nri_connection) if nri is not None else None,
        hotplug=hotplug,
    )
