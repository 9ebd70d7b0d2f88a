"""Supervisor: one Trio nursery owning named component task trees (DESIGN.md §4).

Two-tier failure model: a component *restarts* quickly (reconnect never stops), while its *health*
only turns FAILING after failure has lasted a grace period, so a kubelet/containerd restart does not
make the node daemon unhealthy but a component that stays broken does.

Contract for a component, ``run(ready)``:

- One call is one *session*. Returning means a clean stop: the component becomes STOPPED and is not
  restarted. Raising means failure. ``ready()`` is called once the component serves (sockets bound,
  NRI registered...); it turns health HEALTHY. ``ready`` of an ended session does nothing.
- Cleanup on cancellation happens in the component's own ``finally``, shielded and bounded:
  ``with trio.move_on_after(5, shield=True): await server.close()``. The supervisor cannot force a
  shielded task, so the shutdown bound is the components' own; ``shutdown_timeout`` only decides when
  the supervisor logs the components still closing.

Policies (at most one of each per component):

- ``Restart(backoff, healthy_after)``: after a failure, sleep ``backoff.delay(attempt)`` and run again,
  forever. ``attempt`` resets to 0 when the failed session had lived >= ``healthy_after`` (measured from
  its start). Without Restart a failure is final for that component. ``Restart(wake=...)`` may end a
  backoff early: ``wake()`` is awaited during each backoff sleep and, when it returns (a reason, e.g.
  "the peer's socket is new"), the next session starts at once. It must return only on an event that
  happens once per change of the outside world, never on a condition that stays true, so a failing
  component cannot loop without its backoff.
- ``HealthAfter(grace)``: health flips to FAILING when the *failure window* has lasted ``grace`` seconds
  and the component is not ready at that moment. A timer does it, so the flip happens at exactly
  ``window start + grace`` even while the component sleeps in backoff. Without HealthAfter, grace is 0:
  a failure flips health to FAILING at once.
- The failure window opens at the first failure after a *stable* session: one that called ``ready()``
  and lived >= ``healthy_after`` (any ready session when there is no Restart). ``ready()`` restores
  HEALTHY and stops the pending flip, but does not close the window: a component that flaps (ready,
  then fails before it is stable) goes FAILING at once on a failure that comes after the grace period.
  Otherwise a component that binds and then dies every few seconds would never be reported.
- During the grace period the state stays what it was (STARTING or HEALTHY); the reason names the last
  failure.

Errors: every failure is logged at WARNING on ``vgpud.supervisor`` (component, exception type and
message, session length, next retry) with the traceback at DEBUG; health changes are logged at INFO,
or ERROR for FAILING. Any ``Exception``, including an ``ExceptionGroup`` from the component's own
nurseries, stays inside the component. ``trio.Cancelled`` propagates as usual (a group that mixes
Cancelled with errors: the errors are logged, the Cancelled part propagates). Other BaseExceptions
(KeyboardInterrupt, SystemExit) mean "stop the process": they propagate, so the supervisor nursery
cancels every tree and re-raises them from ``async with``.

Shutdown: ``cancel()`` cancels the root scope (every tree and the ``async with`` body), and an
``async with`` body that raises or is cancelled from outside does the same. Leaving ``async with``
normally waits for the components.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType

import trio

from vgpud.componenthealth import HealthRegistry, HealthState
from vgpud.ready import Ready

logger = logging.getLogger("vgpud.supervisor")

ComponentRun = Callable[[Ready], Awaitable[None]]


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class Backoff:
    """Exponential delay between restarts: ``initial * factor**attempt``, at most ``cap``, then up to
    ``jitter`` of it longer at random (client-go's jittered backoff): the nodes of a DaemonSet that
    lost the API server together do not all call it again in the same instant."""

    initial: float = 1.0
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        _check(all(map(math.isfinite, (self.initial, self.factor, self.cap))), f"{self} must be finite")
        _check(0 <= self.initial <= self.cap, f"{self}: need 0 <= initial <= cap")
        _check(self.factor >= 1, f"{self}: need factor >= 1")
        _check(0 <= self.jitter <= 1, f"{self}: need 0 <= jitter <= 1")

    def delay(self, attempt: int, spread: float = 0.0) -> float:
        """Delay before restart number ``attempt`` (0-based), ``spread`` (in [0, 1), the caller's
        random number) of the way into its jitter; pure."""
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {attempt}")
        try:
            raw = min(self.initial * float(self.factor) ** attempt, self.cap)
        except OverflowError:
            raw = self.cap
        return raw * (1 + self.jitter * spread)


Wake = Callable[[], Awaitable[str]]


@dataclass(frozen=True)
class Restart:
    """Restart after every failure with ``backoff``; a session of ``healthy_after`` s resets it, and
    ``wake`` (if any) may end a backoff sleep early with its reason."""

    backoff: Backoff = Backoff()
    healthy_after: float = 30.0
    wake: Wake | None = None

    def __post_init__(self) -> None:
        _check(self.healthy_after >= 0, f"{self}: healthy_after must be >= 0")


@dataclass(frozen=True)
class HealthAfter:
    """Report FAILING only after ``grace`` seconds of continuous failure."""

    grace: float = 180.0

    def __post_init__(self) -> None:
        _check(self.grace >= 0, f"{self}: grace must be >= 0")


Policy = Restart | HealthAfter


@dataclass(frozen=True)
class _Plan:
    """The policies of one component, resolved."""

    restart: Restart | None = None
    grace: float = 0.0

    @classmethod
    def of(cls, policies: Iterable[Policy]) -> _Plan:
        restart: Restart | None = None
        health: HealthAfter | None = None
        for policy in policies:
            if isinstance(policy, Restart):
                _check(restart is None, "at most one Restart policy")
                restart = policy
            elif isinstance(policy, HealthAfter):
                _check(health is None, "at most one HealthAfter policy")
                health = policy
            else:
                raise TypeError(f"not a supervision policy: {policy!r}")
        return cls(restart, health.grace if health else 0.0)

    @property
    def stable_after(self) -> float:
        return self.restart.healthy_after if self.restart else 0.0


def describe(exc: BaseException) -> str:
    """``Type: message`` for logs and health reasons; groups list their leaves."""
    if isinstance(exc, BaseExceptionGroup):
        return f"{type(exc).__name__}[{'; '.join(map(describe, exc.exceptions))}]"
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def split_failure(exc: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """Split what a session raised into (failure the supervisor handles, exception that propagates).

    Exceptions are failures; Cancelled, KeyboardInterrupt, SystemExit... propagate; a group is split.
    """
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(Exception)
    if isinstance(exc, Exception):
        return exc, None
    return None, exc


@dataclass(eq=False)
class _Component:
    name: str
    run: ComponentRun
    plan: _Plan
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)


class _Tracker:
    """Per-component session bookkeeping: backoff attempt, failure window, grace timer."""

    def __init__(self, comp: _Component, health: HealthRegistry, timers: trio.Nursery) -> None:
        self.comp = comp
        self.health = health
        self.timers = timers
        self.attempt = 0
        self.window_start: float | None = None
        self.session = 0
        self.live = False
        self.started = 0.0
        self.ready_at: float | None = None
        self.last_failure = ""
        self.flip: trio.CancelScope | None = None

    def begin(self) -> Ready:
        self.session += 1
        session = self.session
        self.live = True
        self.started = trio.current_time()
        self.ready_at = None

        def ready() -> None:
            if self.live and self.session == session and self.ready_at is None:
                self.ready_at = trio.current_time()
                self._disarm()
                self.health.set(self.comp.name, HealthState.HEALTHY, "ready")

        return ready

    def end(self) -> float:
        """End the session; its length."""
        self.live = False
        return trio.current_time() - self.started

    def failed(self, failure: BaseException, lived: float, *, closing: bool) -> float | None:
        """Account for a failure and log it; the delay before the next session, None if none."""
        plan, now = self.comp.plan, trio.current_time()
        self.last_failure = describe(failure)
        if closing:
            self._log(failure, lived, "while closing")
            return None
        stable = self.ready_at is not None and lived >= plan.stable_after
        if self.window_start is None or stable:
            self.window_start = now
        delay: float | None = None
        if plan.restart is not None:
            if lived >= plan.restart.healthy_after:
                self.attempt = 0
            delay = plan.restart.backoff.delay(self.attempt, random.random())
            self.attempt += 1
        self._log(
            failure, lived, "not restarting" if delay is None else f"restart {self.attempt} in {delay:g}s"
        )
        deadline = self.window_start + plan.grace
        if now >= deadline:
            self._flip()
        else:
            state = self.health.get(self.comp.name).state
            self.health.set(self.comp.name, state, f"last failure: {self.last_failure}")
            self._arm(deadline)
        return delay

    def _log(self, failure: BaseException, lived: float, next_step: str) -> None:
        logger.warning(
            "component %s failed after %gs session: %s; %s",
            self.comp.name,
            lived,
            self.last_failure,
            next_step,
        )
        logger.debug("component %s failure traceback", self.comp.name, exc_info=failure)

    async def pause(self, delay: float) -> None:
        """Sleep ``delay`` before the next session, or less when the Restart's ``wake`` returns."""
        wake = self.comp.plan.restart.wake if self.comp.plan.restart else None
        if wake is None:
            await trio.sleep(delay)
            return
        with trio.move_on_after(delay):
            try:
                reason = await wake()
            except Exception as exc:  # a broken wake costs the early restart, never the component
                logger.warning("component %s: its restart wake failed: %s", self.comp.name, describe(exc))
                await trio.sleep_forever()
            logger.info(
                "component %s: restart %d now, before its %gs backoff ended: %s",
                self.comp.name,
                self.attempt,
                delay,
                reason,
            )

    def stopped(self, lived: float) -> None:
        """The session returned: a clean stop, so no pending flip may mark it FAILING."""
        self._disarm()
        logger.info("component %s stopped after %gs session", self.comp.name, lived)
        self.health.set(self.comp.name, HealthState.STOPPED, "returned")

    def _flip(self) -> None:
        self._disarm()
        self.health.set(self.comp.name, HealthState.FAILING, self.last_failure)

    def _arm(self, deadline: float) -> None:
        self._disarm()
        self.flip = scope = trio.CancelScope()

        async def fire() -> None:
            with scope:
                await trio.sleep_until(deadline)
                self._flip()

        self.timers.start_soon(fire, name=f"vgpud:{self.comp.name}:health-timer")

    def _disarm(self) -> None:
        if self.flip is not None:
            self.flip.cancel()
            self.flip = None


class Supervisor:
    """One nursery owning named component trees, each under its own cancel scope."""

    def __init__(self, *, shutdown_timeout: float = 10.0, health: HealthRegistry | None = None) -> None:
        self._shutdown_timeout = shutdown_timeout
        self._health = health if health is not None else HealthRegistry()
        self._manager: AbstractAsyncContextManager[trio.Nursery] | None = None
        self._nursery: trio.Nursery | None = None
        self._components: dict[str, _Component] = {}
        self._cancelled = False
        self._closed = False

    @property
    def health(self) -> HealthRegistry:
        return self._health

    async def __aenter__(self) -> Supervisor:
        if self._manager is not None:
            raise RuntimeError("a Supervisor can be entered only once")
        self._manager = trio.open_nursery()
        self._nursery = await self._manager.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._manager is not None
        if exc is not None:
            self.cancel()
        try:
            return await self._manager.__aexit__(exc_type, exc, tb)
        finally:
            self._closed = True

    def supervise(
        self, name: str, run: ComponentRun, *policies: Policy, counts_for_health: bool = True
    ) -> None:
        """Start supervising ``name``; ``run`` follows the module's component contract."""
        if self._nursery is None or self._closed:
            raise RuntimeError("supervise() needs an open `async with Supervisor()`")
        if self._cancelled:
            raise RuntimeError(f"supervisor is shutting down; not starting {name}")
        existing = self._components.get(name)
        if existing is not None and not existing.done.is_set():
            raise ValueError(f"component {name} is already supervised")
        comp = _Component(name, run, _Plan.of(policies))
        self._components[name] = comp
        self._health.register(name, counts_for_health=counts_for_health)
        self._nursery.start_soon(self._tree, comp, name=f"vgpud:{name}")

    def cancel(self) -> None:
        """Cancel every tree (the SIGTERM path); idempotent. Components close in their own time;
        after ``shutdown_timeout`` the ones still closing are logged."""
        if self._nursery is None or self._closed or self._cancelled:
            return
        self._cancelled = True
        self._nursery.cancel_scope.cancel()
        self._nursery.start_soon(self._watch_shutdown, name="vgpud:shutdown-watch")

    async def stop(self, name: str) -> None:
        """Cancel one tree and wait until it has closed."""
        comp = self._components[name]
        comp.scope.cancel()
        await comp.done.wait()

    async def _watch_shutdown(self) -> None:
        # Started inside the cancelled root scope, so it shields itself before its first checkpoint.
        with trio.CancelScope(shield=True):
            started = trio.current_time()
            with trio.move_on_after(self._shutdown_timeout):
                for comp in list(self._components.values()):
                    await comp.done.wait()
                logger.info("all components closed %gs after cancel", trio.current_time() - started)
                return
            closing = sorted(c.name for c in self._components.values() if not c.done.is_set())
            logger.error(
                "components still closing %gs after cancel: %s", self._shutdown_timeout, ", ".join(closing)
            )

    async def _tree(self, comp: _Component) -> None:
        clean = False
        try:
            with comp.scope:
                # The nursery also holds the grace timer, so a final failure still flips health.
                async with trio.open_nursery() as timers:
                    await self._sessions(comp, _Tracker(comp, self._health, timers))
                clean = True
        finally:
            if not clean:
                self._health.set(comp.name, HealthState.STOPPED, "cancelled")
            comp.done.set()

    @staticmethod
    async def _sessions(comp: _Component, tracker: _Tracker) -> None:
        """Run sessions until a clean stop or a final failure; cancellation propagates."""
        while True:
            ready = tracker.begin()
            try:
                await comp.run(ready)
            except BaseException as exc:
                lived = tracker.end()
                failure, passthrough = split_failure(exc)
                closing = passthrough is not None or trio.current_effective_deadline() == -math.inf
                delay = tracker.failed(failure, lived, closing=closing) if failure is not None else None
                if passthrough is exc:
                    raise
                if passthrough is not None:
                    raise passthrough from None
                if closing:
                    await trio.lowlevel.checkpoint()  # delivers the pending Cancelled
                if delay is None:
                    return
            else:
                tracker.stopped(tracker.end())
                return
            await tracker.pause(delay)
