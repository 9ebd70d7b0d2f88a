"""The health watcher against a scripted NVML (tests.unit.gpu.healthshim) under a MockClock: when a GPU
turns unhealthy and healthy again, what is ignored, and how a failing NVML is supervised.

The shim's event wait blocks in real time in the watcher's worker thread, so the clock jumps (autojump
threshold 10 ms) while the watcher waits, as the Trio timers need."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from tests.draharness import GPUS
from tests.events import NODE, recording
from tests.unit.gpu.healthshim import ScriptedNvml
from vgpud.componenthealth import HealthRegistry, HealthState
from vgpud.gpu.health import HealthBoard
from vgpud.gpu.healthrules import APPLICATION_XIDS
from vgpud.gpu.healthwatch import HealthRules, HealthWatcher
from vgpud.gpu.model import GpuInventoryError
from vgpud.kube.events import EventSink
from vgpud.supervisor import Backoff, HealthAfter, Restart, Supervisor

U0, U1 = GPUS[0].uuid, GPUS[1].uuid
RECOVERY = 60
RULES = HealthRules(frozenset(APPLICATION_XIDS), recovery_seconds=RECOVERY, check_interval=5, wait_ms=50)
WALL0 = 1_700_000_000.0


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Each test takes it as an argument: pytest-trio runs a test under a Clock among its arguments."""
    return trio.testing.MockClock(autojump_threshold=0.01)


class Run:
    def __init__(self, shim: ScriptedNvml, watcher: HealthWatcher) -> None:
        self.shim, self.watcher, self.board = shim, watcher, watcher.board

    async def change(self) -> float:
        """Wait for the board's next change; when it came (Trio time)."""
        with trio.fail_after(3600):
            await self.board.wait_changed(self.board.version)
        return trio.current_time()


def make(
    shim: ScriptedNvml | None = None, rules: HealthRules = RULES, events: EventSink | None = None
) -> Run:
    shim = shim or ScriptedNvml(len(GPUS))
    board = HealthBoard((g.uuid for g in GPUS), clock=lambda: WALL0)
    watcher = HealthWatcher(
        board, GPUS, lambda: shim, rules, wall=lambda: WALL0 + trio.current_time(), events=events
    )
    return Run(shim, watcher)


@pytest.fixture
async def run() -> AsyncIterator[Run]:
    r = make()
    async with trio.open_nursery() as nursery:
        ready = trio.Event()
        nursery.start_soon(r.watcher.run, ready.set)
        await ready.wait()
        yield r
        nursery.cancel_scope.cancel()
    assert r.shim.closed == 1  # the session is closed on cancellation


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "vgpud.gpu" in r.name]


async def test_a_fatal_xid_marks_the_gpu_unhealthy_until_the_recovery_wait_is_over(
    run: Run, caplog: pytest.LogCaptureFixture, clock: trio.testing.MockClock
) -> None:
    caplog.set_level(logging.INFO)
    start = trio.current_time()
    run.shim.xid(0, 79)
    sick_at = await run.change()
    assert sick_at - start < 1  # the event, not a periodic check
    health = run.board.snapshot()[U0]
    assert (health.healthy, health.reason, health.xid) == (False, "XID 79 (GPU has fallen off the bus)", 79)
    assert health.since == pytest.approx(WALL0 + sick_at)
    assert run.board.snapshot()[U1].healthy
    healed_at = await run.change()
    assert RECOVERY <= healed_at - sick_at < RECOVERY + 0.5  # at the deadline, not the next 5 s check
    assert run.board.snapshot()[U0].healthy and run.board.snapshot()[U0].xid is None
    marked = "for the scheduler and the kubelet"
    assert messages(caplog) == [
        f"{U0} (0) unhealthy: XID 79 (GPU has fallen off the bus): marked unhealthy {marked}",
        f"{U0} (0) healthy again: it answers NVML and had no fatal XID or failed check for 60s: "
        f"marked healthy {marked}",
    ]
    assert [r.__dict__.get("gpu") for r in caplog.records if "healthy" in r.getMessage()] == [U0, U0]


