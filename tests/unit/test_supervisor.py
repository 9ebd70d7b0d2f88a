"""Supervisor under MockClock: every assertion is on exact virtual times."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import pairwise

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from vgpud.componenthealth import ComponentHealth, HealthRegistry, HealthState
from vgpud.supervisor import (
    Backoff,
    HealthAfter,
    Ready,
    Restart,
    Supervisor,
    describe,
    split_failure,
)

HEALTHY, FAILING, STARTING, STOPPED = (
    HealthState.HEALTHY,
    HealthState.FAILING,
    HealthState.STARTING,
    HealthState.STOPPED,
)


@dataclass(frozen=True)
class Step:
    """One session of a scripted component: ready after `ready_after` s (None: never), end at `lives`."""

    ready_after: float | None = None
    lives: float = 0.0
    end: str = "fail"  # "fail" | "return" | "hang"


class Scripted:
    """A component whose n-th session follows steps[n] (the last step repeats); it records what
    happened to it."""

    def __init__(self, *steps: Step, cleanup: float = 0.0) -> None:
        self.steps = steps or (Step(),)
        self.cleanup = cleanup
        self.starts: list[float] = []
        self.cancelled = 0
        self.closed: list[float] = []

    async def __call__(self, ready: Ready) -> None:
        step = self.steps[min(len(self.starts), len(self.steps) - 1)]
        self.starts.append(trio.current_time())
        try:
            if step.ready_after is not None:
                await trio.sleep(step.ready_after)
                ready()
            await trio.sleep(max(0.0, step.lives - (step.ready_after or 0.0)))
            if step.end == "hang":
                await trio.sleep_forever()
            if step.end == "fail":
                raise OSError("socket gone")
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            # The component contract: bounded, shielded cleanup.
            with trio.CancelScope(shield=True):
                await trio.sleep(self.cleanup)
            self.closed.append(trio.current_time())


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in pairwise(times)]


# --- Backoff: a pure function ----------------------------------------------------------------------


def test_default_backoff_doubles_to_cap() -> None:
    assert [Backoff().delay(n) for n in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert Backoff(initial=0.5, factor=3, cap=10).delay(2) == 4.5
    assert Backoff().delay(100_000) == 30  # float overflow is the cap, not an error


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": -1}, {"factor": 0.5}, {"initial": 40}, {"cap": float("inf")}, {"factor": float("nan")}],
)
def test_backoff_rejects_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)


def test_backoff_rejects_negative_attempt() -> None:
    with pytest.raises(ValueError):
        Backoff().delay(-1)


@given(
    initial=st.floats(0, 100),
    factor=st.floats(1, 10),
    extra=st.floats(0, 1000),
    attempt=st.integers(0, 5000),
)
def test_backoff_is_bounded_and_non_decreasing(
    initial: float, factor: float, extra: float, attempt: int
) -> None:
    backoff = Backoff(initial=initial, factor=factor, cap=initial + extra)
    delay, following = backoff.delay(attempt), backoff.delay(attempt + 1)
    assert initial <= delay <= backoff.cap
    assert delay <= following
    assert backoff.delay(0) == initial


# --- Restart ---------------------------------------------------------------------------------------


async def test_backoff_sequence_and_cap_between_session_starts(autojump_clock: trio.abc.Clock) -> None:
    comp = Scripted(Step())
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("nri", comp, Restart())
        await trio.sleep(91.5)
        sup.cancel()
    assert comp.starts == [t0 + t for t in (0, 1, 3, 7, 15, 31, 61, 91)]
    assert gaps(comp.starts) == [1, 2, 4, 8, 16, 30, 30]


@pytest.mark.parametrize(
    ("long_session", "next_gaps"),
    [
        (Step(ready_after=0, lives=30), [30 + 1, 2, 4]),  # lived exactly healthy_after: reset
        (Step(lives=30), [30 + 1, 2, 4]),  # the backoff reset needs only the session's length
        (Step(ready_after=0, lives=29.5), [29.5 + 8, 16, 30]),  # just short of it: no reset
    ],
)
async def test_backoff_resets_only_after_a_session_of_healthy_after(
    autojump_clock: trio.abc.Clock, long_session: Step, next_gaps: list[float]
) -> None:
    comp = Scripted(Step(), Step(), Step(), long_session, Step())
    async with Supervisor() as sup:
        sup.supervise("dra", comp, Restart(Backoff(), healthy_after=30))
        await trio.sleep(120)
        sup.cancel()
    assert gaps(comp.starts)[:6] == [1, 2, 4, *next_gaps]


async def test_reconnect_never_stops(autojump_clock: trio.abc.Clock) -> None:
    comp = Scripted(Step())
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("nri", comp, Restart(), HealthAfter())
        await trio.sleep(3600)
        assert sup.health.get("nri").state is FAILING
        sup.cancel()
    # Starts at 0, 1, 3, 7, 15, then every 30 s from 31 up to 3571.
    assert len(comp.starts) == 5 + 119
    assert comp.starts[-1] == t0 + 3571
    assert set(gaps(comp.starts)[5:]) == {30}


class Waker:
    """A `Restart.wake` that returns when the test calls `fire()`; each return needs a new fire."""

    def __init__(self) -> None:
        self.fired = trio.Event()
        self.calls = 0

    def fire(self) -> None:
        self.fired.set()

    async def __call__(self) -> str:
        self.calls += 1
        await self.fired.wait()
        self.fired = trio.Event()
        return "the peer is back"


async def test_wake_ends_a_backoff_early_and_only_once_per_event(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    comp, waker = Scripted(Step()), Waker()
    t0 = trio.current_time()
    with caplog.at_level(logging.INFO, logger="vgpud.supervisor"):
        async with Supervisor() as sup:
            sup.supervise("nri", comp, Restart(Backoff(initial=10, cap=10), wake=waker), HealthAfter())
            await trio.sleep(3)
            waker.fire()  # mid-backoff: the next session starts now, not at 10 s
            await trio.sleep(30.5)
            sup.cancel()
    assert [t - t0 for t in comp.starts] == [0, 3, 13, 23, 33]  # no event: the backoff again
    assert waker.calls == 5  # one wait per backoff sleep, each after a failed session
    assert "component nri: restart 1 now, before its 10s backoff ended: the peer is back" in caplog.messages


async def test_wake_does_not_reset_the_backoff_or_the_health_window(autojump_clock: trio.abc.Clock) -> None:
    comp, waker = Scripted(Step()), Waker()
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("nri", comp, Restart(wake=waker), HealthAfter(grace=20))
        await trio.sleep(7.5)  # sessions at 0, 1, 3, 7: the backoff is now 8 s
        waker.fire()
        await trio.sleep(12.6)
        assert sup.health.get("nri").state is FAILING  # still failing: 20 s after the first failure
        await trio.sleep(4)
        sup.cancel()
    assert [t - t0 for t in comp.starts] == [0, 1, 3, 7, 7.5, 7.5 + 16]


async def test_a_wake_that_raises_costs_only_the_early_restart(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken() -> str:
        raise OSError("cannot stat")

    comp = Scripted(Step())
    t0 = trio.current_time()
    with caplog.at_level(logging.WARNING, logger="vgpud.supervisor"):
        async with Supervisor() as sup:
            sup.supervise("nri", comp, Restart(wake=broken))
            await trio.sleep(7.5)
            sup.cancel()
    assert [t - t0 for t in comp.starts] == [0, 1, 3, 7]
    assert "component nri: its restart wake failed: OSError: cannot stat" in caplog.messages


async def test_clean_return_stops_without_restart(autojump_clock: trio.abc.Clock) -> None:
    comp = Scripted(Step(ready_after=0, lives=5, end="return"))
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("webhook", comp, Restart())
    assert trio.current_time() == t0 + 5  # leaving `async with` waited for the tree
    assert comp.starts == [t0]
    assert sup.health.get("webhook") == ComponentHealth(STOPPED, "returned", t0 + 5)


async def test_clean_return_during_grace_is_never_reported_failing(autojump_clock: trio.abc.Clock) -> None:
    comp = Scripted(Step(), Step(end="return"))
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("webhook", comp, Restart(), HealthAfter(grace=180))
        await trio.sleep(500)
        assert sup.health.get("webhook") == ComponentHealth(STOPPED, "returned", t0 + 1)


async def test_failure_without_restart_is_final_and_immediately_failing(
    autojump_clock: trio.abc.Clock,
) -> None:
    bad = Scripted(Step(ready_after=0, lives=4))
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("registry", bad)
    assert trio.current_time() == t0 + 4
    assert bad.starts == [t0]
    assert sup.health.get("registry") == ComponentHealth(FAILING, "OSError: socket gone", t0 + 4)


async def test_final_failure_still_waits_for_its_grace(autojump_clock: trio.abc.Clock) -> None:
    bad = Scripted(Step(ready_after=0, lives=4))
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("registry", bad, HealthAfter(grace=60))
        await trio.sleep(63.5)
        assert sup.health.get("registry").state is HEALTHY
    # The tree lives until its grace timer has fired.
    assert trio.current_time() == t0 + 64
    assert bad.starts == [t0]
    assert sup.health.get("registry") == ComponentHealth(FAILING, "OSError: socket gone", t0 + 64)


# --- Health ----------------------------------------------------------------------------------------


async def test_health_flips_at_exactly_grace_even_in_backoff_and_back_on_ready(
    autojump_clock: trio.abc.Clock,
) -> None:
    # A stable session fails at 100 and opens the window; sessions then fail at once (starts 101,
    # 103, ..., 251, 281) until the one at 281 becomes ready. At 280 it sleeps in backoff.
    comp = Scripted(Step(ready_after=0, lives=100), *[Step()] * 9, Step(ready_after=0, end="hang"))
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("nri", comp, Restart(), HealthAfter(grace=180))
        await trio.sleep_until(t0 + 100 + 179.999)
        assert sup.health.get("nri").state is HEALTHY
        assert sup.health.get("nri").reason == "last failure: OSError: socket gone"
        assert sup.health.all_healthy()
        await trio.sleep_until(t0 + 280.5)
        assert sup.health.get("nri") == ComponentHealth(FAILING, "OSError: socket gone", t0 + 280)
        assert comp.starts[-1] == t0 + 251
        assert not sup.health.all_healthy()
        await trio.sleep_until(t0 + 300)
        assert sup.health.get("nri") == ComponentHealth(HEALTHY, "ready", t0 + 281)
        assert sup.health.all_healthy()
        sup.cancel()
    assert sup.health.get("nri").state is STOPPED


async def test_never_ready_component_goes_failing_after_grace(autojump_clock: trio.abc.Clock) -> None:
    comp = Scripted(Step())
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("nri", comp, Restart(), HealthAfter(grace=180))
        await trio.sleep_until(t0 + 179.999)
        assert sup.health.get("nri").state is STARTING
        await trio.sleep_until(t0 + 200)
        assert sup.health.get("nri").state is FAILING
        assert sup.health.get("nri").since == t0 + 180
        sup.cancel()


async def test_long_sessions_that_never_become_ready_do_not_close_the_window(
    autojump_clock: trio.abc.Clock,
) -> None:
    # Connecting hangs 60 s then fails, every time: long sessions, but not stable ones.
    comp = Scripted(Step(lives=60))
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("nri", comp, Restart(), HealthAfter(grace=180))
        await trio.sleep_until(t0 + 60 + 179.5)
        assert sup.health.get("nri").state is STARTING
        await trio.sleep_until(t0 + 300)
        assert sup.health.get("nri").state is FAILING
        assert sup.health.get("nri").since == t0 + 60 + 180
        sup.cancel()
    assert set(gaps(comp.starts)) == {61}  # each session lived >= healthy_after: backoff stays at 1 s


async def test_without_health_after_a_failure_is_failing_at_once(autojump_clock: trio.abc.Clock) -> None:
    comp = Scripted(Step(ready_after=0, lives=40), Step(ready_after=2, end="hang"))
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("dra", comp, Restart())
        await trio.sleep_until(t0 + 40.5)
        assert sup.health.get("dra") == ComponentHealth(FAILING, "OSError: socket gone", t0 + 40)
        await trio.sleep_until(t0 + 50)
        assert sup.health.get("dra") == ComponentHealth(HEALTHY, "ready", t0 + 43)
        sup.cancel()


async def test_ready_within_grace_prevents_the_flip(autojump_clock: trio.abc.Clock) -> None:
    comp = Scripted(Step(ready_after=0, lives=50), Step(ready_after=0, end="hang"))
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("nri", comp, Restart(), HealthAfter(grace=180))
        await trio.sleep(1000)
        assert sup.health.get("nri") == ComponentHealth(HEALTHY, "ready", t0 + 0)
        assert comp.starts == [t0, t0 + 51]
        sup.cancel()


async def test_flapping_component_goes_failing_at_once_after_grace(autojump_clock: trio.abc.Clock) -> None:
    # Stable session fails at 50 (window opens). Then every session is ready at once and fails after
    # 20 s, shorter than healthy_after, so the window stays open: sessions 51-71, 73-93, 97-117,
    # 125-145, 161-181, 211-231, 261-281. At 230 (50 + 180) the component is ready: no flip; its
    # failure at 231 is past the grace: FAILING at once; the next ready (261) restores HEALTHY.
    comp = Scripted(Step(ready_after=0, lives=50), Step(ready_after=0, lives=20))
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("nri", comp, Restart(), HealthAfter(grace=180))
        await trio.sleep_until(t0 + 230.5)
        assert comp.starts[-1] == t0 + 211
        assert sup.health.get("nri") == ComponentHealth(HEALTHY, "ready", t0)  # never left HEALTHY
        await trio.sleep_until(t0 + 232)
        assert sup.health.get("nri") == ComponentHealth(FAILING, "OSError: socket gone", t0 + 231)
        await trio.sleep_until(t0 + 262)
        assert sup.health.get("nri") == ComponentHealth(HEALTHY, "ready", t0 + 261)
        sup.cancel()
    assert gaps(comp.starts) == [51, 22, 24, 28, 36, 50, 50]


async def test_stable_session_closes_the_failure_window(autojump_clock: trio.abc.Clock) -> None:
    # Failure at 0 opens the window; the session at 1 is ready and lives 200 s (stable), so its
    # failure at 201 opens a new window: FAILING at 201 + 180 = 381, not at once.
    comp = Scripted(Step(), Step(ready_after=0, lives=200), Step())
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("nri", comp, Restart(), HealthAfter(grace=180))
        await trio.sleep_until(t0 + 380.5)
        assert sup.health.get("nri").state is HEALTHY
        await trio.sleep_until(t0 + 390)
        assert sup.health.get("nri").since == t0 + 381
        assert sup.health.get("nri").state is FAILING
        sup.cancel()


async def test_ready_of_an_ended_session_is_ignored(autojump_clock: trio.abc.Clock) -> None:
    leaked: list[Ready] = []

    async def leaky(ready: Ready) -> None:
        leaked.append(ready)
        raise OSError("no socket")

    async with Supervisor() as sup:
        sup.supervise("nri", leaky, Restart(), HealthAfter(grace=180))
        await trio.sleep(0.5)
        leaked[0]()
        assert sup.health.get("nri").state is STARTING
        sup.cancel()


# --- Isolation and shutdown ------------------------------------------------------------------------


async def test_failing_siblings_never_cancel_a_healthy_one(autojump_clock: trio.abc.Clock) -> None:
    good = Scripted(Step(ready_after=0, end="hang"))
    flapping = Scripted(Step())

    async def group_failure(ready: Ready) -> None:
        async def boom() -> None:
            raise ValueError("child task broke")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(boom)
            ready()
            await trio.sleep_forever()

    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("good", good, Restart(), HealthAfter())
        sup.supervise("flapping", flapping, Restart())
        sup.supervise("group", group_failure)
        await trio.sleep(3600)
        assert good.starts == [t0]
        assert good.cancelled == 0
        assert sup.health.get("good").state is HEALTHY
        assert sup.health.get("flapping").state is FAILING
        assert sup.health.get("group") == ComponentHealth(
            FAILING, "ExceptionGroup[ValueError: child task broke]", t0
        )
        sup.cancel()
    assert good.cancelled == 1


async def test_cancel_closes_every_tree_within_their_cleanup_bound(autojump_clock: trio.abc.Clock) -> None:
    serving = Scripted(Step(ready_after=0, end="hang"), cleanup=2)
    quick = Scripted(Step(ready_after=0, end="hang"), cleanup=1)
    in_backoff = Scripted(Step())
    t0 = trio.current_time()
    async with Supervisor(shutdown_timeout=10) as sup:
        sup.supervise("dra", serving, Restart())
        sup.supervise("registry", quick, Restart())
        sup.supervise("nri", in_backoff, Restart())
        await trio.sleep(5)  # nri sleeps in backoff from 3 to 7
        sup.cancel()
        sup.cancel()  # idempotent
        with pytest.raises(RuntimeError):
            sup.supervise("late", Scripted())
    assert trio.current_time() == t0 + 5 + 2
    assert serving.closed == [t0 + 7]
    assert quick.closed == [t0 + 6]
    assert in_backoff.starts == [t0, t0 + 1, t0 + 3]  # cancelled in its backoff sleep, at once
    assert (serving.cancelled, quick.cancelled, in_backoff.cancelled) == (1, 1, 0)
    assert {name: h.state for name, h in sup.health.snapshot().items()} == dict.fromkeys(
        ("dra", "registry", "nri"), STOPPED
    )


async def test_cancel_logs_components_still_closing_after_timeout(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    slow = Scripted(Step(ready_after=0, end="hang"), cleanup=15)
    fast = Scripted(Step(ready_after=0, end="hang"), cleanup=1)
    t0 = trio.current_time()
    with caplog.at_level(logging.INFO, logger="vgpud.supervisor"):
        async with Supervisor(shutdown_timeout=10) as sup:
            sup.supervise("slow", slow)
            sup.supervise("fast", fast)
            sup.cancel()
    assert trio.current_time() == t0 + 15  # the bound is the component's own
    closing = [r for r in caplog.records if "still closing" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in closing] == [
        (logging.ERROR, "components still closing 10s after cancel: slow")
    ]


async def test_cancel_logs_when_all_closed_in_time(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="vgpud.supervisor"):
        async with Supervisor(shutdown_timeout=10) as sup:
            sup.supervise("dra", Scripted(Step(ready_after=0, end="hang"), cleanup=3))
            sup.cancel()
    assert "all components closed 3s after cancel" in caplog.messages


async def test_outer_cancellation_closes_every_tree(autojump_clock: trio.abc.Clock) -> None:
    a = Scripted(Step(ready_after=0, end="hang"), cleanup=2)
    b = Scripted(Step(), cleanup=1)
    t0 = trio.current_time()
    with trio.move_on_after(10):  # a SIGTERM handler cancelling the scope around the supervisor
        async with Supervisor() as sup:
            sup.supervise("a", a, Restart())
            sup.supervise("b", b, Restart())
            await trio.sleep_forever()
    assert trio.current_time() == t0 + 12
    assert a.closed == [t0 + 12]
    assert sup.health.get("a").state is STOPPED
    assert sup.health.get("b").state is STOPPED


async def test_stop_closes_one_tree_only(autojump_clock: trio.abc.Clock) -> None:
    a = Scripted(Step(ready_after=0, end="hang"), cleanup=1)
    b = Scripted(Step(ready_after=0, end="hang"))
    t0 = trio.current_time()
    async with Supervisor() as sup:
        sup.supervise("a", a, Restart())
        sup.supervise("b", b, Restart())
        await trio.sleep(5)
        await sup.stop("a")
        assert trio.current_time() == t0 + 6
        assert sup.health.get("a") == ComponentHealth(STOPPED, "cancelled", t0 + 6)
        await trio.sleep(100)
        assert (a.starts, a.cancelled, b.cancelled) == ([t0], 1, 0)
        sup.supervise("a", a)  # a stopped name can be supervised again
        await trio.sleep(1)
        assert a.starts == [t0, t0 + 106]
        sup.cancel()


async def test_process_exit_propagates_and_cancels_siblings(autojump_clock: trio.abc.Clock) -> None:
    good = Scripted(Step(ready_after=0, end="hang"), cleanup=1)

    async def exits(ready: Ready) -> None:
        await trio.sleep(3)
        raise SystemExit(2)

    with pytest.raises(BaseExceptionGroup) as raised:
        async with Supervisor() as sup:
            sup.supervise("good", good, Restart())
            sup.supervise("exits", exits, Restart())
    assert raised.group_contains(SystemExit)
    assert good.cancelled == 1
    assert good.closed


async def _error_while_cancelled_in_child(ready: Ready) -> None:
    async def child() -> None:
        try:
            await trio.sleep_forever()
        finally:
            raise ValueError("cleanup broke")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(child)
        ready()
        await trio.sleep_forever()


async def _error_instead_of_cancelled(ready: Ready) -> None:
    ready()
    try:
        await trio.sleep_forever()
    except trio.Cancelled:
        raise ValueError("cleanup broke") from None


@pytest.mark.parametrize("run", [_error_while_cancelled_in_child, _error_instead_of_cancelled])
async def test_error_while_closing_is_logged_and_contained(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture, run: object
) -> None:
    with caplog.at_level(logging.WARNING, logger="vgpud.supervisor"):
        async with Supervisor() as sup:
            sup.supervise("nri", run, Restart())  # type: ignore[arg-type]
            await trio.sleep(1)
            sup.cancel()
    assert sup.health.get("nri").state is STOPPED
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("component nri failed after 1s session: ")
    assert "ValueError: cleanup broke" in warning
    assert warning.endswith("; while closing")


async def test_every_failure_is_logged_with_name_and_cause(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    comp = Scripted(Step(ready_after=0, lives=2.5), Step())
    with caplog.at_level(logging.DEBUG, logger="vgpud.supervisor"):
        async with Supervisor() as sup:
            sup.supervise("nri", comp, Restart())
            await trio.sleep(6)
            sup.cancel()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "component nri failed after 2.5s session: OSError: socket gone; restart 1 in 1s",
        "component nri failed after 0s session: OSError: socket gone; restart 2 in 2s",
        "component nri failed after 0s session: OSError: socket gone; restart 3 in 4s",
    ]
    tracebacks = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert len(tracebacks) == 3
    assert all(isinstance(r.exc_info[1], OSError) for r in tracebacks)  # type: ignore[index]
    health = [(r.levelno, r.getMessage()) for r in caplog.records if " is " in r.getMessage()]
    assert health == [
        (logging.INFO, "component nri is starting (-)"),
        (logging.INFO, "component nri is healthy (ready)"),
        (logging.ERROR, "component nri is failing (OSError: socket gone)"),
        (logging.INFO, "component nri is stopped (cancelled)"),
    ]


async def test_final_failure_log_says_not_restarting(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="vgpud.supervisor"):
        async with Supervisor() as sup:
            sup.supervise("webhook", Scripted(Step(lives=7)))
    assert (
        "component webhook failed after 7s session: OSError: socket gone; not restarting" in caplog.messages
    )


# --- API misuse, registry, helpers -----------------------------------------------------------------


async def test_supervise_rejects_misuse(autojump_clock: trio.abc.Clock) -> None:
    sup = Supervisor()
    with pytest.raises(RuntimeError):
        sup.supervise("a", Scripted())
    async with sup:
        sup.supervise("a", Scripted(Step(end="hang")))
        with pytest.raises(ValueError, match="already supervised"):
            sup.supervise("a", Scripted())
        with pytest.raises(ValueError, match="at most one Restart"):
            sup.supervise("b", Scripted(), Restart(), Restart())
        with pytest.raises(ValueError, match="at most one HealthAfter"):
            sup.supervise("b", Scripted(), HealthAfter(), HealthAfter())
        with pytest.raises(TypeError):
            sup.supervise("b", Scripted(), Backoff())  # type: ignore[arg-type]
        sup.cancel()
    with pytest.raises(RuntimeError):
        async with sup:
            pass
    with pytest.raises(ValueError):
        Restart(healthy_after=-1)
    with pytest.raises(ValueError):
        HealthAfter(grace=-1)


async def test_health_registry_semantics(autojump_clock: trio.abc.Clock) -> None:
    registry = HealthRegistry()
    assert registry.all_healthy()  # vacuously: nothing registered
    registry.register("dra")
    registry.register("nri", counts_for_health=False)
    assert not registry.all_healthy()  # STARTING is not healthy
    registry.set("dra", HEALTHY, "ready")
    assert registry.all_healthy()  # nri does not count
    await trio.sleep(5)
    registry.set("dra", HEALTHY, "still ready")
    assert registry.get("dra") == ComponentHealth(HEALTHY, "still ready", registry.get("dra").since)
    assert registry.get("dra").since == trio.current_time() - 5  # a reason change keeps `since`
    registry.set("probe", FAILING, "socket does not answer")  # unknown names count
    assert not registry.all_healthy()
    assert set(registry.snapshot()) == {"dra", "nri", "probe"}
    assert not registry.snapshot()["nri"].counts_for_health
    with pytest.raises(KeyError):
        registry.get("webhook")


async def test_health_registry_wakes_watchers_on_state_changes(autojump_clock: trio.abc.Clock) -> None:
    registry = HealthRegistry()
    registry.register("dra")
    woken: list[float] = []

    async def watch() -> None:
        await registry.wait_changed()
        woken.append(trio.current_time())

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        await trio.sleep(1)
        registry.set("dra", STARTING, "reason only")  # not a state change
        await trio.sleep(1)
        registry.set("dra", HEALTHY)
    assert woken == [t0 + 2]


def test_describe_and_split_failure() -> None:
    group = ExceptionGroup("x", [ValueError("a"), ExceptionGroup("y", [KeyError("b")])])
    assert describe(group) == "ExceptionGroup[ValueError: a; ExceptionGroup[KeyError: 'b']]"
    assert describe(OSError()) == "OSError"
    assert split_failure(group) == (group, None)
    error = OSError("x")
    assert split_failure(error) == (error, None)
    exiting = SystemExit(1)
    assert split_failure(exiting) == (None, exiting)
    mixed = BaseExceptionGroup("m", [ValueError("a"), KeyboardInterrupt()])
    failure, passthrough = split_failure(mixed)
    assert isinstance(failure, ExceptionGroup)
    assert [type(e) for e in failure.exceptions] == [ValueError]
    assert passthrough is not None
    assert [type(e) for e in passthrough.exceptions] == [KeyboardInterrupt]  # type: ignore[attr-defined]


def test_a_jittered_backoff_spreads_each_delay_up_to_its_fraction_longer() -> None:
    backoff = Backoff(jitter=0.5)
    assert backoff.delay(2) == 4  # no spread: the plain delay
    assert backoff.delay(2, 0.5) == 5 and backoff.delay(2, 0.999) < 6
    assert backoff.delay(10, 0.5) == 37.5  # the cap, then the jitter: capped nodes stay spread
    assert Backoff().delay(2, 0.9) == 4  # no jitter: the spread changes nothing
    with pytest.raises(ValueError, match="jitter"):
        Backoff(jitter=1.5)
