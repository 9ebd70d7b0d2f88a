"""Kubernetes Events about what vgpud knows, on the Pod or the Node it concerns, so `kubectl describe
pod|node` shows it beside the kubelet's (docs/observability.md, "Events": each reason, where and when).

`EventRecorder.record` is what a hook calls: synchronous, O(1), it never waits and never raises on
the hook's path. It decides with the correlator (`vgpud.kube.eventcorrelate`: a repeat is a count
bump, many similar Events one combined Event, an object's spam dropped) and queues what to write; a
full queue drops the Event. `run`, a supervised component, writes the queue one Event at a time:
create, or patch the Event already written (count, lastTimestamp, message); a patch of an Event the
API server no longer has (deleted, or expired after the server's event TTL) creates it anew. An API
error drops that Event, never retried: an Event is a report, not state, and the same fact is in the
log, the metrics and the debug state. Each kind of failure is logged once; every Event is counted
under one `EventResult` (vgpud_events_total).

The source is the kubelet's shape: component `vgpud`, host the node name; reportingComponent and
reportingInstance the same. An Event about the Node names it with uid = its name, as the kubelet's
do (`kubectl describe node` selects the node's Events by that uid), in namespace `default`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from enum import StrEnum
from typing import Protocol

import trio

from vgpud.kube.api import JsonObject, KubeApi, KubeError, NotFound
from vgpud.kube.eventcorrelate import Action, Decision, EventCorrelator, EventType, ObjectRef, Occurrence
from vgpud.ready import Ready

log = logging.getLogger("vgpud.events")

#: the Events' source component and reportingComponent
COMPONENT = "vgpud"
#: Events waiting to be written; beyond, an Event is dropped (the API server is slow or away)
QUEUE_SIZE = 1000
#: the longest message written (events.k8s.io's limit for a note); a longer one is cut
MESSAGE_MAX = 1024
#: the API server's limit on reportingInstance
REPORTING_INSTANCE_MAX = 128
#: where the Events of a cluster-scoped object go (client-go's choice)
CLUSTER_EVENTS_NAMESPACE = "default"


class Reason(StrEnum):
    """Every Event reason vgpud writes (the one place each is spelled)."""

    #: Pod, Warning: the NRI plugin found a vGPU container of it running without its injection
    VGPU_NOT_INJECTED = "VGPUNotInjected"
    #: Pod, Warning: Prepare refused a vGPU claim reserved for it (a use this node's mode cannot serve)
    VGPU_CLAIM_REFUSED = "VGPUClaimRefused"
    #: Pod, Warning: the NRI plugin injected nothing into a container whose claim is not prepared
    #: here, or not reserved for the pod
    VGPU_CONTAINER_REFUSED = "VGPUContainerRefused"
    #: Node, Warning: the device-health watcher marked a GPU unhealthy
    GPU_UNHEALTHY = "GPUUnhealthy"
    #: Node, Normal: an unhealthy GPU recovered
    GPU_HEALTHY = "GPUHealthy"
    #: Node, Warning: NRISupport is on but the NRI socket did not answer at start: eager mode
    NRI_FALLBACK_TO_EAGER = "NRIFallbackToEager"


class EventResult(StrEnum):
    """What became of one recorded Event: the `result` label of vgpud_events_total."""

    #: a new Event object was created
    SENT = "sent"
    #: an identical Event's count was bumped
    PATCHED = "patched"
    #: written into a "(combined from similar events)" Event
    COMBINED = "combined"
    #: dropped by the per-object spam filter
    RATE_LIMITED = "rate_limited"
    #: dropped because the queue was full (or the Event named no object)
    DROPPED = "dropped"
    #: the API server refused it or did not answer: dropped
    FAILED = "failed"


def pod_ref(namespace: str, name: str, uid: str) -> ObjectRef:
    return ObjectRef("Pod", name, uid, namespace)


def node_ref(name: str) -> ObjectRef:
    """The Node as the kubelet's Events name it: uid = its name."""
    return ObjectRef("Node", name, name)


class EventSink(Protocol):
    """What a part that reports Events is given (None where there is no API server to write to)."""

    def record(self, obj: ObjectRef, type: EventType, reason: Reason, message: str) -> None:
        """An Event about `obj`; never waits, never raises."""
        ...

    def record_node(self, type: EventType, reason: Reason, message: str) -> None:
        """An Event about this node."""
        ...


