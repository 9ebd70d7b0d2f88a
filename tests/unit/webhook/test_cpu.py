"""The CPU lane: small steps inline, large ones in a bounded worker thread that a review's deadline
abandons (its thread slot stays taken until the thread ends)."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from vgpud.webhook.cpu import CpuLane, DecisionTooSlow


async def test_small_steps_run_inline_and_large_ones_in_a_worker_thread() -> None:
    lane = CpuLane()
    assert await lane.run(False, threading.get_ident) == threading.get_ident()
    assert await lane.run(True, threading.get_ident) != threading.get_ident()
    assert lane.offloaded == 1


async def test_a_step_past_the_deadline_is_abandoned_and_keeps_its_slot_until_it_ends() -> None:
    lane = CpuLane(threads=1)
    release = threading.Event()
    with pytest.raises(DecisionTooSlow), trio.fail_after(5):
        with trio.move_on_after(0.05):  # the review's deadline
            await lane.run(True, release.wait)
    assert lane.limiter.borrowed_tokens == 1  # the thread still runs
    release.set()
    with trio.fail_after(5):
        async with lane.limiter:  # free once the abandoned thread has ended
            pass


async def test_a_cancellation_that_is_not_the_deadline_stays_a_cancellation() -> None:
    lane = CpuLane()
    release = threading.Event()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lane.run, True, release.wait)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
    release.set()
    assert scope.cancelled_caught