async def test_a_change_of_health_is_an_event_on_the_node(clock: trio.testing.MockClock) -> None:
    async with recording() as record, trio.open_nursery() as nursery:
        r = make(events=record.recorder)
        await nursery.start(_run, r.watcher)
        r.shim.xid(0, 79)
        await r.change()
        [sick] = await record.events("default")
        await r.change()
        healthy = await record.events("default", "GPUHealthy")
        nursery.cancel_scope.cancel()
    assert sick["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE}
    marked = "for the scheduler and the kubelet"
    assert (sick["type"], sick["reason"], sick["message"]) == (
        "Warning",
        "GPUUnhealthy",
        f"GPU 0 ({U0}) unhealthy: XID 79 (GPU has fallen off the bus): marked unhealthy {marked}",
    )
    assert [(e["type"], e["message"]) for e in healthy] == [
        (
            "Normal",
            f"GPU 0 ({U0}) healthy again: it answers NVML and had no fatal XID or failed check for 60s: "
            f"marked healthy {marked}",
        )
    ]


async def test_another_fatal_xid_restarts_the_wait_and_keeps_the_first_cause(
    run: Run, clock: trio.testing.MockClock
) -> None:
    run.shim.xid(1, 94)
    sick_at = await run.change()
    await trio.sleep(30)
    run.shim.xid(1, 48)
    healed_at = await run.change()  # the second XID changed nothing on the board
    assert RECOVERY + 30 <= healed_at - sick_at < RECOVERY + 31
    assert run.watcher.stats.xids == {(U1, 94, "fatal"): 1, (U1, 48, "fatal"): 1}


async def test_ignored_xids_are_counted_and_change_nothing(run: Run, clock: trio.testing.MockClock) -> None:
    run.shim.xid(0, 13)
    run.shim.xid(1, 31)
    run.shim.xid(1, 13)
    run.shim.xid(0, 119)  # events are handled in order: the three before it are done by then
    await run.change()
    assert run.board.version == 1
    assert {u for u, h in run.board.snapshot().items() if not h.healthy} == {U0}
    assert run.board.snapshot()[U0].reason == "XID 119 (GSP RPC timeout)"
    assert run.watcher.stats.xids == {
        (U0, 13, "ignored"): 1,
        (U1, 31, "ignored"): 1,
        (U1, 13, "ignored"): 1,
        (U0, 119, "fatal"): 1,
    }


async def test_the_ignore_list_is_the_setting(clock: trio.testing.MockClock) -> None:
    r = make(rules=HealthRules(frozenset({79}), recovery_seconds=RECOVERY, wait_ms=50))
    async with trio.open_nursery() as nursery:
        await nursery.start(_run, r.watcher)
        r.shim.xid(0, 79)
        r.shim.xid(0, 13)  # an application XID by default, fatal with this list
        await r.change()
        assert r.board.snapshot()[U0].xid == 13
        assert r.watcher.stats.xids == {(U0, 79, "ignored"): 1, (U0, 13, "fatal"): 1}
        nursery.cancel_scope.cancel()


async def test_a_lost_gpu_is_unhealthy_at_once_and_back_a_recovery_wait_after_it_answers(
    run: Run, clock: trio.testing.MockClock
) -> None:
    lost_at = trio.current_time()
    run.shim.lose(1)
    sick_at = await run.change()
    assert sick_at - lost_at < 1  # the event wait's loss report checks at once
    health = run.board.snapshot()[U1]
    assert (health.healthy, health.reason, health.xid) == (
        False,
        "GPU lost: GPU is lost (NVML error 15)",
        None,
    )
    await trio.sleep(100)
    assert not run.board.snapshot()[U1].healthy and run.board.version == 1
    run.shim.restore(1)
    restored_at = trio.current_time()
    healed_at = await run.change()
    # the wait runs from the last failed check, at most one check interval before the restore
    assert RECOVERY - RULES.check_interval <= healed_at - restored_at <= RECOVERY + 0.5
    assert run.board.snapshot()[U1].healthy


async def test_a_gpu_lost_before_the_session_is_unhealthy_when_it_is_ready(
    clock: trio.testing.MockClock,
) -> None:
    r = make()
    r.shim.problems[0] = "registering XID events of GPU 0: GPU is lost (NVML error 15)"
    async with trio.open_nursery() as nursery:
        await nursery.start(_run, r.watcher)
        assert (
            r.board.snapshot()[U0].reason
            == "GPU lost: registering XID events of GPU 0: GPU is lost (NVML error 15)"
        )
        nursery.cancel_scope.cancel()


async def test_a_failing_nvml_backs_off_is_reported_and_never_touches_the_board(
    clock: trio.testing.MockClock,
) -> None:
    r = make()
    r.shim.open_errors = [GpuInventoryError("nvmlInitWithFlags failed: Driver Not Loaded")] * 5
    health = HealthRegistry()
    policies = (Restart(Backoff(initial=1, factor=2, cap=30), healthy_after=30), HealthAfter(grace=10))
    states: list[tuple[float, HealthState, str]] = []
    start = trio.current_time()
    async with Supervisor(health=health) as supervisor:
        supervisor.supervise("device-health", r.watcher.run, *policies, counts_for_health=False)
        while health.get("device-health").state is not HealthState.HEALTHY:
            entry = health.get("device-health")
            states.append((trio.current_time() - start, entry.state, entry.reason))
            await health.wait_changed()
        ready_at = trio.current_time() - start
        # the session dies under it: closed, restarted after the first backoff step, board untouched
        r.shim.xid(0, 79)
        await r.change()
        r.shim.break_wait()
        while health.get("device-health").state is not HealthState.FAILING:  # flapped: at once
            await health.wait_changed()
        while health.get("device-health").state is not HealthState.HEALTHY:  # the next session
            await health.wait_changed()
        supervisor.cancel()
    failing = [(t, reason) for t, state, reason in states if state is HealthState.FAILING]
    assert failing and failing[0][0] == pytest.approx(10, abs=0.1)  # the grace period
    assert "Driver Not Loaded" in failing[0][1]
    assert ready_at == pytest.approx(1 + 2 + 4 + 8 + 16, abs=0.5)  # five failures backed off
    assert r.shim.opened == 7 and r.shim.closed == 2
    assert r.board.snapshot()[U0].reason.startswith("XID 79")  # a new session keeps what was decided


async def test_a_check_that_fails_ends_the_session_with_the_nvml_error(clock: trio.testing.MockClock) -> None:
    r = make()
    r.shim.check_error = GpuInventoryError("nvmlDeviceGetMemoryInfo failed: Unknown Error")
    ready = trio.Event()
    with pytest.raises(GpuInventoryError, match="Unknown Error"), trio.fail_after(60):
        await r.watcher.run(ready.set)  # the NVML error itself, not a group: the log and reason name it
    assert ready.is_set() and r.shim.closed == 1
    assert r.board.version == 0


async def _run(watcher: HealthWatcher, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    await watcher.run(task_status.started)
