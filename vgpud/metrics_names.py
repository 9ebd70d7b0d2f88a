"""Every Prometheus metric vgpud exposes: name, help and labels, declared once.

The metric objects live with the process that serves them (the node daemon, `vgpud webhook`), each in
its own registry; this module only fixes what an operator's dashboards and alerts depend on, so a name
is never spelled twice and a rename shows up in one diff. Later components add their entries here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricName:
    """One metric: the exposed name (counters end in `_total`), its help text and label names."""

    name: str
    help: str
    labels: tuple[str, ...] = ()


#: every admission review the webhook answered, and every request it refused as malformed;
#: kind: pods, resourceclaims, resourceclaims/status, other, or - for a body that is no review;
#: result: allowed, denied, error (a lookup failed: denied, fail-closed) or bad_request (HTTP 4xx)
WEBHOOK_REVIEWS = MetricName(
    "vgpud_webhook_reviews_total",
    "Admission reviews answered by the vgpud webhook, by resource, operation and result.",
    ("kind", "operation", "result"),
)

#: the reviews exported from the start at 0 (kind, operation) as the chart registers the webhook, with
#: every result of a decided review: the first denial or error is then a rise `increase` sees
WEBHOOK_PRESET_REVIEWS = (
    ("pods", "CREATE"),
    ("resourceclaims", "CREATE"),
    ("resourceclaims", "UPDATE"),
    ("resourceclaims/status", "UPDATE"),
)
WEBHOOK_PRESET_RESULTS = ("allowed", "denied", "error")

#: time from a complete request body to the answer being ready, lookups through the API included
WEBHOOK_REVIEW_DURATION = MetricName(
    "vgpud_webhook_review_duration_seconds",
    "Time the vgpud webhook took to decide one admission review.",
    ("kind",),
)

#: the serving certificate currently in use was loaded at this time (seconds since the epoch)
WEBHOOK_TLS_LOADED = MetricName(
    "vgpud_webhook_tls_loaded_timestamp_seconds",
    "When the vgpud webhook last loaded its serving certificate.",
)

#: reloading a changed certificate/key pair failed; the previous pair stays in use
WEBHOOK_TLS_RELOAD_FAILURES = MetricName(
    "vgpud_webhook_tls_reload_failures_total",
    "Changed certificate or key files the vgpud webhook could not load (the previous pair stays).",
)

# --------------------------------------------------------------------------------------------------
# The node daemon (`vgpud run`). Hook calls come from the recorder (one label set per recorded call);
# the rest is read from the daemon's own state at scrape time.

#: every recorded hook or RPC call. component: nri, dra, registry; call: CreateContainer, Synchronize,
#: RemoveContainer, StopPodSandbox (NRI), Prepare, Unprepare, Cleanup (DRA, one per claim of a
#: NodePrepare/NodeUnprepareResources call), RegisterContainerDevice (registry); outcome: ok, error,
#: skipped, rejected, cancelled
HOOK_CALLS = MetricName(
    "vgpud_hook_calls_total",
    "Hook and RPC calls vgpud handled, by component, call and outcome.",
    ("component", "call", "outcome"),
)

#: the node's (component, call) pairs whose calls and latency are exported from the start at 0 with
#: the outcomes an alert or a rate reads (ok, error), so the first call after a scrape is a rise of the
#: counter and not a series born at 1 that `rate` and `increase` cannot see
NODE_CALLS = {
    "dra": ("Prepare", "Unprepare", "Cleanup"),
    "nri": ("CreateContainer", "Synchronize", "RemoveContainer", "StopPodSandbox"),
    "registry": ("RegisterContainerDevice",),
}
PRESET_OUTCOMES = ("ok", "error")

#: how long each hook or RPC call took inside vgpud (the runtime's and the kubelet's deadlines are 2 s
#: and more; buckets resolve 100 us to 2.5 s)
HOOK_DURATION = MetricName(
    "vgpud_hook_duration_seconds",
    "Time vgpud spent in one hook or RPC call, by component and call.",
    ("component", "call"),
)

#: register calls of the library by result: ok, or the gRPC status name in lower case
#: (invalid_argument, permission_denied, not_found, deadline_exceeded, resource_exhausted, ...)
REGISTRY_REQUESTS = MetricName(
    "vgpud_registry_requests_total",
    "Register calls the vgpud registry answered, by result (ok or the gRPC status).",
    ("result",),
)

#: containers in the runtime's last complete Synchronize: kind=reported (every container the runtime
#: listed) and kind=rebuilt (the vGPU containers that went into the NRI cache)
NRI_SYNC_CONTAINERS = MetricName(
    "vgpud_nri_sync_containers",
    "Containers in the last NRI Synchronize: reported by the runtime, and rebuilt into the cache.",
    ("kind",),
)

#: vGPU containers a Synchronize reported that could not be cached (unprepared claim, unknown pod...)
NRI_SYNC_INVALID = MetricName(
    "vgpud_nri_sync_invalid_containers_total",
    "Containers with a vGPU claim in an NRI Synchronize that were not valid on this node.",
)

#: entries of the NRI cache now: (pod UID, container) -> claim and directory
NRI_CACHE_ENTRIES = MetricName(
    "vgpud_nri_cache_entries",
    "Containers in vgpud's NRI cache.",
)

#: NRI sessions that ended (the runtime closed the connection, dropped the plugin, or a framing error)
NRI_CONNECTION_CLOSES = MetricName(
    "vgpud_nri_connection_closes_total",
    "NRI connections to the runtime that ended.",
)

#: 1 while an NRI session is registered with the runtime
NRI_CONNECTED = MetricName(
    "vgpud_nri_connected",
    "Whether vgpud's NRI plugin is connected to the runtime (1) or not (0).",
)

#: per-container directories removed by RemoveContainer / StopPodSandbox
NRI_REMOVED_DIRECTORIES = MetricName(
    "vgpud_nri_removed_directories_total",
    "Per-container vGPU directories vgpud removed on NRI container and pod events.",
)

#: NRISupport was on but the runtime's NRI socket did not answer at start: eager mode instead (0 or 1
#: per process; seed §12.1)
NRI_EAGER_FALLBACKS = MetricName(
    "vgpud_nri_eager_fallbacks_total",
    "Starts where NRISupport was on but the NRI socket did not answer, so eager mode was used.",
)

#: the same fallback with its reason (why the socket did not answer), value 1; absent without one
NRI_EAGER_FALLBACK_INFO = MetricName(
    "vgpud_nri_eager_fallback_info",
    "NRISupport was on but the NRI socket did not answer at start: eager mode, and why (value 1).",
    ("reason",),
)

#: running vGPU containers the runtime reported (Synchronize) without vgpud's mounts and env: created
#: while vgpud was away; they cannot register (the runtime cannot evict them)
NRI_NOT_INJECTED = MetricName(
    "vgpud_nri_not_injected_containers",
    "Running vGPU containers the runtime reported without vgpud's injection (recreate their pods).",
)

#: the partition mode this process runs in: mode=lazy or mode=eager, value 1
PARTITION_MODE = MetricName(
    "vgpud_partition_mode",
    "The partition mode vgpud runs in (1 for the current mode).",
    ("mode",),
)

#: prepared vGPU claims whose recorded partition mode (prepared_mode: lazy, eager) is not the mode this
#: process runs in: a lazy claim under eager mode has no NRI to give its new containers a directory;
#: an eager claim under lazy mode is left to its CDI spec. 0 in a node that kept its mode
CLAIM_MODE_MISMATCHES = MetricName(
    "vgpud_claim_mode_mismatches",
    "Prepared vGPU claims recorded in a partition mode other than the one vgpud runs in.",
    ("prepared_mode",),
)

#: containers the NRI plugin refused to inject, by reason: unprepared (no vGPU claim of the pod's
#: namespace prepared here) or not-reserved (the claim is not reserved for the pod)
NRI_REJECTED_CONTAINERS = MetricName(
    "vgpud_nri_rejected_containers_total",
    "vGPU containers the NRI plugin did not inject because their claim is not theirs to use, by reason.",
    ("reason",),
)

#: containers of claims prepared in eager mode, left to their CDI spec by the lazy NRI plugin
NRI_OTHER_MODE_CONTAINERS = MetricName(
    "vgpud_nri_other_mode_containers_total",
    "Containers of claims prepared in eager mode that the NRI plugin left to their CDI spec.",
)

#: containers whose devices come from more than one partition (bug-2, eager mode), as found by the
#: last self-check; 0 in a healthy system
PARTITION_CONFLICTS = MetricName(
    "vgpud_partition_conflicts",
    "Containers whose vGPU devices come from more than one eager partition (last self-check).",
)

#: vGPU claims Prepare refused because this node cannot serve their use, by reason
#: (vgpud.partition.nrionly.RefusalReason): in eager mode vgpu-claim-across-pods (reserved for several
#: pods) and multiple-vgpu-claims-per-container (a container also uses another vGPU claim); in NRI
#: mode vgpu-claims-share-a-gpu (a container's vGPU claims have devices on the same GPU)
PREPARE_REFUSALS = MetricName(
    "vgpud_prepare_refusals_total",
    "vGPU claims Prepare refused because this node's mode cannot serve their use, by reason.",
    ("reason",),
)

#: 1 while vgpud's gRPC health service answers SERVING (every component that counts for health is
#: healthy), 0 while NOT_SERVING: the kubelet's and an alert's view of the node daemon as a whole
SERVING = MetricName(
    "vgpud_serving",
    "Whether vgpud's health service answers SERVING (1) or NOT_SERVING (0).",
)

#: component health as a state set: one series per component and state, 1 for the current state
COMPONENT_HEALTH = MetricName(
    "vgpud_component_health",
    "Health of each supervised vgpud component (1 for its current state).",
    ("component", "state"),
)

#: each GPU's health as the device-health watcher decided it (1 healthy, 0 unhealthy; why is in the
#: debug state and the log line, not a label: free text would make a series per message); present
#: only while the watcher runs (NVMLDeviceHealthCheck on, nvml backend)
DEVICE_HEALTHY = MetricName(
    "vgpud_device_healthy",
    "Whether vgpud's device-health watcher considers the GPU healthy (1) or not (0).",
    ("uuid", "index"),
)

#: XID critical-error events NVML delivered, by GPU and code; kind: fatal (the GPU turned or stayed
#: unhealthy) or ignored (an application error of --health-ignored-xids)
DEVICE_XIDS = MetricName(
    "vgpud_device_xid_events_total",
    "XID critical-error events NVML reported, by GPU, XID and kind (fatal or ignored).",
    ("uuid", "xid", "kind"),
)

#: completed drift self-checks
DRIFT_CHECKS = MetricName(
    "vgpud_drift_checks_total",
    "Drift self-checks vgpud ran (the runtime's vGPU containers vs directories vs checkpoint).",
)

#: differences found, by kind, summed over checks (a difference that persists counts at every check)
DRIFT_DETECTED = MetricName(
    "vgpud_drift_detected_total",
    "State differences the drift self-check confirmed, by kind, summed over checks.",
    ("kind",),
)

#: differences the last check confirmed, by kind
DRIFT_DIFFERENCES = MetricName(
    "vgpud_drift_differences",
    "State differences the last drift self-check confirmed, by kind.",
    ("kind",),
)

#: websocket clients of the live hook-call stream now
STREAM_CLIENTS = MetricName(
    "vgpud_debug_stream_clients",
    "Clients connected to vgpud's live hook-call stream.",
)

#: stream clients closed by vgpud: reason=slow (could not keep up), filter-failed, shutdown
STREAM_DROPS = MetricName(
    "vgpud_debug_stream_closed_total",
    "Live hook-call stream clients vgpud closed, by reason.",
    ("reason",),
)

#: every Kubernetes Event vgpud recorded, by what became of it (vgpud.kube.events.EventResult): sent
#: (a new Event), patched (a repeat's count bumped), combined (into a "(combined from similar events)"
#: Event), rate_limited (the per-object spam filter), dropped (the queue was full, or it named no
#: object), failed (the API server refused it or did not answer)
EVENTS = MetricName(
    "vgpud_events_total",
    "Kubernetes Events vgpud recorded, by result (sent, patched, combined, rate_limited, dropped, failed).",
    ("result",),
)

#: always 1; the labels say which build runs
BUILD_INFO = MetricName(
    "vgpud_build_info",
    "vgpud's version and Python (value 1).",
    ("version", "python"),
)

#: whose container a per-container series is about, and its claim and directory
CONTAINER_LABELS = ("namespace", "pod", "container", "claim_uid", "partition")
#: the same, and which GPU
CONTAINER_DEVICE_LABELS = (*CONTAINER_LABELS, "index", "uuid")
#: one physical GPU
GPU_LABELS = ("index", "uuid")

# --------------------------------------------------------------------------------------------------
# Each container's limits and usage, as the library's files in its directory say (vgpud.observe.usage).
# Labels: namespace, pod, container (whose container it is: what dashboards and alerts group by; in
# eager mode a partition may serve several pods, so pod and container are "" and namespace is the
# claim's); claim_uid; partition (`<pod UID>_<container>` in lazy mode, the partition key in eager
# mode); index (host NVML index) and uuid of the device. The node comes from the scrape (the chart's
# ServiceMonitor relabels it from the pod's node).
#
# Cardinality: one series per family for each (vGPU container, GPU it uses) the reader's last pass
# found on the node: it grows with the node's vGPU containers, never with the cluster (8 GPUs with 10
# vGPU containers each: 80 series per family, 560 for the seven). A restarted container keeps its
# series (same directory); a deleted pod's series go with its directory. No label takes free text.

#: vgpu.config: the memory limit the library enforces (absent when it enforces none)
CONTAINER_MEMORY_LIMIT = MetricName(
    "vgpud_container_memory_limit_bytes",
    "Device memory limit of a vGPU container, as its library's vgpu.config says.",
    CONTAINER_DEVICE_LABELS,
)

#: vgpu.config: the hard core limit the library enforces, 0..1 of the GPU's SMs (absent when it enforces
#: none; the file says percent)
CONTAINER_CORE_LIMIT = MetricName(
    "vgpud_container_core_limit_ratio",
    "Core (SM) limit of a vGPU container as a share of the GPU (0..1), as its library's vgpu.config says.",
    CONTAINER_DEVICE_LABELS,
)

#: vmem_node.config: bytes charged to the container that NVML does not report (managed, async, capture)
CONTAINER_LEDGER_BYTES = MetricName(
    "vgpud_container_ledger_bytes",
    "Device memory a vGPU container's library charges in its ledger (what NVML does not report).",
    CONTAINER_DEVICE_LABELS,
)

#: what the library's memory limit counts: NVML's memory of the PIDs pids.config registers plus the
#: ledger (absent when no PID is registered: cgroup mode, or before the first registration)
CONTAINER_MEMORY_USED = MetricName(
    "vgpud_container_memory_used_bytes",
    "Device memory a vGPU container uses: NVML's per-process memory of its registered PIDs plus its ledger.",
    CONTAINER_DEVICE_LABELS,
)

#: vmem_node.config: processes with a live ledger entry
CONTAINER_LEDGER_PROCESSES = MetricName(
    "vgpud_container_ledger_processes",
    "Processes of a vGPU container with a live entry in its library's ledger.",
    CONTAINER_DEVICE_LABELS,
)

#: sm_node.config: the container's SM utilization at the shared bucket's last sample (0..1)
CONTAINER_SM_UTILIZATION = MetricName(
    "vgpud_container_sm_utilization_ratio",
    "SM utilization of a vGPU container at its shared bucket's last sample (0..1).",
    CONTAINER_DEVICE_LABELS,
)

#: library files of a container that the last read found but could not read or parse
CONTAINER_FILE_ERRORS = MetricName(
    "vgpud_container_file_errors",
    "Library files of a vGPU container the last usage read could not read or parse.",
    CONTAINER_LABELS,
)

#: completed passes of the usage reader
USAGE_READS = MetricName(
    "vgpud_usage_reads_total",
    "Passes of vgpud's reader of each container's library files.",
)

# --------------------------------------------------------------------------------------------------
# Each GPU: capacity vs allocated vs used (vgpud.observe.gpuview), like the reference's device view.
# Allocated is what the vGPU containers' libraries enforce (their vgpu.config limits), used what they
# count; both need the usage reader. One series per shared GPU and family; a GPU vgpud does not share
# (vgpud.gpu.exclusion) is only in GPUS_EXCLUDED.

#: always 1; which product the GPU is
GPU_INFO = MetricName(
    "vgpud_gpu_info",
    "A GPU vgpud shares and its product name (value 1).",
    (*GPU_LABELS, "product"),
)

#: the GPU's device memory (NVML's total)
GPU_MEMORY_TOTAL = MetricName(
    "vgpud_gpu_memory_total_bytes",
    "Device memory of the GPU.",
    GPU_LABELS,
)

#: the sum of the memory limits of the vGPU containers on the GPU
GPU_MEMORY_ALLOCATED = MetricName(
    "vgpud_gpu_memory_allocated_bytes",
    "Device memory of the GPU allocated to vGPU containers: the sum of their memory limits.",
    GPU_LABELS,
)

#: the sum of what the vGPU containers' libraries count (NVML per-process memory plus ledger)
GPU_MEMORY_USED = MetricName(
    "vgpud_gpu_memory_used_bytes",
    "Device memory of the GPU that its vGPU containers use, as their libraries count it.",
    GPU_LABELS,
)

#: the sum of the core limits of the vGPU containers on the GPU (above 1: overcommitted)
GPU_CORES_ALLOCATED = MetricName(
    "vgpud_gpu_cores_allocated_ratio",
    "Share of the GPU's SMs allocated to vGPU containers: their core limits' sum (over 1: overcommitted).",
    GPU_LABELS,
)

#: the sum of the vGPU containers' SM utilization at their buckets' last sample
GPU_SM_UTILIZATION = MetricName(
    "vgpud_gpu_sm_utilization_ratio",
    "SM utilization of the GPU by its vGPU containers at their last sample (0..1).",
    GPU_LABELS,
)

#: always 1: a GPU vgpud leaves out of its ResourceSlice; reason (vgpud.gpu.exclusion.ExclusionReason):
#: mig (the GPU is in MIG mode)
GPUS_EXCLUDED = MetricName(
    "vgpud_gpus_excluded",
    "A GPU vgpud does not share and leaves out of its ResourceSlice, by reason (value 1).",
    (*GPU_LABELS, "reason"),
)

#: vGPU containers (lazy) or partitions (eager) on the GPU; limited: with a memory limit or not
GPU_VGPUS = MetricName(
    "vgpud_gpu_vgpus",
    "vGPU containers (eager mode: partitions) on the GPU, by whether they have a memory limit.",
    (*GPU_LABELS, "memory_limited"),
)

#: the hot-plug API's attachment table; state: attaching, attached, detaching (a change under way,
#: or cut short and finished by the next reconcile)
HOTPLUG_ATTACHMENTS = MetricName(
    "vgpud_hotplug_attachments",
    "Slave pods' vGPUs attached to running containers through vgpud's hot-plug API, by state.",
    ("state",),
)

ALL: tuple[MetricName, ...] = (
    WEBHOOK_REVIEWS,
    WEBHOOK_REVIEW_DURATION,
    WEBHOOK_TLS_LOADED,
    WEBHOOK_TLS_RELOAD_FAILURES,
    HOOK_CALLS,
    HOOK_DURATION,
    REGISTRY_REQUESTS,
    NRI_SYNC_CONTAINERS,
    NRI_SYNC_INVALID,
    NRI_CACHE_ENTRIES,
    NRI_CONNECTION_CLOSES,
    NRI_CONNECTED,
    NRI_REMOVED_DIRECTORIES,
    NRI_EAGER_FALLBACKS,
    NRI_EAGER_FALLBACK_INFO,
    NRI_NOT_INJECTED,
    PARTITION_MODE,
    CLAIM_MODE_MISMATCHES,
    NRI_REJECTED_CONTAINERS,
    NRI_OTHER_MODE_CONTAINERS,
    PARTITION_CONFLICTS,
    PREPARE_REFUSALS,
    SERVING,
    COMPONENT_HEALTH,
    DEVICE_HEALTHY,
    DEVICE_XIDS,
    DRIFT_CHECKS,
    DRIFT_DETECTED,
    DRIFT_DIFFERENCES,
    STREAM_CLIENTS,
    STREAM_DROPS,
    EVENTS,
    BUILD_INFO,
    CONTAINER_MEMORY_LIMIT,
    CONTAINER_CORE_LIMIT,
    CONTAINER_LEDGER_BYTES,
    CONTAINER_MEMORY_USED,
    CONTAINER_LEDGER_PROCESSES,
    CONTAINER_SM_UTILIZATION,
    CONTAINER_FILE_ERRORS,
    USAGE_READS,
    GPU_INFO,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_ALLOCATED,
    GPU_MEMORY_USED,
    GPU_CORES_ALLOCATED,
    GPU_SM_UTILIZATION,
    GPU_VGPUS,
    GPUS_EXCLUDED,
    HOTPLUG_ATTACHMENTS,
)
