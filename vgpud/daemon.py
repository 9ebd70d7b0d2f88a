"""`vgpud run`: check the node, then run every component under one supervisor until SIGTERM.

What can fail for good is checked before Trio starts, and fails the pod loudly (exit 1, the kubelet
restarts it): GPU discovery, the Kubernetes API configuration, the manager root, and which partition
mode the node runs in. Everything else runs as supervised components inside one
`trio_asyncio.open_loop()`, which grpclib needs: each restarts with backoff and turns the health
service NOT_SERVING only after failing for the grace period.
"""

from __future__ import annotations

import logging
import signal
import socket
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio
import trio_asyncio

from vgpud import __version__
from vgpud.config import Settings
from vgpud.dra.checkpoint import CheckpointStore, read_boot_id
from vgpud.dra.claimedits import NodeFacts
from vgpud.dra.claimindex import describe_mismatches
from vgpud.dra.claimwatch import ClaimWatch
from vgpud.dra.driver import DraDriver
from vgpud.dra.driveredits import driver_edits
from vgpud.dra.service import DeviceHealthService, RegistrationService, node_services, probes
from vgpud.dra.slices import SliceKeeper, device_names
from vgpud.gpu import GpuInfo, GpuInventory, GpuInventoryError
from vgpud.gpu.health import HealthBoard
from vgpud.gpu.healthwatch import HealthRules, HealthWatcher
from vgpud.grpcserve import serve
from vgpud.health import HealthService
from vgpud.heap import freeze_when_listed
from vgpud.hotplug.node import HotPlug, NoDeviceCgroup, build_hotplug, device_cgroup
from vgpud.kube import KubeApi, KubeError
from vgpud.kube.client import KubeClient
from vgpud.kube.informer import Informer, claim_informer, pod_informer
from vgpud.nodesetup import NodeSetupError, cgroup_v2, prepare_manager_root
from vgpud.nri.conn import Dialer, Identity, probe, run_session
from vgpud.nri.hooks import NriHooks
from vgpud.nri.runtime_link import RuntimeLink
from vgpud.nvdriver.discover import DriverFiles, DriverRootError
from vgpud.nvdriver.node import node_driver_files
from vgpud.observe.app import ObserveApp
from vgpud.observe.drift import DriftChecker
from vgpud.observe.hub import StreamHub
from vgpud.observe.metrics import NodeMetrics
from vgpud.observe.serve import run_debug_server, run_metrics_server
from vgpud.observe.state import DebugState, NodeParts, StreamStats
from vgpud.observe.usage import UsageReader
from vgpud.partition.assigner import Mode
from vgpud.partition.eager import EagerAssigner
from vgpud.partition.layout import Layout
from vgpud.partition.lazy import LazyAssigner
from vgpud.ready import Ready
from vgpud.recorder import Recorder
from vgpud.registry.identity import container_pids, default_cgroup_root
from vgpud.registry.server import RegistryServer
from vgpud.supervisor import HealthAfter, HealthRegistry, HealthState, Restart, Supervisor

log = logging.getLogger("vgpud")

EXIT_OK, EXIT_FAILURE = 0, 1
CHECKPOINT_FILE = "checkpoint.json"
NODE_LOCK_FILE = "pu.lock"
#: the health entry that reports prepared claims served in another partition mode
CLAIM_MODES = "claim-modes"
#: the control library is installed as `libvgpu-control.so.<version>` so an upgrade never swaps a live file
LIBRARY_VERSION = __version__
NRI_COMPONENT = "nri-plugin"
HOTPLUG_COMPONENT = "hotplug"
HEALTH_WATCH_COMPONENT = "device-health"


@dataclass(frozen=True)
class Startup:
    """What the checks before Trio found out."""

    settings: Settings
    gpus: list[GpuInfo]
    kube: KubeApi
    layout: Layout
    boot_id: str
    mode: Mode
    #: NRISupport was asked for but the runtime's NRI socket did not answer: eager mode instead, and
    #: why ("" when it did not fall back)
    nri_fallback: str
    #: lazy mode: the probe's connection to the NRI socket, the NRI plugin's first session
    nri_connection: socket.socket | None = None
    #: the GPU backend the GPUs came from (the usage reader asks it for per-process memory)
    inventory: GpuInventory | None = None
    #: what vGPU containers receive from the driver (None: simulated GPUs, no driver on the node)
    driver_files: DriverFiles | None = None