class EventRecorder:
    """One per `vgpud run`: `record` from the Trio thread; `run` is the supervised writer."""

    def __init__(
        self,
        kube: KubeApi,
        node_name: str,
        *,
        queue_size: int = QUEUE_SIZE,
        clock: Callable[[], float] = time.time,
        correlator: EventCorrelator | None = None,
    ) -> None:
        self.node_name = node_name
        #: every recorded Event under what became of it
        self.stats: Counter[EventResult] = Counter()
        self._kube = kube
        self._clock = clock
        self._correlator = correlator or EventCorrelator()
        self._send, self._receive = trio.open_memory_channel[Decision](queue_size)
        self._logged: set[tuple[str, ...]] = set()

    def record(self, obj: ObjectRef, type: EventType, reason: Reason, message: str) -> None:
        if len(message) > MESSAGE_MAX:
            message = message[: MESSAGE_MAX - 3] + "..."
        try:
            occurrence = Occurrence(obj, type, reason.value, message)
        except ValueError as err:  # a runtime that named no pod: the hook goes on
            self.stats[EventResult.DROPPED] += 1
            self._log_once(("invalid",), "events: not written: %s", err)
            return
        decision = self._correlator.correlate(occurrence, self._clock())
        if decision is None:
            self.stats[EventResult.RATE_LIMITED] += 1
            log.debug("event %s on %s %s dropped by the spam filter", reason, obj.kind, obj.name)
            return
        try:
            self._send.send_nowait(decision)
        except trio.WouldBlock:
            self.stats[EventResult.DROPPED] += 1
            self._log_once(
                ("queue-full",),
                "events: %d Events wait to be written; more are dropped until the API server catches up "
                '(counted in vgpud_events_total{result="dropped"})',
                self._send.statistics().max_buffer_size,
            )

    def record_node(self, type: EventType, reason: Reason, message: str) -> None:
        self.record(node_ref(self.node_name), type, reason, message)

    async def run(self, ready: Ready) -> None:
        """Write the queued Events, in order, until cancelled; the queue outlives a restart."""
        ready()
        while True:
            decision = await self._receive.receive()
            await self._write(decision)

    async def _write(self, decision: Decision) -> None:
        namespace = event_namespace(decision.occurrence.obj)
        result = EventResult.COMBINED if decision.combined else EventResult.SENT
        try:
            if decision.action is Action.PATCH:
                try:
                    await self._kube.patch_event(namespace, decision.name, patch_body(decision))
                    result = EventResult.COMBINED if decision.combined else EventResult.PATCHED
                except NotFound:  # deleted, or expired: written anew under its name
                    await self._kube.create_event(namespace, event_body(decision, self.node_name))
            else:
                await self._kube.create_event(namespace, event_body(decision, self.node_name))
        except KubeError as err:
            self.stats[EventResult.FAILED] += 1
            self._log_once(
                ("failed", decision.action.value, str(err.status)),
                "events: cannot %s Event %s %s on %s %s/%s: %s (this kind of failure is logged once; every "
                'one is dropped and counted in vgpud_events_total{result="failed"})',
                decision.action.value,
                decision.occurrence.type,
                decision.occurrence.reason,
                decision.occurrence.obj.kind,
                namespace,
                decision.occurrence.obj.name,
                err,
            )
            return
        self.stats[result] += 1

    def _log_once(self, kind: tuple[str, ...], message: str, *args: object) -> None:
        """WARNING the first time, DEBUG after: a broken API server must not flood the log."""
        level = logging.DEBUG if kind in self._logged else logging.WARNING
        self._logged.add(kind)
        log.log(level, message, *args)


def event_namespace(obj: ObjectRef) -> str:
    """An Event lives in its object's namespace; a cluster-scoped object's in `default`."""
    return obj.namespace or CLUSTER_EVENTS_NAMESPACE


def event_body(decision: Decision, host: str) -> JsonObject:
    """The core/v1 Event to create, as the kubelet's recorder fills one in."""
    occurrence, obj = decision.occurrence, decision.occurrence.obj
    involved = {"apiVersion": obj.api_version, "kind": obj.kind, "name": obj.name, "uid": obj.uid}
    if obj.namespace:
        involved["namespace"] = obj.namespace
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": decision.name, "namespace": event_namespace(obj)},
        "involvedObject": involved,
        "type": occurrence.type.value,
        "reason": occurrence.reason,
        "message": decision.message,
        "source": {"component": COMPONENT, "host": host},
        "reportingComponent": COMPONENT,
        "reportingInstance": host[:REPORTING_INSTANCE_MAX],
        "firstTimestamp": timestamp(decision.first_timestamp),
        "lastTimestamp": timestamp(decision.last_timestamp),
        "count": decision.count,
    }


def patch_body(decision: Decision) -> JsonObject:
    """The fields a repeat changes (client-go's patch: count, lastTimestamp, message)."""
    return {
        "count": decision.count,
        "lastTimestamp": timestamp(decision.last_timestamp),
        "message": decision.message,
    }


def timestamp(seconds: float) -> str:
    """RFC 3339 in UTC, whole seconds: the Event's timestamps' format."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
