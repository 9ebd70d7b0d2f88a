"""What `/debug/state` (and `vgpud debug state`) shows: read from the daemon's own objects, never
written. Each section is built by a function of plain values, so its JSON shape is tested alone.

Shape (every key always present; a section that does not apply to this node is null):

    node, version, mode ("lazy" | "eager"), time (epoch seconds), healthy
    nri_fallback: {reason}: NRISupport on but the NRI socket did not answer at start (else null)
    claim_modes: {current, mismatches: [{claim_uid, namespace, name, prepared, current, consequence}],
                  unrecorded: [claim UIDs whose entry has no mode: treated as the current mode]}
    prepare_refusals: {reason: n}: claims Prepare refused because this node's mode cannot serve
                  their use, by reason (every RefusalReason, 0 until one)
    components:  {name: {state, reason, for_seconds, counts_for_health}}
    nri:         {session: {connected, runtime, nri_version, registration_timeout_ms,
                            request_timeout_ms, synchronized, sessions, last_close, last_sync_time},
                  stats: {injected, skipped, rejected_unprepared, sync_reported, sync_rebuilt,
                          sync_invalid, removed_dirs, connection_closes, requests: {method: n}},
                  cache: {synced, entries, directories: {dir: {pod_uid, container, claim_uid,
                                                               pod_namespace, pod_name,
                                                               container_ids}}},
                  not_injected: {container ID: {pod_uid, container, claim_uid, pod_namespace,
                                                 pod_name, directory, missing}},
                  runtime_containers}                                      lazy mode only
    partitions:  {"<claim UID>/<key>": {claim: {uid, namespace, name}, key, directory, register_uuid,
                                        requests, containers}}               eager mode only
    partition_conflicts: [{claim_uid, container, partitions, reason}]       eager mode only
    partition_errors:    ["claim ns/name: why it could not be read"]        eager mode only
    register_uuids: {issued, consumed, unconsumed: {uuid: {claim_uid, namespace, name}}}
                                                                           client registration only
    drift:       {interval_seconds, checks, last_check, differences: [{kind, subject, detail}],
                  detected: {kind: n}, partition_conflicts, last_error}   when the self-check runs
    device_health: {ignored_xids, recovery_seconds, sessions, checks,
                  devices: {uuid: {index, healthy, reason, since, xid}},
                  xids: [{uuid, xid, kind, count}]}            when the device-health watcher runs
    gpus:        [{index, uuid, product, healthy, memory_total_bytes, memory_allocated_bytes,
                   memory_used_bytes, cores_allocated_ratio, sm_utilization_ratio, unlimited_vgpus,
                   vgpus: [{namespace, pod, container, claim_uid, partition, memory_limit_bytes,
                            core_limit_ratio, memory_used_bytes, sm_utilization_ratio, pids}]}]
                  every shared GPU by index (vgpud.observe.gpuview: allocated and used need the
                  usage reader; healthy is null without the device-health watcher)
    excluded_gpus: [{index, uuid, product, reason, excluded, mig_devices: [{uuid, gpu_instance_id,
                   compute_instance_id, profile, slices, memory_total, multiprocessor_count}]}]
                  every GPU left out of the ResourceSlice (vgpud.gpu.exclusion): reason "mig",
                  `excluded` says why in words
    usage:       {interval_seconds, reads, last_read, process_memory_error,
                  containers: {"<claim UID>/<partition>": {claim_uid, partition, namespace, pod,
                               pod_uid, container,
                               directory, files: {vgpu_config, vmem_node, sm_node}, pids,
                               devices: {index: {uuid, memory_limit_bytes, core_limit_percent,
                                                 ledger_bytes, ledger_processes,
                                                 sm_utilization_permille, nvml_bytes, used_bytes}},
                               errors: [...]}}}                            when the usage reader runs
    hotplug:     {socket, attachments: [{targetPodUid, containerName, slavePodUid, containerId,
                  targetPodNamespace, targetPodName, claims, attachedAt, state}]}
                                                                           when --hotplug-socket serves
    stream:      {clients, closed: {reason: n}}
    calls:       {last_seq, recent: [HookCall...]}

Container names in `partitions` are the reference's node names: `<pod UID>/<init|app>/<name>`.
"""

from __future__ import annotations

import platform
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from vgpud import __version__
from vgpud.containers.record import Injection
from vgpud.gpu.model import GpuInfo
from vgpud.observe.gpuview import GpuView, excluded_views, gpu_views
from vgpud.partition.layout import Layout
from vgpud.partition.nrionly import RefusalReason
from vgpud.recorder import Recorder

if TYPE_CHECKING:
    from vgpud.componenthealth import ComponentHealth, HealthRegistry
    from vgpud.dra.claimindex import ClaimIndex, ClaimRef
    from vgpud.dra.driver import DraDriver
    from vgpud.dra.partitions import ClaimPartitions
    from vgpud.gpu.health import HealthBoard
    from vgpud.gpu.healthwatch import HealthWatcher
    from vgpud.hotplug.node import HotPlug
    from vgpud.nri.hooks import NriHooks
    from vgpud.observe.drift import DriftChecker
    from vgpud.observe.usage import UsageReader
    from vgpud.registry.server import RegistryServer