@dataclass
class Node:
    """What the components of one `vgpud run` share."""

    startup: Startup
    recorder: Recorder
    supervisor: Supervisor
    driver: DraDriver
    registration: RegistrationService
    nri: NriHooks | None
    #: the library's client registration (bit 200): only with DevicePluginClientMode
    registry: RegistryServer | None
    observe: Observability
    #: every GPU's health (all healthy unless the watcher says otherwise)
    device_health: HealthBoard
    #: its writer, with NVMLDeviceHealthCheck on and the nvml backend; None otherwise
    health_watch: HealthWatcher | None
    #: the watch-fed caches of claims and this node's pods
    caches: Caches
    #: the NRI plugin's calls to the runtime (the hot-plug's UpdateContainers)
    nri_link: RuntimeLink | None = None
    #: the hot-plug API (--hotplug-socket, lazy mode only)
    hotplug: HotPlug | None = None

    @property
    def watched_health(self) -> HealthBoard | None:
        """The board for the ResourceSlice's taints and the kubelet's health stream: only while a
        watcher writes it. Without one (the gate off, or mock GPUs) both stay as they were: no taint
        ever, the stream UNIMPLEMENTED and not advertised."""
        return self.device_health if self.health_watch is not None else None

    @property
    def settings(self) -> Settings:
        return self.startup.settings


@dataclass(frozen=True)
class Caches:
    """The watch-fed caches of API objects, each a supervised component of its own: every claim (the
    NRI admission's reservations and the registry), this node's pods (the registry)."""

    claims: Informer | None = None
    pods: Informer | None = None


def build_caches(startup: Startup, *, nri: bool, registry: bool) -> Caches:
    """One claim watch for all its readers; the pod watch only for the registry."""
    kube = startup.kube
    claims = claim_informer(kube) if nri or registry else None
    pods = pod_informer(kube, startup.settings.node_name) if registry else None
    return Caches(claims, pods)


@dataclass
class Observability:
    """The readers of the node's state: metrics, the debug endpoint with its stream, the drift check,
    the reader of each container's library files."""

    parts: NodeParts
    metrics: NodeMetrics
    hub: StreamHub
    state: DebugState
    drift: DriftChecker | None
    usage: UsageReader | None


def build_health_watch(
    settings: Settings, inventory: GpuInventory | None, gpus: list[GpuInfo], board: HealthBoard
) -> HealthWatcher | None:
    """The device-health watcher over the inventory's NVML, when the gate is on and there is NVML."""
    if not settings.feature_gates.enabled("NVMLDeviceHealthCheck"):
        log.info("NVMLDeviceHealthCheck is off: no device health watching, every GPU is published healthy")
        return None
    if not settings.device_health_check:
        log.info(
            "NVMLDeviceHealthCheck is on but does not apply to the %s GPU backend (no NVML): every GPU "
            "is published healthy",
            settings.gpu_backend,
        )
        return None
    from vgpud.gpu.nvml import NvmlHealthSession, NvmlInventory  # here: pynvml only where NVML is used

    assert isinstance(inventory, NvmlInventory)
    rules = HealthRules(
        ignored_xids=settings.health_ignored_xids, recovery_seconds=settings.health_recovery_seconds
    )
    log.info(
        "device health: XIDs and lost GPUs through NVML; ignored XIDs %s; recovery after %d s",
        ",".join(map(str, sorted(rules.ignored_xids))) or "none",
        rules.recovery_seconds,
    )
    return HealthWatcher(board, gpus, partial(NvmlHealthSession, inventory), rules)


