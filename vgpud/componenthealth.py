"""Component health: the state of every supervised component, one ``ComponentHealth`` each.

Separate from `vgpud.supervisor` because it has readers the supervisor does not know: the supervisor
(and the node's builders, for parts that are off or fall back) write it; the gRPC health service
(`vgpud.health`), the debug state (`vgpud.observe.state`) and the metrics (`vgpud.observe.metrics`)
read it. Health changes are logged on ``vgpud.supervisor``, beside the failures that cause them.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import trio

logger = logging.getLogger("vgpud.supervisor")


class HealthState(enum.StrEnum):
    STARTING = "starting"
    HEALTHY = "healthy"
    FAILING = "failing"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ComponentHealth:
    state: HealthState
    reason: str
    since: float  # registry clock (Trio time by default) of the last state change
    counts_for_health: bool = True


class HealthRegistry:
    """Health of every component; read by the gRPC health service and the debug endpoint.

    Only called from the Trio thread. ``since`` uses ``clock`` (Trio's clock by default, so it agrees
    with the supervisor's timers and with MockClock in tests).
    """

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self._entries: dict[str, ComponentHealth] = {}
        self._changed = trio.Event()

    def register(self, name: str, *, counts_for_health: bool = True) -> None:
        """(Re)start tracking ``name`` as STARTING."""
        self._store(name, ComponentHealth(HealthState.STARTING, "", self._clock(), counts_for_health))

    def set(self, name: str, state: HealthState, reason: str = "") -> None:
        """Set the state; same state only updates the reason (``since`` is kept). Unknown names
        are registered as counting for health."""
        old = self._entries.get(name)
        if old is not None and old.state is state:
            self._entries[name] = replace(old, reason=reason)
            return
        counts = old.counts_for_health if old is not None else True
        self._store(name, ComponentHealth(state, reason, self._clock(), counts))

    def _store(self, name: str, entry: ComponentHealth) -> None:
        self._entries[name] = entry
        level = logging.ERROR if entry.state is HealthState.FAILING else logging.INFO
        logger.log(level, "component %s is %s (%s)", name, entry.state.value, entry.reason or "-")
        self._changed.set()
        self._changed = trio.Event()

    def get(self, name: str) -> ComponentHealth:
        return self._entries[name]

    def all_healthy(self) -> bool:
        """Every component that counts for health is HEALTHY: STARTING and STOPPED are not, so a
        component that may finish for good is supervised with ``counts_for_health=False``.
        Vacuously true when none counts."""
        return all(e.state is HealthState.HEALTHY for e in self._entries.values() if e.counts_for_health)

    def snapshot(self) -> dict[str, ComponentHealth]:
        return dict(self._entries)

    async def wait_changed(self) -> None:
        """Return at the next state change (for gRPC Health.Watch)."""
        await self._changed.wait()