JsonObject = dict[str, Any]
#: eager partitions are read from the API: the state answers without them after this long
PARTITIONS_TIMEOUT = 5.0


@dataclass(frozen=True)
class NodeIdentity:
    """Which node this vgpud serves and in which partition mode."""

    node_name: str
    #: "lazy" | "eager"
    mode: str
    #: why NRISupport fell back to eager mode at start ("" when it did not)
    nri_fallback: str = ""


@dataclass(frozen=True)
class WatchedDevices:
    """Every GPU's health and the watcher that writes it: only while one runs (without it every GPU
    stays published healthy, and neither the state nor the metrics show device health)."""

    board: HealthBoard
    watcher: HealthWatcher


@dataclass
class StreamStats:
    """The live stream's clients, kept by the debug app; read by the state and the metrics."""

    clients: int = 0
    #: clients vgpud closed, by reason (slow, filter-failed, shutdown)
    closed: Counter[str] = field(default_factory=Counter)


def current_gpu_views(
    gpus: Sequence[GpuInfo], usage: UsageReader | None, devices: WatchedDevices | None
) -> list[GpuView]:
    """Every GPU as the usage reader's last pass and the device-health watcher see it now."""
    containers = usage.status().containers if usage is not None else ()
    healthy = None
    if devices is not None:
        healthy = {uuid: h.healthy for uuid, h in devices.board.snapshot().items()}
    return gpu_views(gpus, containers, healthy)


def build_info() -> dict[str, str]:
    return {"version": __version__, "python": platform.python_version()}


def health_json(components: Mapping[str, ComponentHealth], now: float) -> JsonObject:
    """`now` is on the health registry's clock (Trio's)."""
    return {
        name: {
            "state": entry.state.value,
            "reason": entry.reason,
            "for_seconds": round(max(0.0, now - entry.since), 3),
            "counts_for_health": entry.counts_for_health,
        }
        for name, entry in sorted(components.items())
    }


def device_health_json(devices: WatchedDevices) -> JsonObject:
    """Each GPU's health as the board holds it, and what the watcher counted."""
    board, watcher = devices.board, devices.watcher
    indices = {uuid: index for index, uuid in watcher.uuids().items()}
    return {
        "ignored_xids": sorted(watcher.rules.ignored_xids),
        "recovery_seconds": watcher.rules.recovery_seconds,
        "sessions": watcher.stats.sessions,
        "checks": watcher.stats.checks,
        "devices": {
            uuid: {
                "index": indices.get(uuid),
                "healthy": health.healthy,
                "reason": health.reason,
                "since": health.since,
                "xid": health.xid,
            }
            for uuid, health in sorted(board.snapshot().items())
        },
        "xids": [
            {"uuid": uuid, "xid": xid, "kind": kind, "count": count}
            for (uuid, xid, kind), count in sorted(watcher.stats.xids.items())
        ],
    }


def nri_json(nri: NriHooks) -> JsonObject:
    store = nri.containers
    injected = store.select(Injection.INJECTED)
    directories: JsonObject = {}
    for c in injected:
        row = directories.setdefault(
            str(c.directory),
            {
                "pod_uid": c.pod_uid,
                "container": c.name,
                "claim_uid": c.claim_uid,
                "pod_namespace": c.pod_namespace,
                "pod_name": c.pod_name,
                "container_ids": [],
            },
        )
        row["container_ids"].append(c.container_id)
    not_injected = {
        c.container_id: {
            "pod_uid": c.pod_uid,
            "container": c.name,
            "claim_uid": c.claim_uid,
            "pod_namespace": c.pod_namespace,
            "pod_name": c.pod_name,
            "directory": str(c.directory),
            "missing": list(c.missing),
        }
        for c in store.select(Injection.MISSING)
    }
    return {
        "session": asdict(nri.session_state()),
        "stats": asdict(nri.stats),
        "cache": {"synced": store.synced, "entries": len(injected), "directories": directories},
        "not_injected": not_injected,
        "runtime_containers": store.count(),
    }


def hotplug_json(hotplug: HotPlug) -> JsonObject:
    """The socket and every attachment, as List answers it (with its state)."""
    return {
        "socket": str(hotplug.socket),
        "attachments": [
            {**message, "state": a.state.value}
            for message, a in zip(hotplug.service.debug_state(), hotplug.service.table.sorted(), strict=True)
        ],
    }


def partitions_json(claims: list[ClaimPartitions], layout: Layout) -> JsonObject:
    """`"<claim UID>/<key>"` -> the partition, its register UUID, requests and current containers."""
    out: JsonObject = {}
    for claim in claims:
        requests: dict[str, list[str]] = {}
        for request, key in sorted(claim.record.request_partitions.items()):
            requests.setdefault(key, []).append(request)
        for key in sorted(requests):
            out[f"{claim.claim.uid}/{key}"] = {
                "claim": {
                    "uid": claim.claim.uid,
                    "namespace": claim.claim.namespace,
                    "name": claim.claim.name,
                },
                "key": key,
                "directory": str(layout.partition(claim.claim.uid, key).base),
                "register_uuid": claim.record.register_uuids.get(key, ""),
                "requests": requests[key],
                "containers": [c.node for c in claim.containers.get(key, ())],
            }
    return out