def build_observability(
    startup: Startup,
    *,
    recorder: Recorder,
    health: HealthRegistry,
    driver: DraDriver,
    nri: NriHooks | None,
    registry: RegistryServer | None,
    device_health: HealthBoard | None = None,
    health_watch: HealthWatcher | None = None,
    hotplug: HotPlug | None = None,
) -> Observability:
    settings = startup.settings
    parts = NodeParts(
        node_name=settings.node_name,
        mode=startup.mode.value,
        nri_fallback=startup.nri_fallback,
        layout=startup.layout,
        recorder=recorder,
        health=health,
        driver=driver,
        nri=nri,
        registry=registry,
        device_health=device_health,
        health_watch=health_watch,
        hotplug=hotplug,
    )
    stream = StreamStats()
    drift = DriftChecker(parts, settings.drift_interval) if settings.drift_interval > 0 else None
    usage = None
    if settings.usage_interval > 0:
        memory = startup.inventory.process_memory if startup.inventory is not None else None
        # cgroup mode: no pids.config; a container's PIDs are those of its cgroup
        pids = (
            None
            if registry_enabled(settings)
            else partial(container_pids, default_cgroup_root(), settings.systemd_cgroups)
        )
        usage = UsageReader(parts, settings.usage_interval, process_memory=memory, container_pids=pids)
    return Observability(
        parts=parts,
        metrics=NodeMetrics(parts, stream=stream, drift=drift, usage=usage),
        hub=StreamHub(recorder, stream),
        state=DebugState(parts, stream=stream, drift=drift, usage=usage),
        drift=drift,
        usage=usage,
    )


def run_daemon(settings: Settings) -> int:
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


def check_node(settings: Settings) -> Startup | None:
    """The checks before anything starts; None (after logging why) when the node cannot run vgpud."""
    source = settings.gpu_source
    try:
        inventory = source.inventory()
        gpus = inventory.gpus()
    except GpuInventoryError as err:
        log.error("GPU discovery failed: %s", err)
        return None
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
    try:
        driver_files = node_driver_files(
            settings.driver_roots,
            gpus[0].driver_version if gpus else "",
            [gpu.minor for gpu in gpus],
            required=source.backend == "nvml" or settings.driver_root_explicit,
            hook_setting=settings.nvidia_cdi_hook_path,
        )
    except DriverRootError as err:
        log.error("%s", err)
        return None
    try:
        kube = KubeClient.from_config(settings.kubeconfig)
    except KubeError as err:
        log.error("no Kubernetes API: %s", err)
        return None
    layout = Layout(settings.manager_dir)
    try:
        prepare_manager_root(
            layout, LIBRARY_VERSION, settings.library_source, settings.register_client_source
        )
        boot_id = read_boot_id()
    except NodeSetupError as err:
        log.error("%s", err)
        return None
    except OSError as err:
        log.error("cannot set up the manager root %s: %s", settings.manager_dir, err)
        return None
    mode = select_mode(settings)
    return Startup(
        settings,
        gpus,
        kube,
        layout,
        boot_id,
        mode.mode,
        mode.fallback,
        mode.connection,
        inventory,
        driver_files,
    )


@dataclass(frozen=True)
class ModeChoice:
    mode: Mode
    #: why NRISupport fell back to eager mode ("" when it did not)
    fallback: str = ""
    #: lazy mode: the probe's connection, kept for the plugin's first session
    connection: socket.socket | None = None


def select_mode(settings: Settings) -> ModeChoice:
    """Lazy when NRISupport is on and the runtime's NRI socket answers at start; otherwise eager,
    and with NRISupport on that is a fallback the log, metrics, debug state and health show (seed
    §12.1). The probe's connection is kept: the runtime logs an error for one closed unregistered."""
    if not settings.feature_gates.enabled("NRISupport"):
        return ModeChoice(Mode.EAGER)
    connected = probe(str(settings.nri_socket))
    if not isinstance(connected, str):
        log.info("NRI socket %s answers: lazy mode (per-container directories)", settings.nri_socket)
        return ModeChoice(Mode.LAZY, connection=connected)
    reason = f"the NRI socket {settings.nri_socket} does not answer: {connected}"
    log.warning("NRISupport is on but %s: eager mode (no per-container injection)", reason)
    return ModeChoice(Mode.EAGER, fallback=reason)


