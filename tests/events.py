"""Events as the tests read them: a real EventRecorder over FakeKube, its writer running while the test
does, and the Events it wrote read back from the fake API server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio
import trio.testing

from vgpud.kube.api import JsonObject
from vgpud.kube.events import QUEUE_SIZE, EventRecorder
from vgpud.kube.fake import FakeKube

NODE = "node-a"


@dataclass
class Recording:
    kube: FakeKube = field(default_factory=FakeKube)
    clock: Callable[[], float] = time.time
    queue_size: int = QUEUE_SIZE
    recorder: EventRecorder = field(init=False)

    def __post_init__(self) -> None:
        self.recorder = EventRecorder(self.kube, NODE, clock=self.clock, queue_size=self.queue_size)

    async def events(self, namespace: str | None = None, reason: str | None = None) -> list[JsonObject]:
        """The Events (of `reason`) once the writer has written everything recorded so far."""
        await trio.testing.wait_all_tasks_blocked()
        return [e for e in self.kube.events(namespace) if reason is None or e["reason"] == reason]


@asynccontextmanager
async def recording(record: Recording | None = None) -> AsyncIterator[Recording]:
    """`record` (a new one by default) with its writer running for the block."""
    record = record or Recording()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(record.recorder.run, lambda: None)
        yield record
        nursery.cancel_scope.cancel()
