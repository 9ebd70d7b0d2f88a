"""The Event recorder over the fake API: what it writes and in what shape, and how it fails: a full
queue drops (counted), a patch of an Event the server lost creates it anew, an API error drops that
Event (counted, logged once) and the writer goes on."""

from __future__ import annotations

import logging

import pytest

from tests.events import Recording, recording
from vgpud.kube.api import KubeError
from vgpud.kube.eventcorrelate import AGGREGATE_MAX_EVENTS, COMBINED_PREFIX, SPAM_BURST, EventType
from vgpud.kube.events import MESSAGE_MAX, QUEUE_SIZE, EventResult, Reason, node_ref, pod_ref

T0 = 1_800_000_000.0
POD = pod_ref("ml", "train", "uid-1")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def make(queue_size: int = QUEUE_SIZE) -> tuple[Recording, Clock]:
    clock = Clock()
    return Recording(clock=clock, queue_size=queue_size), clock


async def test_an_event_on_a_pod_has_the_kubelets_shape() -> None:
    record, _ = make()
    async with recording(record):
        record.recorder.record(POD, EventType.WARNING, Reason.VGPU_CONTAINER_REFUSED, "container main: no")
        [event] = await record.events("ml")
    assert event["metadata"]["name"].startswith("train.")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "train",
        "uid": "uid-1",
    }
    assert (event["type"], event["reason"], event["message"]) == (
        "Warning",
        "VGPUContainerRefused",
        "container main: no",
    )
    assert event["source"] == {"component": "vgpud", "host": "node-a"}
    assert (event["reportingComponent"], event["reportingInstance"]) == ("vgpud", "node-a")
    assert (event["firstTimestamp"], event["lastTimestamp"], event["count"]) == (
        "2027-01-15T08:00:00Z",
        "2027-01-15T08:00:00Z",
        1,
    )
    assert record.recorder.stats == {EventResult.SENT: 1}


async def test_an_event_on_the_node_is_in_default_with_the_node_name_as_uid() -> None:
    record, _ = make()
    async with recording(record):
        record.recorder.record_node(EventType.NORMAL, Reason.GPU_HEALTHY, "GPU 0 healthy again")
        [event] = await record.events("default")
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-a"}
    assert event["metadata"]["name"].startswith("node-a.")
    assert event["type"] == "Normal"


async def test_a_repeat_patches_the_count_and_a_lost_event_is_created_anew() -> None:
    record, clock = make()
    kube, recorder = record.kube, record.recorder
    async with recording(record):
        recorder.record(POD, EventType.WARNING, Reason.VGPU_NOT_INJECTED, "same")
        await record.events()
        clock.now += 5
        recorder.record(POD, EventType.WARNING, Reason.VGPU_NOT_INJECTED, "same")
        [event] = await record.events("ml")
        assert (event["count"], event["lastTimestamp"]) == (2, "2027-01-15T08:00:05Z")
        assert event["firstTimestamp"] == "2027-01-15T08:00:00Z"
        kube.delete_event("ml", event["metadata"]["name"])  # the server's TTL
        clock.now += 5
        recorder.record(POD, EventType.WARNING, Reason.VGPU_NOT_INJECTED, "same")
        [anew] = await record.events("ml")
    assert anew["metadata"]["name"] == event["metadata"]["name"]
    assert (anew["count"], anew["firstTimestamp"], anew["lastTimestamp"]) == (
        3,
        "2027-01-15T08:00:00Z",
        "2027-01-15T08:00:10Z",
    )
    assert kube.calls["patch_event"] == 2 and kube.calls["create_event"] == 2
    assert recorder.stats == {EventResult.SENT: 2, EventResult.PATCHED: 1}