def build_assigner(startup: Startup) -> EagerAssigner | LazyAssigner:
    settings = startup.settings
    if startup.mode is Mode.LAZY:
        return LazyAssigner(startup.layout, driver=settings.driver_name)
    client_mode = settings.feature_gates.enabled("DevicePluginClientMode")
    return EagerAssigner(startup.layout, driver=settings.driver_name, client_mode=client_mode)


def build_driver(startup: Startup, assigner: EagerAssigner | LazyAssigner, recorder: Recorder) -> DraDriver:
    """The DRA driver with its node facts and checkpoint, from the settings."""
    settings = startup.settings
    client_mode = settings.feature_gates.enabled("DevicePluginClientMode")
    facts = NodeFacts(
        driver=settings.driver_name,
        node_name=settings.node_name,
        layout=startup.layout,
        gpus_by_minor={gpu.minor: gpu for gpu in startup.gpus},
        client_mode=client_mode,
        cgroup_v2=cgroup_v2(),
        memory_ratio=settings.device_memory_ratio,
        library_version=LIBRARY_VERSION,
        sm_watcher=settings.feature_gates.enabled("SharedSMUtilizationWatcher"),
        driver_edits=driver_edits(startup.driver_files) if startup.driver_files else None,
    )
    log.info("partition mode %s, client registration %s", assigner.mode, "on" if client_mode else "off")
    settings.plugin_dir.mkdir(parents=True, exist_ok=True)
    return DraDriver(
        kube=startup.kube,
        assigner=assigner,
        facts=facts,
        store=CheckpointStore(settings.plugin_dir / CHECKPOINT_FILE, startup.boot_id),
        cdi_root=settings.cdi_root,
        lock_path=settings.plugin_dir / NODE_LOCK_FILE,
        recorder=recorder,
    )


def registry_enabled(settings: Settings) -> bool:
    """The registry serves the library's client registration (bit 200): only in that mode."""
    return settings.feature_gates.enabled("DevicePluginClientMode")


def build_registry(
    startup: Startup,
    assigner: EagerAssigner | LazyAssigner,
    driver: DraDriver,
    nri: NriHooks | None,
    recorder: Recorder,
    *,
    caches: Caches,
) -> RegistryServer | None:
    """The registry the library's client registration (bit 200) calls: only in that mode."""
    settings = startup.settings
    if not registry_enabled(settings):
        return None
    assert caches.pods is not None and caches.claims is not None
    # claims prepared in the other mode before a restart are resolved in the mode they were prepared in
    other: EagerAssigner | LazyAssigner = (
        EagerAssigner(startup.layout, driver=settings.driver_name, client_mode=True)
        if assigner.mode is Mode.LAZY
        else LazyAssigner(startup.layout, driver=settings.driver_name)
    )
    return RegistryServer(
        layout=startup.layout,
        assigner=assigner,
        other_assigner=other,
        nri_cache=nri.cache if nri is not None else None,
        claims=driver.index,
        pods=caches.pods,
        claim_objects=caches.claims,
        recorder=recorder,
        driver_name=settings.driver_name,
        proc_root=settings.proc_root,
        cgroup_root=default_cgroup_root(),
        systemd_cgroups=settings.systemd_cgroups,
    )


