"""One builder per part of `vgpud run`, each from the `Startup` and the parts built before it.

Builders only make objects (and log what they chose); nothing runs until the supervisor starts it.
An optional part that does not apply to this node is None, and `vgpud.daemon` supervises no component
for it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial

from vgpud.componenthealth import HealthRegistry, HealthState
from vgpud.config import Settings
from vgpud.dra.checkpoint import CHECKPOINT_FILE, CheckpointStore
from vgpud.dra.claimedits import NodeFacts
from vgpud.dra.claimindex import ClaimIndex, describe_mismatches
from vgpud.dra.claimlabel import node_claim_labels
from vgpud.dra.claimwatch import ClaimWatch
from vgpud.dra.driver import DraDriver
from vgpud.dra.driveredits import driver_edits
from vgpud.dra.nodelock import LOCK_FILE
from vgpud.gpu import GpuInfo, GpuInventory
from vgpud.gpu.exclusion import excluded_gpus, shared_gpus
from vgpud.gpu.health import HealthBoard
from vgpud.gpu.healthwatch import HealthRules, HealthWatcher
from vgpud.hotplug.node import HotPlug, NoDeviceCgroup, build_hotplug, device_cgroup
from vgpud.kube.events import EventSink
from vgpud.kube.informer import Informer, claim_informer, pod_informer
from vgpud.node.checks import Startup
from vgpud.node.names import CLAIM_MODES, HOTPLUG, LIBRARY_VERSION
from vgpud.nodesetup import cgroup_v2
from vgpud.nri.hooks import NriHooks
from vgpud.nri.runtime_link import RuntimeLink
from vgpud.partition.assigner import Mode
from vgpud.partition.eager import EagerAssigner
from vgpud.partition.lazy import LazyAssigner
from vgpud.recorder import Recorder
from vgpud.registry.identity import default_cgroup_root
from vgpud.registry.server import RegistryServer

#: `vgpud run`'s own lines have always been logged as "vgpud"
log = logging.getLogger("vgpud")


def build_assigner(startup: Startup) -> EagerAssigner | LazyAssigner:
    """The partition assigner of the mode the checks chose."""
    settings = startup.settings
    if startup.mode is Mode.LAZY:
        return LazyAssigner(startup.layout, driver=settings.driver_name)
    client_mode = settings.feature_gates.enabled("DevicePluginClientMode")
    return EagerAssigner(startup.layout, driver=settings.driver_name, client_mode=client_mode)


def build_driver(
    startup: Startup, assigner: EagerAssigner | LazyAssigner, recorder: Recorder, events: EventSink
) -> DraDriver:
    """The DRA driver with its node facts and checkpoint, from the settings."""
    settings = startup.settings
    client_mode = settings.feature_gates.enabled("DevicePluginClientMode")
    facts = NodeFacts(
        driver=settings.driver_name,
        node_name=settings.node_name,
        layout=startup.layout,
        gpus_by_minor={gpu.minor: gpu for gpu in shared_gpus(startup.gpus)},
        client_mode=client_mode,
        cgroup_v2=cgroup_v2(),
        memory_ratio=settings.device_memory_ratio,
        library_version=LIBRARY_VERSION,
        sm_watcher=settings.feature_gates.enabled("SharedSMUtilizationWatcher"),
        driver_edits=driver_edits(startup.driver_files) if startup.driver_files else None,
        claim_labels=node_claim_labels(settings.driver_name, settings.node_name)
        if claims_watched(startup)
        else {},
        excluded_by_minor=excluded_by_minor(startup.gpus),
    )
    log.info("partition mode %s, client registration %s", assigner.mode, "on" if client_mode else "off")
    settings.plugin_dir.mkdir(parents=True, exist_ok=True)
    return DraDriver(
        kube=startup.kube,
        assigner=assigner,
        facts=facts,
        store=CheckpointStore(settings.plugin_dir / CHECKPOINT_FILE, startup.boot_id),
        cdi_root=settings.cdi_root,
        lock_path=settings.plugin_dir / LOCK_FILE,
        recorder=recorder,
        events=events,
    )


def excluded_by_minor(gpus: list[GpuInfo]) -> dict[int, str]:
    """The GPUs vgpud does not share, by minor: "GPU <uuid> (host index <n>), in MIG mode (...)"."""
    excluded = excluded_gpus(gpus)
    return {
        gpu.minor: f"GPU {gpu.uuid} (host index {gpu.index}), {excluded[gpu.uuid].detail}"
        for gpu in gpus
        if gpu.uuid in excluded
    }


@dataclass(frozen=True)
class Caches:
    """The watch-fed caches of API objects: the claims this node prepared (the NRI admission's
    reservations and the registry; `claim_watch` runs it and binds it to the claim index), this
    node's pods (the registry). Each runs as a supervised component of its own."""

    claims: Informer | None = None
    claim_watch: ClaimWatch | None = None
    pods: Informer | None = None


def claims_watched(startup: Startup) -> bool:
    """Whether a claim cache runs: for the NRI plugin (lazy mode) or the registry. Prepare labels the
    claims it prepares exactly then (`NodeFacts.claim_labels`)."""
    return startup.mode is Mode.LAZY or registry_enabled(startup.settings)


def build_caches(startup: Startup, index: ClaimIndex) -> Caches:
    """One watch of this node's labelled claims for all its readers; the pod watch for the registry."""
    kube, settings = startup.kube, startup.settings
    caches = Caches()
    if claims_watched(startup):
        labels = node_claim_labels(settings.driver_name, settings.node_name)
        claims = claim_informer(kube, labels=labels)
        caches = Caches(claims, ClaimWatch(claims, index, kube, labels))
    if registry_enabled(settings):
        caches = replace(caches, pods=pod_informer(kube, settings.node_name))
    return caches


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
        containers=nri.containers if nri is not None else None,
        claims=driver.index,
        pods=caches.pods,
        claim_objects=caches.claims,
        recorder=recorder,
        driver_name=settings.driver_name,
        proc_root=settings.proc_root,
        cgroup_root=default_cgroup_root(),
        systemd_cgroups=settings.systemd_cgroups,
    )


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
        health.register(HOTPLUG, counts_for_health=False)
        health.set(HOTPLUG, HealthState.STOPPED, why)
        return None
    assert nri is not None
    return build_hotplug(
        socket=socket,
        plugin_dir=settings.plugin_dir,
        boot_id=startup.boot_id,
        containers=nri.containers,
        gone_listeners=nri.on_container_gone,
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


def build_health_watch(
    settings: Settings,
    inventory: GpuInventory | None,
    gpus: list[GpuInfo],
    board: HealthBoard,
    events: EventSink | None = None,
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
    return HealthWatcher(board, gpus, partial(NvmlHealthSession, inventory), rules, events=events)
