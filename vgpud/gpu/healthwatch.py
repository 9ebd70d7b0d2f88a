"""The device-health watcher: NVML's XID events and per-GPU checks, decided by vgpud.gpu.healthrules,
written to the HealthBoard that the ResourceSlice publisher and the kubelet's health stream read;
each change of a GPU's health is also an Event on the Node (GPUUnhealthy, GPUHealthy).

It runs behind the `NVMLDeviceHealthCheck` gate as a supervised component. Every NVML call blocks, so
each runs in a worker thread, and every decision and board update happens back on the Trio thread.
Two tasks share one NVML session: one waits for events (`wait_ms` at a time, so a cancellation is
served within that), the other checks every GPU every `check_interval` seconds, at once when NVML says
a GPU was lost, and when a sick GPU's recovery wait ends. An NVML failure (not a sick GPU: NVML itself)
ends the session; the supervisor restarts it with backoff, and what the board says stays as it was.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from vgpud import excgroup
from vgpud.gpu.health import DeviceHealth, HealthBoard
from vgpud.gpu.healthrules import (
    DeviceTrack,
    describe_xid,
    is_fatal,
    on_check,
    on_fatal_xid,
    recovery_due,
    settle,
)
from vgpud.gpu.model import GpuInfo, GpusLost, XidEvent
from vgpud.kube.eventcorrelate import EventType
from vgpud.kube.events import EventSink, Reason
from vgpud.logs import fields
from vgpud.ready import Ready

log = logging.getLogger(__name__)

#: seconds between checks of every GPU (a lost GPU is also found at once through the event wait)
CHECK_INTERVAL = 5.0
#: seconds the event wait pauses after NVML reported a lost GPU (which it may do on every wait)
LOST_PAUSE = 1.0
#: one event wait in the worker thread; bounds how long a cancellation waits for the thread
WAIT_MS = 500
#: what happens to a device that changes health (the consumers are the slice publisher and the
#: kubelet's resource-health stream)
MARKED = "marked {} for the scheduler and the kubelet"


class HealthSource(Protocol):
    """An NVML session for health (vgpud.gpu.nvml.NvmlHealthSession); every method blocks."""

    def open(self) -> dict[int, str]:
        """Start; the GPUs (NVML index -> why) that do not answer already."""
        ...

    def wait(self, timeout_ms: int) -> XidEvent | GpusLost | None: ...

    def check(self, index: int) -> str | None:
        """None when GPU `index` answers NVML, else why not."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class HealthRules:
    """The watcher's settings."""

    ignored_xids: frozenset[int]
    recovery_seconds: float
    check_interval: float = CHECK_INTERVAL
    wait_ms: int = WAIT_MS


@dataclass
class WatchStats:
    """What the watcher counted (the metrics and the debug state read it)."""

    #: (uuid, xid, "fatal" | "ignored") -> events
    xids: Counter[tuple[str, int, str]] = field(default_factory=Counter)
    #: NVML sessions opened
    sessions: int = 0
    #: checks of every GPU done
    checks: int = 0


