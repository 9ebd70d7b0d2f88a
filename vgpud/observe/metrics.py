"""The node daemon's Prometheus metrics, in a registry of its own (names: vgpud.metrics_names).

Two feeds. Hook calls arrive through a synchronous recorder listener, so every recorded call is
counted exactly once, in O(1), and the metrics can never be dropped the way a slow stream client is.
Everything else (NRI session and cache, component health, drift, stream clients) is read from the
daemon's objects when Prometheus scrapes, by a custom collector: nothing to keep in step.

A registry per `NodeMetrics` rather than the global one, so tests build several in one process.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from grpclib.const import Status
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vgpud import metrics_names as names
from vgpud.containers.record import Injection
from vgpud.gpu.model import GpuInfo
from vgpud.hotplug.rules import AttachState
from vgpud.kube.events import EventRecorder, EventResult
from vgpud.observe.drift import DriftKind
from vgpud.observe.gpuview import excluded_views
from vgpud.observe.state import NodeIdentity, StreamStats, WatchedDevices, build_info, current_gpu_views
from vgpud.partition.nrionly import RefusalReason
from vgpud.recorder import HookCall, Outcome

if TYPE_CHECKING:
    from vgpud.componenthealth import HealthRegistry
    from vgpud.dra.driver import DraDriver
    from vgpud.hotplug.node import HotPlug
    from vgpud.nri.hooks import NriHooks
    from vgpud.observe.drift import DriftChecker
    from vgpud.observe.usage import UsageReader
    from vgpud.recorder import Recorder

#: 100 us (a skipped CreateContainer) to 2 s (the runtime's NRI deadline) and beyond (DRA Prepare)
HOOK_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    5.0,
)
_STATUS_NAMES = frozenset(status.name for status in Status)


def registry_result(call: HookCall) -> str:
    """`ok`, or the gRPC status a refused register call got (its detail starts with the status name),
    in lower case; the outcome when the detail names none."""
    if call.outcome is Outcome.OK:
        return "ok"
    status = call.detail.partition(":")[0].strip()
    return status.lower() if status in _STATUS_NAMES else call.outcome.value


class NodeMetrics:
    """Built once per `vgpud run`; `exposition()` is what `/metrics` serves."""

    def __init__(
        self,
        identity: NodeIdentity,
        *,
        recorder: Recorder,
        health: HealthRegistry,
        driver: DraDriver,
        stream: StreamStats,
        nri: NriHooks | None = None,
        devices: WatchedDevices | None = None,
        hotplug: HotPlug | None = None,
        drift: DriftChecker | None = None,
        usage: UsageReader | None = None,
        gpus: Sequence[GpuInfo] = (),
        events: EventRecorder | None = None,
        preset_components: Sequence[str] = (),
    ) -> None:
        """The parts it reads at scrape time (None: not on this node), the recorder it listens to, and
        the components of names.NODE_CALLS that run here (their calls are exported at 0 from the start)."""
        self.identity = identity
        self.health = health
        self.driver = driver
        self.stream = stream
        self.nri = nri
        self.devices = devices
        self.hotplug = hotplug
        self.drift = drift
        self.usage = usage
        self.gpus = tuple(gpus)
        self.events = events
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.calls = Counter(
            names.HOOK_CALLS.name, names.HOOK_CALLS.help, names.HOOK_CALLS.labels, registry=self.registry
        )
        self.duration = Histogram(
            names.HOOK_DURATION.name,
            names.HOOK_DURATION.help,
            names.HOOK_DURATION.labels,
            buckets=HOOK_BUCKETS,
            registry=self.registry,
        )
        self.registry_requests = Counter(
            names.REGISTRY_REQUESTS.name,
            names.REGISTRY_REQUESTS.help,
            names.REGISTRY_REQUESTS.labels,
            registry=self.registry,
        )
        self.registry.register(StateCollector(self))
        self._children: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}
        for component in preset_components:
            for call in names.NODE_CALLS[component]:
                for outcome in names.PRESET_OUTCOMES:
                    self._child((component, call, outcome))
        recorder.add_listener(self.observe)

    def observe(self, call: HookCall) -> None:
        """The recorder listener: count the call and its latency (label children cached: O(1))."""
        key = (call.component, call.call, call.outcome.value)
        children = self._children.get(key) or self._child(key)
        children[0].inc()
        children[1].observe(call.latency_seconds)
        if call.component == "registry":
            self.registry_requests.labels(registry_result(call)).inc()

    def _child(self, key: tuple[str, str, str]) -> tuple[Counter, Histogram]:
        """The call counter and latency histogram of (component, call, outcome), made once."""
        children = (self.calls.labels(*key), self.duration.labels(key[0], key[1]))
        self._children[key] = children
        return children

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition format and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _gauge(name: names.MetricName, value: float | None = None) -> GaugeMetricFamily:
    if name.labels:
        return GaugeMetricFamily(name.name, name.help, labels=name.labels)
    return GaugeMetricFamily(name.name, name.help, value=value)


def _counter(name: names.MetricName, value: float | None = None) -> CounterMetricFamily:
    if name.labels:
        return CounterMetricFamily(name.name, name.help, labels=name.labels)
    return CounterMetricFamily(name.name, name.help, value=value)


class StateCollector(Collector):
    """Reads the daemon's state at scrape time, from the parts its `NodeMetrics` names."""

    def __init__(self, node: NodeMetrics) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        node, identity = self._node, self._node.identity
        info = build_info()
        build = _gauge(names.BUILD_INFO)
        build.add_metric([info["version"], info["python"]], 1)
        yield build
        mode = _gauge(names.PARTITION_MODE)
        mode.add_metric([identity.mode], 1)
        yield mode
        yield _counter(names.NRI_EAGER_FALLBACKS, 1 if identity.nri_fallback else 0)
        fallback = _gauge(names.NRI_EAGER_FALLBACK_INFO)
        if identity.nri_fallback:
            fallback.add_metric([identity.nri_fallback], 1)
        yield fallback
        mismatches = _gauge(names.CLAIM_MODE_MISMATCHES)
        by_mode = Tally(m.prepared.value for m in node.driver.index.mismatches())
        for prepared in ("eager", "lazy"):
            mismatches.add_metric([prepared], by_mode[prepared])
        yield mismatches
        refusals = _counter(names.PREPARE_REFUSALS)
        for reason in RefusalReason:  # every reason, 0 until the first refusal
            refusals.add_metric([reason.value], node.driver.refusals.get(reason.value, 0))
        yield refusals
        yield _gauge(names.SERVING, 1 if node.health.all_healthy() else 0)
        health = _gauge(names.COMPONENT_HEALTH)
        for component, entry in sorted(node.health.snapshot().items()):
            for state in type(entry.state):  # every state of the enum, 1 for the current one
                health.add_metric([component, state.value], 1 if entry.state is state else 0)
        yield health
        yield from self._device_health()
        if node.nri is not None:
            yield from self._nri(node.nri)
        yield from self._drift_metrics()
        yield from self._usage_metrics()
        yield from self._gpu_metrics()
        attachments = _gauge(names.HOTPLUG_ATTACHMENTS)  # no samples while the API is not served
        if node.hotplug is not None:
            by_state = Tally(a.state.value for a in node.hotplug.service.table.attachments.values())
            for state in AttachState:
                attachments.add_metric([state.value], by_state.get(state.value, 0))
        yield attachments
        yield _gauge(names.STREAM_CLIENTS, node.stream.clients)
        closed = _counter(names.STREAM_DROPS)
        for reason, count in sorted(node.stream.closed.items()):
            closed.add_metric([reason], count)
        yield closed
        yield self._events()

    def _events(self) -> Metric:
        """Every recorded Event by result, each result 0 until its first (none where no writer runs)."""
        events = _counter(names.EVENTS)
        if self._node.events is not None:
            for result in EventResult:
                events.add_metric([result.value], self._node.events.stats.get(result, 0))
        return events

    def _device_health(self) -> Iterator[Metric]:
        """Each GPU's health and XID counts, while the watcher runs."""
        devices = self._node.devices
        if devices is None:
            return
        board, watcher = devices.board, devices.watcher
        healthy = _gauge(names.DEVICE_HEALTHY)
        snapshot = board.snapshot()
        for index, uuid in sorted(watcher.uuids().items()):
            if uuid in snapshot:
                healthy.add_metric([uuid, str(index)], 1 if snapshot[uuid].healthy else 0)
        yield healthy
        xids = _counter(names.DEVICE_XIDS)
        for (uuid, xid, kind), count in sorted(watcher.stats.xids.items()):
            xids.add_metric([uuid, str(xid), kind], count)
        yield xids

    def _nri(self, nri: NriHooks) -> Iterator[Metric]:
        stats = nri.stats
        sync = _gauge(names.NRI_SYNC_CONTAINERS)
        sync.add_metric(["reported"], stats.sync_reported)
        sync.add_metric(["rebuilt"], stats.sync_rebuilt)
        yield sync
        yield _counter(names.NRI_SYNC_INVALID, stats.sync_invalid)
        yield _gauge(names.NRI_CACHE_ENTRIES, nri.containers.count(Injection.INJECTED))
        yield _gauge(names.NRI_NOT_INJECTED, nri.containers.count(Injection.MISSING))
        yield _counter(names.NRI_CONNECTION_CLOSES, stats.connection_closes)
        yield _gauge(names.NRI_CONNECTED, 1 if nri.session_state().connected else 0)
        yield _counter(names.NRI_REMOVED_DIRECTORIES, stats.removed_dirs)
        rejected = _counter(names.NRI_REJECTED_CONTAINERS)
        rejected.add_metric(["unprepared"], stats.rejected_unprepared)
        rejected.add_metric(["not-reserved"], stats.rejected_not_reserved)
        yield rejected
        yield _counter(names.NRI_OTHER_MODE_CONTAINERS, stats.other_mode)

    def _drift_metrics(self) -> Iterator[Metric]:
        if self._node.drift is None:
            return
        status = self._node.drift.status()
        yield _counter(names.DRIFT_CHECKS, status.checks)
        detected = _counter(names.DRIFT_DETECTED)
        current = _gauge(names.DRIFT_DIFFERENCES)
        now: dict[str, int] = {}
        for difference in status.differences:
            now[difference.kind.value] = now.get(difference.kind.value, 0) + 1
        for kind in DriftKind:
            detected.add_metric([kind.value], status.detected.get(kind.value, 0))
            current.add_metric([kind.value], now.get(kind.value, 0))
        yield detected
        yield current
        yield _gauge(names.PARTITION_CONFLICTS, status.conflicts or 0)  # lazy mode: none by construction

    def _usage_metrics(self) -> Iterator[Metric]:
        """The usage reader's last pass: one sample per container and device (nothing when it is off)."""
        if self._node.usage is None:
            return
        status = self._node.usage.status()
        yield _counter(names.USAGE_READS, status.reads)
        memory, core = _gauge(names.CONTAINER_MEMORY_LIMIT), _gauge(names.CONTAINER_CORE_LIMIT)
        ledger, processes = _gauge(names.CONTAINER_LEDGER_BYTES), _gauge(names.CONTAINER_LEDGER_PROCESSES)
        sm, errors = _gauge(names.CONTAINER_SM_UTILIZATION), _gauge(names.CONTAINER_FILE_ERRORS)
        used = _gauge(names.CONTAINER_MEMORY_USED)
        for container in status.containers:
            target = container.target
            owner = [target.namespace, target.pod_name, target.container, target.claim_uid, target.partition]
            errors.add_metric(owner, len(container.usage.errors))
            for device in container.usage.devices:
                labels = [*owner, str(device.index), device.uuid]
                if device.memory_limited:
                    memory.add_metric(labels, device.memory_limit)
                if device.core_limited:
                    core.add_metric(labels, device.core_limit / 100)
                if container.usage.has_ledger:
                    ledger.add_metric(labels, device.ledger_bytes)
                    processes.add_metric(labels, device.ledger_processes)
                if device.sm_util_permille is not None:
                    sm.add_metric(labels, device.sm_util_permille / 1000)
                if device.used_bytes is not None:
                    used.add_metric(labels, device.used_bytes)
        yield from (memory, core, used, ledger, processes, sm, errors)

    def _gpu_metrics(self) -> Iterator[Metric]:
        """Each shared GPU's capacity, what its vGPUs are allocated and use when the usage reader runs;
        each GPU vgpud does not share, and why."""
        node = self._node
        views = current_gpu_views(node.gpus, node.usage, node.devices)
        info, total = _gauge(names.GPU_INFO), _gauge(names.GPU_MEMORY_TOTAL)
        allocated, used = _gauge(names.GPU_MEMORY_ALLOCATED), _gauge(names.GPU_MEMORY_USED)
        cores, sm = _gauge(names.GPU_CORES_ALLOCATED), _gauge(names.GPU_SM_UTILIZATION)
        vgpus = _gauge(names.GPU_VGPUS)
        for view in views:
            gpu = [str(view.index), view.uuid]
            info.add_metric([*gpu, view.product], 1)
            total.add_metric(gpu, view.memory_total)
            if node.usage is None:
                continue
            allocated.add_metric(gpu, view.memory_allocated)
            used.add_metric(gpu, view.memory_used)
            cores.add_metric(gpu, view.cores_allocated)
            sm.add_metric(gpu, view.sm_utilization)
            vgpus.add_metric([*gpu, "true"], len(view.vgpus) - view.unlimited)
            vgpus.add_metric([*gpu, "false"], view.unlimited)
        excluded = _gauge(names.GPUS_EXCLUDED)
        for gone in excluded_views(node.gpus):
            excluded.add_metric([str(gone.index), gone.uuid, gone.reason], 1)
        yield from (info, total, allocated, used, cores, sm, vgpus, excluded)