def conflicts_json(claims: list[ClaimPartitions]) -> list[JsonObject]:
    return [
        {
            "claim_uid": claim.claim.uid,
            "container": conflict.container.node,
            "partitions": list(conflict.partitions),
            "reason": conflict.reason,
        }
        for claim in claims
        for conflict in claim.conflicts
    ]


def register_uuids_json(issued: Mapping[str, ClaimRef], consumed: frozenset[str]) -> JsonObject:
    """The UUIDs Prepare minted, and which of them no register call has used yet."""
    return {
        "issued": len(issued),
        "consumed": len(consumed & issued.keys()),
        "unconsumed": {
            uuid: {"claim_uid": ref.uid, "namespace": ref.namespace, "name": ref.name}
            for uuid, ref in sorted(issued.items())
            if uuid not in consumed
        },
    }


def claim_modes_json(index: ClaimIndex) -> JsonObject:
    """The prepared claims served in a mode other than the one they were prepared in."""
    return {
        "current": index.mode.value,
        "mismatches": [
            {
                "claim_uid": m.claim.uid,
                "namespace": m.claim.namespace,
                "name": m.claim.name,
                "prepared": m.prepared.value,
                "current": m.current.value,
                "consequence": m.consequence,
            }
            for m in index.mismatches()
        ],
        "unrecorded": [ref.uid for ref in index.unrecorded_modes()],
    }


class DebugState:
    """Builds the `/debug/state` document from the parts it shows (None: not on this node)."""

    def __init__(
        self,
        identity: NodeIdentity,
        *,
        recorder: Recorder,
        health: HealthRegistry,
        driver: DraDriver,
        layout: Layout,
        stream: StreamStats,
        nri: NriHooks | None = None,
        registry: RegistryServer | None = None,
        devices: WatchedDevices | None = None,
        hotplug: HotPlug | None = None,
        drift: DriftChecker | None = None,
        usage: UsageReader | None = None,
        gpus: Sequence[GpuInfo] = (),
        partitions_timeout: float = PARTITIONS_TIMEOUT,
    ) -> None:
        self.identity = identity
        self.recorder = recorder
        self.health = health
        self.driver = driver
        self.layout = layout
        self.stream = stream
        self.nri = nri
        self.registry = registry
        self.devices = devices
        self.hotplug = hotplug
        self.drift = drift
        self.usage = usage
        self.gpus = tuple(gpus)
        self._partitions_timeout = partitions_timeout

    async def snapshot(self, *, calls: int = 20) -> JsonObject:
        identity, driver = self.identity, self.driver
        state: JsonObject = {
            "node": identity.node_name,
            **build_info(),
            "mode": identity.mode,
            "nri_fallback": {"reason": identity.nri_fallback} if identity.nri_fallback else None,
            "time": time.time(),
            "healthy": self.health.all_healthy(),
            "claim_modes": claim_modes_json(driver.index),
            "prepare_refusals": {r.value: driver.refusals.get(r.value, 0) for r in RefusalReason},
            "components": health_json(self.health.snapshot(), trio.current_time()),
            "nri": nri_json(self.nri) if self.nri is not None else None,
            "partitions": None,
            "partition_conflicts": None,
            "partition_errors": None,
            "register_uuids": None,
            "drift": self.drift.status().to_dict() if self.drift is not None else None,
            "device_health": device_health_json(self.devices) if self.devices is not None else None,
            "gpus": [v.to_dict() for v in current_gpu_views(self.gpus, self.usage, self.devices)],
            "excluded_gpus": [v.to_dict() for v in excluded_views(self.gpus)],
            "usage": self.usage.status().to_dict() if self.usage is not None else None,
            "hotplug": hotplug_json(self.hotplug) if self.hotplug is not None else None,
            "stream": {"clients": self.stream.clients, "closed": dict(self.stream.closed)},
            "calls": {
                "last_seq": self.recorder.last_seq,
                "recent": [c.to_dict() for c in self.recorder.recent(calls)],
            },
        }
        if self.registry is not None:
            state["register_uuids"] = register_uuids_json(
                driver.index.register_uuids(), self.registry.consumed_register_uuids()
            )
        if self.nri is None:
            state.update(await self._eager_partitions())
        return state

    async def _eager_partitions(self) -> JsonObject:
        claims = None
        with trio.move_on_after(self._partitions_timeout):
            claims = await self.driver.claim_partitions()
        if claims is None:
            return {"partition_errors": [f"reading the claims timed out after {self._partitions_timeout}s"]}
        return {
            "partitions": partitions_json(claims, self.layout),
            "partition_conflicts": conflicts_json(claims),
            "partition_errors": [
                f"claim {c.claim.namespace}/{c.claim.name}: {c.error}" for c in claims if c.error
            ],
        }
