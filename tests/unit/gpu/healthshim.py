"""A scripted NVML for the health watcher (vgpud.gpu.healthwatch.HealthSource): the test queues events
and says which GPUs answer; the watcher's worker threads read them. `wait` blocks for its timeout in
real time, as NVML does, so a MockClock with an autojump threshold moves on while it waits."""

from __future__ import annotations

import queue
import threading

from vgpud.gpu.model import GpuInventoryError, GpusLost, XidEvent


class ScriptedNvml:
    def __init__(self, count: int) -> None:
        self.count = count
        #: NVML index -> why it does not answer (absent: it answers)
        self.problems: dict[int, str] = {}
        #: raised by the next `open` calls (NVML cannot be used), consumed one per call
        self.open_errors: list[Exception] = []
        #: raised by every `check` while set (NVML broke under a running session)
        self.check_error: Exception | None = None
        self.opened = 0
        self.closed = 0
        self.checks = 0
        self._events: queue.Queue[XidEvent | GpusLost | Exception] = queue.Queue()
        self._lock = threading.Lock()

    # -- the test's side
    def xid(self, index: int, xid: int) -> None:
        self._events.put(XidEvent(index, xid))

    def lose(self, index: int, why: str = "GPU is lost (NVML error 15)") -> None:
        """GPU `index` stops answering, and the event wait reports a loss (as NVML does)."""
        self.problems[index] = why
        self._events.put(GpusLost())

    def restore(self, index: int) -> None:
        self.problems.pop(index, None)

    def break_wait(self) -> None:
        self._events.put(GpuInventoryError("nvmlEventSetWait_v2 failed: Unknown Error (NVML error 999)"))

    # -- HealthSource
    def open(self) -> dict[int, str]:
        with self._lock:
            self.opened += 1
            if self.open_errors:
                raise self.open_errors.pop(0)
        return dict(self.problems)

    def wait(self, timeout_ms: int) -> XidEvent | GpusLost | None:
        try:
            item = self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            raise item
        return item

    def check(self, index: int) -> str | None:
        with self._lock:
            self.checks += 1
        if self.check_error is not None:
            raise self.check_error
        return self.problems.get(index)

    def close(self) -> None:
        with self._lock:
            self.closed += 1
