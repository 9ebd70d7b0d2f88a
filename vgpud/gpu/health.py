"""Per-GPU health: one board that the health watcher writes and its readers wait on.

The board holds the current health of every GPU of the inventory (all healthy at start). The watcher
(behind the `NVMLDeviceHealthCheck` gate) is its only writer; the ResourceSlice publisher (device
taints) and the kubelet's DRA resource-health stream read it and wait for the next change. Updates
happen on the Trio thread (the watcher's NVML calls run in worker threads; it decides and updates
back on the Trio thread), so readers see every change in order and never a torn state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import trio


@dataclass(frozen=True)
class DeviceHealth:
    """One GPU's health as last decided."""

    uuid: str
    healthy: bool
    #: why it is unhealthy ("XID 79: GPU has fallen off the bus", "GPU lost: ..."); "" when healthy
    reason: str = ""
    #: unix seconds of the decision
    since: float = 0.0
    #: the XID that made it unhealthy, if one did
    xid: int | None = None


class HealthBoard:
    """The current health of every GPU; `update` from the Trio thread, `wait_changed` to follow it."""

    def __init__(self, uuids: Iterable[str], clock: Callable[[], float] = time.time) -> None:
        now = clock()
        self._health = {uuid: DeviceHealth(uuid, healthy=True, since=now) for uuid in uuids}
        self._version = 0
        self._changed = trio.Event()

    @property
    def version(self) -> int:
        """Bumped by every change; pass it to `wait_changed`."""
        return self._version

    def snapshot(self) -> Mapping[str, DeviceHealth]:
        """Every GPU's health by UUID (a read-only view of this moment's state)."""
        return MappingProxyType(dict(self._health))

    def unhealthy(self) -> dict[str, DeviceHealth]:
        return {uuid: h for uuid, h in self._health.items() if not h.healthy}

    def update(self, health: DeviceHealth) -> bool:
        """Record `health`; True (and readers woken) when it changes the GPU's state or reason.

        A UUID the board does not know is refused: the inventory is fixed for vgpud's lifetime.
        """
        current = self._health.get(health.uuid)
        if current is None:
            raise KeyError(f"no GPU {health.uuid} in the inventory")
        if (current.healthy, current.reason, current.xid) == (health.healthy, health.reason, health.xid):
            return False
        self._health[health.uuid] = health
        self._version += 1
        self._changed.set()
        self._changed = trio.Event()
        return True

    async def wait_changed(self, seen: int) -> int:
        """Return the version once it differs from `seen` (at once if it already does)."""
        while self._version == seen:
            await self._changed.wait()
        return self._version