async def test_similar_events_are_combined_and_spam_is_counted() -> None:
    record, _ = make()
    async with recording(record):
        for i in range(SPAM_BURST + 5):
            record.recorder.record(POD, EventType.WARNING, Reason.VGPU_CONTAINER_REFUSED, f"container c{i}")
        events = await record.events("ml")
    assert len(events) == AGGREGATE_MAX_EVENTS
    [combined] = [e for e in events if e["message"].startswith(COMBINED_PREFIX)]
    assert combined["message"] == COMBINED_PREFIX + f"container c{SPAM_BURST - 1}"
    assert combined["count"] == SPAM_BURST - AGGREGATE_MAX_EVENTS + 1
    assert record.recorder.stats == {
        EventResult.SENT: AGGREGATE_MAX_EVENTS - 1,
        EventResult.COMBINED: SPAM_BURST - AGGREGATE_MAX_EVENTS + 1,
        EventResult.RATE_LIMITED: 5,
    }


async def test_a_full_queue_drops_and_counts_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    record, _ = make(queue_size=2)
    caplog.set_level(logging.WARNING, logger="vgpud.events")
    for i in range(5):  # nothing writes yet: the API server is slow
        record.recorder.record(node_ref("node-a"), EventType.WARNING, Reason.GPU_UNHEALTHY, f"GPU {i}")
    assert record.recorder.stats == {EventResult.DROPPED: 3}
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("events: 2 Events wait to be written; more are dropped"), line
    async with recording(record):
        assert [e["message"] for e in await record.events("default")] == ["GPU 0", "GPU 1"]
    assert record.recorder.stats == {EventResult.DROPPED: 3, EventResult.SENT: 2}


async def test_an_api_error_drops_the_event_and_the_writer_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    record, _ = make()
    caplog.set_level(logging.WARNING, logger="vgpud.events")
    for _ in range(2):
        record.kube.fail_next("create_event", KubeError('events is forbidden: User "x" cannot create', 403))
    async with recording(record):
        for reason in (Reason.GPU_UNHEALTHY, Reason.GPU_HEALTHY, Reason.NRI_FALLBACK_TO_EAGER):
            record.recorder.record_node(EventType.WARNING, reason, "m")
            written = await record.events("default")
    assert [e["reason"] for e in written] == ["NRIFallbackToEager"]
    assert record.recorder.stats == {EventResult.FAILED: 2, EventResult.SENT: 1}
    [line] = [r.getMessage() for r in caplog.records]  # the second 403 is not logged again
    assert "cannot create Event Warning GPUUnhealthy on Node default/node-a: events is forbidden" in line


async def test_an_unreachable_server_fails_a_patch_too() -> None:
    record, _ = make()
    async with recording(record):
        record.recorder.record(POD, EventType.WARNING, Reason.VGPU_CLAIM_REFUSED, "m")
        await record.events()
        record.kube.fail_next("patch_event", KubeError("API server unreachable", 0))
        record.recorder.record(POD, EventType.WARNING, Reason.VGPU_CLAIM_REFUSED, "m")
        assert [e["count"] for e in await record.events("ml")] == [1]
    assert record.recorder.stats == {EventResult.SENT: 1, EventResult.FAILED: 1}


async def test_a_long_message_is_cut() -> None:
    record, _ = make()
    async with recording(record):
        record.recorder.record(POD, EventType.WARNING, Reason.VGPU_NOT_INJECTED, "x" * 5000)
        [event] = await record.events("ml")
    assert len(event["message"]) == MESSAGE_MAX and event["message"].endswith("...")


async def test_an_event_about_no_object_is_dropped_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    """A hook whose runtime named no pod goes on: the Event is dropped, counted and logged once."""
    record, _ = make()
    caplog.set_level(logging.WARNING, logger="vgpud.events")
    for _ in range(2):
        record.recorder.record(pod_ref("", "", ""), EventType.WARNING, Reason.VGPU_CONTAINER_REFUSED, "m")
    assert record.recorder.stats == {EventResult.DROPPED: 2}
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("events: not written: an Event needs its object's kind and name"), line
