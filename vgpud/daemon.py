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
from pathlib import Path

import trio
import trio_asyncio

from vgpud import __version__
from vgpud.config import Settings
from vgpud.dra.checkpoint import CheckpointStore, read_boot_id
from vgpud.dra.claimedits import NodeFacts
from vgpud.dra.driver import DraDriver
from vgpud.dra.service import RegistrationService, node_services, probes
from vgpud.dra.slices import SliceKeeper
from vgpud.gpu import GpuInfo, GpuInventoryError, open_inventory
from vgpud.grpcserve import serve
from vgpud.health import HealthService
from vgpud.kube import KubeApi, KubeError
from vgpud.kube.client import KubeClient
from vgpud.nodesetup import cgroup_v2, prepare_manager_root
from vgpud.observe.recorder import Recorder
from vgpud.partition.assigner import Mode
from vgpud.partition.eager import EagerAssigner
from vgpud.partition.layout import Layout
from vgpud.partition.lazy import LazyAssigner
from vgpud.supervisor import HealthAfter, Ready, Restart, Supervisor

log = logging.getLogger("vgpud")

EXIT_OK, EXIT_FAILURE = 0, 1
CHECKPOINT_FILE = "checkpoint.json"
NODE_LOCK_FILE = "pu.lock"
#: the control library is installed as `libvgpu-control.so.<version>` so an upgrade never swaps a live file
LIBRARY_VERSION = __version__


@dataclass
class Node:
    """What the components of one `vgpud run` share."""

    settings: Settings
    gpus: list[GpuInfo]
    kube: KubeApi
    recorder: Recorder
    supervisor: Supervisor
    driver: DraDriver
    registration: RegistrationService


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
    try:
        kube = KubeClient.from_config(settings.kubeconfig)
    except KubeError as err:
        log.error("no Kubernetes API: %s", err)
        return EXIT_FAILURE
    layout = Layout(settings.manager_dir)
    try:
        prepare_manager_root(layout, LIBRARY_VERSION, settings.library_source)
        boot_id = read_boot_id()
    except OSError as err:
        log.error("cannot set up the manager root %s: %s", settings.manager_dir, err)
        return EXIT_FAILURE
    trio.run(_main, settings, gpus, kube, layout, boot_id)
    log.info("vgpud stopped")
    return EXIT_OK


def select_mode(settings: Settings) -> Mode:
    """Lazy (per-container directories) needs the NRI plugin; until it runs here, eager mode."""
    if settings.feature_gates.enabled("NRISupport"):
        log.warning("NRISupport is on but this build has no NRI plugin yet: eager mode")
    return Mode.EAGER


def build_driver(
    *,
    settings: Settings,
    gpus: list[GpuInfo],
    kube: KubeApi,
    layout: Layout,
    boot_id: str,
    recorder: Recorder,
) -> DraDriver:
    """The DRA driver with its assigner, node facts and checkpoint, from the settings."""
    client_mode = settings.feature_gates.enabled("DevicePluginClientMode")
    mode = select_mode(settings)
    assigner = (
        EagerAssigner(layout, driver=settings.driver_name, client_mode=client_mode)
        if mode is Mode.EAGER
        else LazyAssigner(layout, driver=settings.driver_name)
    )
    facts = NodeFacts(
        driver=settings.driver_name,
        node_name=settings.node_name,
        layout=layout,
        gpus_by_minor={gpu.minor: gpu for gpu in gpus},
        client_mode=client_mode,
        cgroup_v2=cgroup_v2(),
        memory_ratio=settings.device_memory_ratio,
        library_version=LIBRARY_VERSION,
        sm_watcher=settings.feature_gates.enabled("SharedSMUtilizationWatcher"),
    )
    log.info("partition mode %s, client registration %s", mode, "on" if client_mode else "off")
    settings.plugin_dir.mkdir(parents=True, exist_ok=True)
    return DraDriver(
        kube=kube,
        assigner=assigner,
        facts=facts,
        store=CheckpointStore(settings.plugin_dir / CHECKPOINT_FILE, boot_id),
        cdi_root=settings.cdi_root,
        lock_path=settings.plugin_dir / NODE_LOCK_FILE,
        recorder=recorder,
    )


async def _main(settings: Settings, gpus: list[GpuInfo], kube: KubeApi, layout: Layout, boot_id: str) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio_asyncio.open_loop():
            recorder = Recorder()
            driver = build_driver(
                settings=settings, gpus=gpus, kube=kube, layout=layout, boot_id=boot_id, recorder=recorder
            )
            await driver.load()
            async with Supervisor(shutdown_timeout=settings.shutdown_timeout) as supervisor:
                registration = RegistrationService(settings.driver_name, settings.dra_socket)
                node = Node(settings, gpus, kube, recorder, supervisor, driver, registration)
                _start_components(node)
                async for signum in signals:
                    log.info("%s received: stopping every component", signal.Signals(signum).name)
                    supervisor.cancel()
                    break
            recorder.close()


def _start_components(node: Node) -> None:
    """Add each component to the supervisor, each restarting with backoff and a health grace."""
    settings = node.settings
    policies = (Restart(), HealthAfter())
    supervise = node.supervisor.supervise
    supervise("dra-plugin", partial(_serve_dra, node), *policies)
    slices = SliceKeeper(
        node.kube,
        driver=settings.driver_name,
        node_name=settings.node_name,
        gpus=node.gpus,
        cores_ratio=settings.device_cores_ratio,
        memory_ratio=settings.device_memory_ratio,
        # mock GPUs have made-up PCI addresses: never look them up in this host's sysfs
        sysfs=None if settings.gpu_backend == "mock" else Path("/sys"),
    )
    supervise("resource-slices", slices.run, *policies)
    supervise("dra-cleanup", node.driver.run_cleanup, *policies)
    if settings.healthcheck_port >= 0:
        supervise("health", partial(_serve_health, node), *policies, counts_for_health=False)


async def _serve_dra(node: Node, ready: Ready) -> None:
    """The DRA socket first, then the registration socket: the kubelet dials the former once it
    finds the latter."""
    settings = node.settings
    async with trio.open_nursery() as nursery:
        await nursery.start(_serve_socket, node_services(node.driver), settings.dra_socket)
        await nursery.start(_serve_socket, [node.registration], settings.registration_socket)
        ready()


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