async def _main(startup: Startup) -> None:
    settings = startup.settings
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio_asyncio.open_loop():
            recorder = Recorder()
            assigner = build_assigner(startup)
            driver = build_driver(startup, assigner, recorder)
            await driver.load()
            nri = None
            if isinstance(assigner, LazyAssigner):
                nri = NriHooks(assigner=assigner, admission=driver.index, recorder=recorder)
            caches = build_caches(startup, nri=nri is not None, registry=registry_enabled(settings))
            # the collector's one setting: start-up's objects frozen once the caches have listed
            freeze_when_listed([cache for cache in (caches.claims, caches.pods) if cache is not None])
            if nri is not None and caches.claims is not None:
                # who may join a claim after Prepare; without it only the pods Prepare saw are injected
                ClaimWatch(caches.claims, driver.index)
            registry = build_registry(startup, assigner, driver, nri, recorder, caches=caches)
            health = HealthRegistry()
            link = RuntimeLink()
            hotplug = start_hotplug(startup, nri, link=link, driver=driver, recorder=recorder, health=health)
            if startup.nri_fallback:
                health.register(NRI_COMPONENT, counts_for_health=False)
                health.set(NRI_COMPONENT, HealthState.STOPPED, f"eager-mode fallback: {startup.nri_fallback}")
            watch_claim_modes(health, driver)
            device_health = HealthBoard(gpu.uuid for gpu in startup.gpus)
            health_watch = build_health_watch(settings, startup.inventory, startup.gpus, device_health)
            observe = build_observability(
                startup,
                recorder=recorder,
                health=health,
                driver=driver,
                nri=nri,
                registry=registry,
                device_health=device_health,
                health_watch=health_watch,
                hotplug=hotplug,
            )
            async with Supervisor(shutdown_timeout=settings.shutdown_timeout, health=health) as supervisor:
                registration = RegistrationService(
                    settings.driver_name, settings.dra_socket, health_service=health_watch is not None
                )
                node = Node(
                    startup,
                    recorder,
                    supervisor,
                    driver,
                    registration,
                    nri,
                    registry,
                    observe,
                    device_health,
                    health_watch,
                    caches,
                    link,
                    hotplug,
                )
                _start_components(node)
                async for signum in signals:
                    log.info("%s received: stopping every component", signal.Signals(signum).name)
                    supervisor.cancel()
                    break
            recorder.close()


def start_hotplug(
    startup: Startup,
    nri: NriHooks | None,
    *,
    link: RuntimeLink,
    driver: DraDriver,
    recorder: Recorder,
    health: HealthRegistry,
) -> HotPlug | None:
    """The hot-plug component when --hotplug-socket asks for it; when it cannot run (the NRI plugin
    fell back to eager mode, no devices cgroup to change) its health entry says why, and the rest of
    the node runs on."""
    settings = startup.settings
    socket = settings.hotplug_socket_path
    if socket is None:
        return None
    why = ""
    if nri is None:
        why = "it needs the NRI plugin, and this node runs in eager mode"
    else:
        try:
            cgroup = device_cgroup()
        except NoDeviceCgroup as err:
            why = str(err)
    if why:
        log.error("hot-plug API not served: %s", why)
        health.register(HOTPLUG_COMPONENT, counts_for_health=False)
        health.set(HOTPLUG_COMPONENT, HealthState.STOPPED, why)
        return None
    assert nri is not None
    return build_hotplug(
        socket=socket,
        plugin_dir=settings.plugin_dir,
        boot_id=startup.boot_id,
        nri=nri,
        link=link,
        index=driver.index,
        recorder=recorder,
        cgroup=cgroup,
        cdi_root=settings.cdi_root,
        driver=settings.driver_name,
        uuid_of_minor={gpu.minor: gpu.uuid for gpu in startup.gpus},
    )


def watch_claim_modes(health: HealthRegistry, driver: DraDriver) -> None:
    """Health detail `claim-modes`: failing (with the claims and what it means for them) while a
    prepared claim's recorded mode is not this process's; it never makes the node NOT_SERVING."""
    health.register(CLAIM_MODES, counts_for_health=False)

    def update() -> None:
        detail = describe_mismatches(driver.index.mismatches())
        health.set(CLAIM_MODES, HealthState.FAILING if detail else HealthState.HEALTHY, detail)

    driver.index.listeners.append(update)
    update()