class HealthWatcher:
    """Keeps `board` in step with NVML; `run` is the supervised component."""

    def __init__(
        self,
        board: HealthBoard,
        gpus: Iterable[GpuInfo],
        open_source: Callable[[], HealthSource],
        rules: HealthRules,
        *,
        wall: Callable[[], float] = time.time,
        events: EventSink | None = None,
    ) -> None:
        self.board = board
        self.rules = rules
        self.stats = WatchStats()
        self._gpus = {gpu.index: gpu for gpu in gpus}
        self._open_source = open_source
        self._wall = wall
        self._tracks = {index: DeviceTrack() for index in self._gpus}
        self._check_now = trio.Event()
        #: the Node's Events: a GPU turned unhealthy, or recovered
        self._events = events

    def uuids(self) -> dict[int, str]:
        """Each watched GPU's UUID by NVML index."""
        return {index: gpu.uuid for index, gpu in self._gpus.items()}

    def tracks(self) -> dict[int, DeviceTrack]:
        """Each GPU's state by NVML index (the debug state shows it)."""
        return dict(self._tracks)

    async def run(self, ready: Ready) -> None:
        source = self._open_source()
        gone = await trio.to_thread.run_sync(source.open)
        try:
            self.stats.sessions += 1
            now = trio.current_time()
            for index, problem in sorted(gone.items()):
                self._apply(index, on_check(self._tracks[index], problem, now))
            ready()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._follow_events, source)
                    nursery.start_soon(self._check_periodically, source)
            except BaseExceptionGroup as group:
                # one task's NVML error (the other task's Cancelled beside it): that error itself, so
                # the log and the component's health name it
                failures, rest = group.split(Exception)
                leaves = list(excgroup.leaves(failures)) if failures is not None else []
                others = list(excgroup.leaves(rest)) if rest is not None else []
                if len(leaves) == 1 and all(isinstance(e, trio.Cancelled) for e in others):
                    raise leaves[0] from None
                raise
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(source.close)

    async def _follow_events(self, source: HealthSource) -> None:
        while True:
            event = await trio.to_thread.run_sync(source.wait, self.rules.wait_ms)
            if isinstance(event, XidEvent):
                self._on_xid(event)
            elif isinstance(event, GpusLost):
                self._check_now.set()
                # NVML may say so on every wait while the loss lasts: look again a little later
                await trio.sleep(LOST_PAUSE)

    async def _check_periodically(self, source: HealthSource) -> None:
        indices = sorted(self._gpus)
        while True:
            problems = await trio.to_thread.run_sync(lambda: {i: source.check(i) for i in indices})
            self.stats.checks += 1
            now = trio.current_time()
            for index, problem in problems.items():
                track = on_check(self._tracks[index], problem, now)
                self._apply(index, settle(track, now, self.rules.recovery_seconds))
            wake = now + self.rules.check_interval
            for track in self._tracks.values():
                due = recovery_due(track, self.rules.recovery_seconds)
                if due is not None:
                    wake = min(wake, due)
            with trio.move_on_at(wake):
                await self._check_now.wait()
            self._check_now = trio.Event()

    def _on_xid(self, event: XidEvent) -> None:
        gpu = self._gpus.get(event.index)
        if gpu is None:
            log.warning(
                "NVML reported %s on GPU %d, which is not in the inventory",
                describe_xid(event.xid),
                event.index,
                extra=fields(gpu=event.index),
            )
            return
        fatal = is_fatal(event.xid, self.rules.ignored_xids)
        self.stats.xids[(gpu.uuid, event.xid, "fatal" if fatal else "ignored")] += 1
        if not fatal:
            log.info(
                "%s (%d): %s ignored: an application's error, the GPU stays as it is",
                gpu.uuid,
                gpu.index,
                describe_xid(event.xid),
                extra=fields(gpu=gpu.uuid),
            )
            return
        track = self._tracks[event.index]
        if not track.healthy:
            log.info(
                "%s (%d): %s while unhealthy: recovery wait restarts",
                gpu.uuid,
                gpu.index,
                describe_xid(event.xid),
                extra=fields(gpu=gpu.uuid),
            )
        self._apply(event.index, on_fatal_xid(track, event.xid, trio.current_time()))

    def _apply(self, index: int, track: DeviceTrack) -> None:
        """Keep `track`; a change of health goes to the board and is logged once."""
        old = self._tracks[index]
        self._tracks[index] = track
        if (old.healthy, old.reason) == (track.healthy, track.reason):
            return
        gpu = self._gpus[index]
        health = DeviceHealth(gpu.uuid, track.healthy, track.reason, self._wall(), track.xid)
        if not self.board.update(health):
            return
        if track.healthy:
            log.warning(
                "%s (%d) healthy again: it answers NVML and had no fatal XID or failed check for %gs: %s",
                gpu.uuid,
                gpu.index,
                self.rules.recovery_seconds,
                MARKED.format("healthy"),
                extra=fields(gpu=gpu.uuid),
            )
        else:
            log.warning(
                "%s (%d) unhealthy: %s: %s",
                gpu.uuid,
                gpu.index,
                track.reason,
                MARKED.format("unhealthy"),
                extra=fields(gpu=gpu.uuid),
            )
        if self._events is not None:
            self._events.record_node(*health_event(gpu, track, self.rules.recovery_seconds))


def health_event(gpu: GpuInfo, track: DeviceTrack, recovery_seconds: float) -> tuple[EventType, Reason, str]:
    """The Node's Event for a GPU's change of health: its index, UUID and why."""
    name = f"GPU {gpu.index} ({gpu.uuid})"
    if track.healthy:
        return (
            EventType.NORMAL,
            Reason.GPU_HEALTHY,
            f"{name} healthy again: it answers NVML and had no fatal XID or failed check for "
            f"{recovery_seconds:g}s: {MARKED.format('healthy')}",
        )
    return (
        EventType.WARNING,
        Reason.GPU_UNHEALTHY,
        f"{name} unhealthy: {track.reason}: {MARKED.format('unhealthy')}",
    )
