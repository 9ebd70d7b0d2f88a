"""The hook-call recorder: ring buffer, filters, fan-out, dropping slow subscribers, timed()."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from vgpud.recorder import CloseReason, HookCall, Outcome, Recorder, Subscription

HANG = 60  # virtual seconds: under the autojump clock a test that would hang fails at once


def ticks(start: float = 100.0, step: float = 1.0) -> Iterator[float]:
    value = start
    while True:
        yield value
        value += step


def fake_clock(start: float = 100.0, step: float = 1.0) -> Callable[[], float]:
    return ticks(start, step).__next__


def nri(call: str = "CreateContainer", **fields: object) -> HookCall:
    return HookCall(component="nri", call=call, **fields)  # type: ignore[arg-type]


def seqs(calls: list[HookCall]) -> list[int]:
    return [c.seq for c in calls]


class Collector:
    """Drains a subscription in a task; `received` and the close reason tell what happened."""

    def __init__(self, sub: Subscription) -> None:
        self.sub = sub
        self.received: list[HookCall] = []
        self.ended = False

    async def run(self) -> None:
        with trio.fail_after(HANG):
            async for call in self.sub:
                self.received.append(call)
        self.ended = True


async def drain(sub: Subscription) -> list[HookCall]:
    with trio.fail_after(HANG):
        return [call async for call in sub]


# --- Ring buffer and filters -----------------------------------------------------------------------


def test_ring_buffer_keeps_the_newest_in_order() -> None:
    recorder = Recorder(capacity=5, clock=fake_clock(100.0))
    stamped = [recorder.record(nri()) for _ in range(12)]
    assert seqs(stamped) == list(range(1, 13))
    assert [c.time for c in stamped[:3]] == [100.0, 101.0, 102.0]
    assert seqs(recorder.recent()) == [8, 9, 10, 11, 12]
    assert seqs(recorder.recent(2)) == [11, 12]
    assert recorder.recent(0) == []
    assert seqs(recorder.recent(50)) == [8, 9, 10, 11, 12]
    assert recorder.recent()[-1] == stamped[-1]


def test_record_stamps_seq_and_time_over_what_the_caller_set() -> None:
    recorder = Recorder(clock=fake_clock(7.0))
    assert recorder.record(nri(seq=99, time=1.0)).seq == 1
    assert recorder.recent()[0].time == 7.0


def test_recent_filters_on_fields_and_predicates() -> None:
    recorder = Recorder()
    recorder.record(nri(pod_uid="a", outcome="ok"))
    recorder.record(HookCall(component="dra", call="NodePrepareResources", claim_uid="c1"))
    recorder.record(nri(pod_uid="b", outcome="error", detail="boom"))
    recorder.record(nri("RemoveContainer", pod_uid="a"))
    recorder.record(HookCall(component="dra", call="NodeUnprepareResources", claim_uid="c1", outcome="error"))
    assert seqs(recorder.recent(component="nri")) == [1, 3, 4]
    assert seqs(recorder.recent(outcome="error")) == [3, 5]
    assert seqs(recorder.recent(outcome=Outcome.ERROR, component="dra")) == [5]
    assert seqs(recorder.recent(1, component="nri", pod_uid="a")) == [4]
    assert seqs(recorder.recent(claim_uid="c1")) == [2, 5]
    assert seqs(recorder.recent(where=lambda c: c.call.startswith("Node"))) == [2, 5]
    assert recorder.recent(component="webhook") == []
    with pytest.raises(TypeError, match="latency_seconds"):
        recorder.recent(latency_seconds=0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        recorder.recent(-1)


def test_hook_call_is_json_ready_and_rejects_unknown_outcomes() -> None:
    call = Recorder(clock=fake_clock(1700000000.5)).record(
        nri(
            pod_namespace="ns",
            pod_name="p",
            pod_uid="u",
            container="c",
            outcome="skipped",
            latency_seconds=0.25,
        )
    )
    data = call.to_dict()
    assert data == {
        "seq": 1,
        "time": 1700000000.5,
        "component": "nri",
        "call": "CreateContainer",
        "pod_namespace": "ns",
        "pod_name": "p",
        "pod_uid": "u",
        "container": "c",
        "claim_uid": "",
        "outcome": "skipped",
        "detail": "",
        "latency_seconds": 0.25,
    }
    assert type(data["outcome"]) is str
    assert json.loads(json.dumps(data)) == data
    assert call.outcome is Outcome.SKIPPED
    with pytest.raises(ValueError):
        nri(outcome="skiped")


def test_recorder_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        Recorder(capacity=0)
    with pytest.raises(ValueError):
        Recorder(subscriber_buffer=0)
    with pytest.raises(ValueError):
        Recorder().subscribe(buffer=0)


# --- Subscribers -----------------------------------------------------------------------------------


async def test_three_subscribers_receive_every_call_in_order(autojump_clock: trio.abc.Clock) -> None:
    recorder = Recorder(capacity=10, subscriber_buffer=64)
    collectors = [Collector(recorder.subscribe()) for _ in range(3)]
    async with trio.open_nursery() as nursery:
        for collector in collectors:
            nursery.start_soon(collector.run)
        for batch in range(10):
            for i in range(50):
                recorder.record(nri(container=f"c{batch * 50 + i}"))
            await wait_all_tasks_blocked()
        recorder.close()
    for collector in collectors:
        assert seqs(collector.received) == list(range(1, 501))
        assert collector.received[-1].container == "c499"
        assert collector.ended
        assert collector.sub.close_reason is CloseReason.RECORDER_CLOSED
        assert not collector.sub.dropped


async def test_stalled_subscriber_is_dropped_while_others_keep_receiving(
    autojump_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder(subscriber_buffer=8)
    stalled = recorder.subscribe()
    live = [Collector(recorder.subscribe()) for _ in range(2)]
    async with trio.open_nursery() as nursery:
        for collector in live:
            nursery.start_soon(collector.run)
        for i in range(80):  # ten times the buffer, in bursts the live subscribers keep up with
            recorder.record(nri())
            if i % 4 == 3:
                await wait_all_tasks_blocked()
        assert stalled.close_reason is CloseReason.SLOW
        assert stalled.dropped
        assert all(c.sub.close_reason is None for c in live)
        recorder.close()
    for collector in live:
        assert seqs(collector.received) == list(range(1, 81))
    # The dropped one still yields what it had buffered, an unbroken run, then ends.
    assert seqs(await drain(stalled)) == list(range(1, 9))
    stalled.close()  # what leaving `async with` does in the websocket handler
    assert stalled.close_reason is CloseReason.SLOW  # the first reason wins
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["dropping a slow hook-call subscriber at call 9"]


async def test_record_never_waits_on_a_stalled_subscriber(autojump_clock: trio.abc.Clock) -> None:
    recorder = Recorder(capacity=100, subscriber_buffer=256)
    stalled = recorder.subscribe()
    for _ in range(2560):  # a tight loop: nobody else runs, nothing drains
        recorder.record(nri())
    assert seqs(recorder.recent()) == list(range(2461, 2561))
    assert stalled.close_reason is CloseReason.SLOW
    assert seqs(await drain(stalled)) == list(range(1, 257))


async def test_subscription_filters_and_a_failing_filter_is_dropped(autojump_clock: trio.abc.Clock) -> None:
    recorder = Recorder()

    def broken(call: HookCall) -> bool:
        if call.seq == 2:
            raise RuntimeError("bad filter")
        return True

    only_dra = recorder.subscribe(component="dra")
    errors = recorder.subscribe(where=lambda c: c.outcome == "error", buffer=2)
    faulty = recorder.subscribe(where=broken)
    recorder.record(nri())
    recorder.record(HookCall(component="dra", call="NodePrepareResources", outcome="error"))
    recorder.record(nri(outcome="error"))
    recorder.close()
    assert seqs(await drain(only_dra)) == [2]
    assert seqs(await drain(errors)) == [2, 3]
    assert seqs(await drain(faulty)) == [1]
    assert faulty.close_reason is CloseReason.FILTER_FAILED
    assert faulty.dropped
    assert only_dra.close_reason is CloseReason.RECORDER_CLOSED
    with pytest.raises(TypeError):
        recorder.subscribe(latency_seconds=1.0)  # type: ignore[arg-type]


async def test_close_ends_waiting_subscribers_and_later_subscriptions(autojump_clock: trio.abc.Clock) -> None:
    recorder = Recorder()
    waiting = Collector(recorder.subscribe())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting.run)
        await wait_all_tasks_blocked()
        recorder.record(nri())
        recorder.close()
    assert seqs(waiting.received) == [1]
    assert waiting.ended
    late = recorder.subscribe()
    assert late.close_reason is CloseReason.RECORDER_CLOSED
    assert await drain(late) == []
    recorder.record(nri())  # the ring buffer still works after close
    assert seqs(recorder.recent()) == [1, 2]


async def test_unsubscribing_ends_iteration_and_stops_delivery(autojump_clock: trio.abc.Clock) -> None:
    recorder = Recorder()
    async with recorder.subscribe() as sub:
        recorder.record(nri())
        recorder.record(nri())
        assert (await sub.__anext__()).seq == 1
    # Leaving discards what was still buffered (call 2) and nothing new arrives.
    assert sub.close_reason is CloseReason.UNSUBSCRIBED
    assert not sub.dropped
    recorder.record(nri())
    assert await drain(sub) == []

    blocked = Collector(recorder.subscribe())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocked.run)
        await wait_all_tasks_blocked()
        blocked.sub.close()  # from another task, while it waits
    assert blocked.ended
    assert blocked.received == []


# --- timed() ---------------------------------------------------------------------------------------


def test_timed_records_ok_with_latency() -> None:
    recorder = Recorder(clock=fake_clock(), timer=fake_clock(10.0, 0.125))
    with recorder.timed("nri", "CreateContainer", pod_uid="u1", container="main") as call:
        pass
    assert call.recorded == recorder.recent()[-1]
    assert call.recorded is not None
    assert (call.recorded.outcome, call.recorded.latency_seconds) == (Outcome.OK, 0.125)
    assert (call.recorded.pod_uid, call.recorded.container, call.recorded.detail) == ("u1", "main", "")


def test_timed_keeps_the_outcome_and_identity_the_hook_set() -> None:
    recorder = Recorder()
    with recorder.timed("nri", "CreateContainer", pod_uid="u1") as call:
        call.update(container="sidecar", claim_uid="c9")
        call.outcome = "skipped"
        call.detail = "not a vGPU container"
    [recorded] = recorder.recent()
    assert recorded.outcome is Outcome.SKIPPED
    assert (recorded.pod_uid, recorded.container, recorded.claim_uid) == ("u1", "sidecar", "c9")
    assert recorded.detail == "not a vGPU container"


def test_timed_records_an_error_and_reraises() -> None:
    recorder = Recorder(timer=fake_clock(0.0, 2.0))
    with (
        pytest.raises(OSError, match="disk full"),
        recorder.timed("dra", "NodePrepareResources", claim_uid="c"),
    ):
        raise OSError("disk full")
    with pytest.raises(KeyError), recorder.timed("registry", "Register"):
        raise KeyError()
    error, bare = recorder.recent()
    assert (error.outcome, error.detail, error.latency_seconds, error.claim_uid) == (
        Outcome.ERROR,
        "disk full",
        2.0,
        "c",
    )
    assert (bare.outcome, bare.detail) == (Outcome.ERROR, "KeyError")


def test_timed_error_keeps_a_rejection_the_hook_chose() -> None:
    recorder = Recorder()
    with pytest.raises(PermissionError), recorder.timed("nri", "CreateContainer") as call:
        call.outcome = Outcome.REJECTED
        raise PermissionError("cannot create the container directory")
    [recorded] = recorder.recent()
    assert (recorded.outcome, recorded.detail) == (Outcome.REJECTED, "cannot create the container directory")


async def test_timed_works_around_awaits_and_records_cancellation(autojump_clock: trio.abc.Clock) -> None:
    recorder = Recorder()
    with recorder.timed("nri", "Synchronize"):
        await trio.sleep(1)
    with trio.move_on_after(5), recorder.timed("nri", "CreateContainer"):
        await trio.sleep_forever()
    done, cancelled = recorder.recent()
    assert done.outcome is Outcome.OK
    assert cancelled.outcome is Outcome.CANCELLED
    assert "cancel" in cancelled.detail.lower()  # trio's message, e.g. "cancelled due to deadline"


# --- Listeners and counts --------------------------------------------------------------------------


async def test_listeners_see_every_call_before_subscribers_and_counts(autojump_clock: trio.abc.Clock) -> None:
    recorder = Recorder(capacity=2)
    seen: list[tuple[int, int]] = []
    sub = recorder.subscribe(buffer=1)
    recorder.add_listener(lambda call: seen.append((call.seq, recorder.subscribers)))
    assert (recorder.last_seq, recorder.subscribers) == (0, 1)
    for _ in range(3):
        recorder.record(nri())
    # the subscriber was dropped at call 2 (buffer 1); the listener saw all three, stamped
    assert seen == [(1, 1), (2, 1), (3, 0)]
    assert (recorder.last_seq, recorder.subscribers) == (3, 0)
    assert sub.close_reason is CloseReason.SLOW