def _start_components(node: Node) -> None:
    """Add each component to the supervisor, each restarting with backoff and a health grace."""
    settings = node.settings
    policies = (Restart(), HealthAfter())
    supervise = node.supervisor.supervise
    supervise("dra-plugin", partial(_serve_dra, node), *policies)
    slices = SliceKeeper(
        node.startup.kube,
        driver=settings.driver_name,
        node_name=settings.node_name,
        gpus=node.startup.gpus,
        cores_ratio=settings.device_cores_ratio,
        memory_ratio=settings.device_memory_ratio,
        # the mode decided at start (an NRI start that fell back to eager publishes false)
        nri_mode=node.startup.mode is Mode.LAZY,
        # mock GPUs have made-up PCI addresses: never look them up in this host's sysfs
        sysfs=None if settings.gpu_backend == "mock" else Path("/sys"),
        health=node.watched_health,
    )
    supervise("resource-slices", slices.run, *policies)
    supervise("dra-cleanup", node.driver.run_cleanup, *policies)
    if node.health_watch is not None:
        # a watcher that cannot use NVML keeps retrying and shows as failing, but the GPUs stay
        # published: it never makes the node NOT_SERVING (NVIDIA's plugin runs on without its checks)
        supervise(HEALTH_WATCH_COMPONENT, node.health_watch.run, *policies, counts_for_health=False)
    if node.caches.claims is not None:
        supervise("claim-cache", node.caches.claims.run, *policies, counts_for_health=False)
    if node.caches.pods is not None:
        supervise("pod-cache", node.caches.pods.run, *policies, counts_for_health=False)
    if node.nri is not None:
        identity = Identity(settings.driver_name, settings.nri_plugin_idx)
        dialer = Dialer(str(settings.nri_socket), node.startup.nri_connection)
        session = partial(run_session, dialer, node.nri, identity, link=node.nri_link)
        # a runtime that restarts is dialed as soon as it binds its socket again, whatever the backoff
        supervise(NRI_COMPONENT, session, Restart(wake=dialer.replaced), HealthAfter())
    if node.registry is not None:
        supervise("registry", node.registry.run, *policies)
    if node.hotplug is not None:
        # optional: a hot-plug socket that fails never makes the node NOT_SERVING
        supervise(HOTPLUG_COMPONENT, node.hotplug.run, *policies, counts_for_health=False)
    if settings.healthcheck_port >= 0:
        supervise("health", partial(_serve_health, node), *policies, counts_for_health=False)
    _start_observability(node, policies)


def _start_observability(node: Node, policies: tuple[Restart, HealthAfter]) -> None:
    """Metrics, the debug endpoint and the drift check: supervised like the rest, but their failure
    never makes the node unhealthy (a taken metrics port must not restart the daemon)."""
    settings, observe = node.settings, node.observe
    supervise = partial(node.supervisor.supervise, counts_for_health=False)
    if settings.metrics_address is not None:
        supervise(
            "metrics", partial(run_metrics_server, observe.metrics, settings.metrics_address), *policies
        )
    if settings.debug_socket_path is not None or settings.debug_address is not None:
        app = ObserveApp(observe.metrics, state=observe.state, hub=observe.hub)
        serve = partial(
            run_debug_server,
            app,
            observe.hub,
            unix_path=settings.debug_socket_path,
            address=settings.debug_address,
        )
        supervise("debug-http", serve, *policies)
    if observe.drift is not None:
        supervise("drift", observe.drift.run, *policies)
    if observe.usage is not None:
        supervise("usage", observe.usage.run, *policies)


async def _serve_dra(node: Node, ready: Ready) -> None:
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
    """The kubelet's device health stream: the board's devices in the slice's pool, or UNIMPLEMENTED."""
    if node.watched_health is None:
        return DeviceHealthService()
    return DeviceHealthService(
        node.watched_health, pool=node.settings.node_name, devices=device_names(node.startup.gpus)
    )


async def _serve_socket(
    handlers: list[object], path: Path, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    await serve(handlers, path=path, ready=lambda _bound: task_status.started())


async def _serve_health(node: Node, ready: Ready) -> None:
    settings = node.settings
    service = HealthService(node.supervisor.health, probes(settings.registration_socket, settings.dra_socket))
    await serve(
        [service],
        host=settings.healthcheck_address,
        port=settings.healthcheck_port,
        ready=lambda _bound: ready(),
    )
