"""Where the webhook's CPU-bound steps run, so that one large review never holds up the others.

Every review is served on the one Trio thread. Reading a review's JSON and applying the rules are
linear in its size, but a pod may have thousands of containers and a namespace thousands of pods: done
on the Trio thread, such a step would make every other admission wait for it. So a step over a small
input runs inline (a few milliseconds at most: a thread hop would cost more), and one over a large
input runs in a worker thread. Worker threads are few (`THREADS`): large reviews queue for them, small
ones never do. A worker still shares the GIL, but Python hands the GIL over every few milliseconds,
so the Trio thread keeps answering in the meantime (bench/webhook.py measures it); only one long C
call keeps it longer (json.loads of a body near the 6 MiB limit: tens of milliseconds).

A step in a worker thread is abandoned when its review's deadline passes: the review is answered
(`DecisionTooSlow`) and the thread's result is dropped when it ends; its thread slot stays taken
until then, which is what bounds the CPU that large reviews can take at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")

#: bodies up to this size are decoded inline (json.loads: about 1 ms per 100 KiB)
INLINE_BODY_BYTES = 128 * 1024
#: containers (of the pod and the namespace's pods together) up to which the rules run inline
INLINE_CONTAINERS = 400
#: worker threads for large steps at one time
THREADS = 2


class DecisionTooSlow(Exception):
    """A step in a worker thread did not finish before the review's deadline."""


class CpuLane:
    """Runs a step inline or in a bounded worker thread, by the size of its input."""

    def __init__(self, threads: int = THREADS) -> None:
        self.limiter = trio.CapacityLimiter(threads)
        #: steps sent to a worker thread so far (tests and the bench look at it)
        self.offloaded = 0

    async def run(self, large: bool, step: Callable[..., T], *args: object) -> T:
        """`step(*args)`: inline unless `large`; in a worker thread under the caller's deadline
        otherwise (DecisionTooSlow when it passes)."""
        if not large:
            return step(*args)
        self.offloaded += 1
        deadline = trio.current_effective_deadline()
        try:
            return await trio.to_thread.run_sync(step, *args, limiter=self.limiter, abandon_on_cancel=True)
        except trio.Cancelled:
            # an outer scope's deadline is caught by that scope, not one opened here: tell it apart
            if trio.current_time() >= deadline:
                raise DecisionTooSlow() from None
            raise
