"""The checks before Trio starts, and the `Startup` they find.

What can fail for good is checked here, once, and fails the pod loudly (exit 1, the kubelet restarts
it): GPU discovery, the driver files, the Kubernetes API configuration, the manager root. Which
partition mode the node runs in is decided here too: every part is then built for that mode.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

from vgpud.config import Settings
from vgpud.dra.checkpoint import read_boot_id
from vgpud.gpu import GpuInfo, GpuInventory, GpuInventoryError
from vgpud.kube import KubeApi, KubeError
from vgpud.kube.client import KubeClient
from vgpud.node.names import LIBRARY_VERSION
from vgpud.nodesetup import NodeSetupError, prepare_manager_root
from vgpud.nri.conn import probe
from vgpud.nvdriver.discover import DriverFiles, DriverRootError
from vgpud.nvdriver.node import node_driver_files
from vgpud.partition.assigner import Mode
from vgpud.partition.layout import Layout

#: `vgpud run`'s own lines have always been logged as "vgpud"
log = logging.getLogger("vgpud")


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
    """The partition mode `select_mode` chose, with why it fell back and the probe's connection."""

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
