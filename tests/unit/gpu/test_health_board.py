"""The health board: changes are recorded once, readers wake on each change, unknown GPUs refused."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from vgpud.gpu.health import DeviceHealth, HealthBoard

A, B = "GPU-a", "GPU-b"


def test_every_gpu_starts_healthy() -> None:
    board = HealthBoard([A, B], clock=lambda: 5.0)
    assert {u: (h.healthy, h.since) for u, h in board.snapshot().items()} == {A: (True, 5.0), B: (True, 5.0)}
    assert board.unhealthy() == {} and board.version == 0


def test_a_change_bumps_the_version_and_the_same_state_does_not() -> None:
    board = HealthBoard([A, B])
    sick = DeviceHealth(A, healthy=False, reason="XID 79: fallen off the bus", since=10.0, xid=79)
    assert board.update(sick) is True
    assert board.version == 1 and board.unhealthy() == {A: sick}
    assert board.update(DeviceHealth(A, healthy=False, reason=sick.reason, since=11.0, xid=79)) is False
    assert board.version == 1 and board.snapshot()[A].since == 10.0
    assert board.update(DeviceHealth(A, healthy=True, since=20.0)) is True
    assert board.version == 2 and board.unhealthy() == {}


def test_an_unknown_gpu_is_refused_and_changes_nothing() -> None:
    board = HealthBoard([A])
    with pytest.raises(KeyError, match="GPU-x"):
        board.update(DeviceHealth("GPU-x", healthy=False, reason="lost"))
    assert board.version == 0 and list(board.snapshot()) == [A]


def test_the_snapshot_is_read_only() -> None:
    board = HealthBoard([A])
    with pytest.raises(TypeError):
        board.snapshot()[A] = DeviceHealth(A, healthy=False)  # type: ignore[index]


async def test_readers_wake_on_each_change() -> None:
    board = HealthBoard([A, B])
    seen: list[int] = []

    async def follow() -> None:
        version = board.version
        while len(seen) < 2:
            version = await board.wait_changed(version)
            seen.append(version)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await trio.testing.wait_all_tasks_blocked()
        board.update(DeviceHealth(A, healthy=False, reason="XID 48", xid=48))
        await trio.testing.wait_all_tasks_blocked()
        board.update(DeviceHealth(B, healthy=False, reason="GPU lost"))
    assert seen == [1, 2]


async def test_wait_returns_at_once_when_the_version_moved_on() -> None:
    board = HealthBoard([A])
    board.update(DeviceHealth(A, healthy=False, reason="XID 48", xid=48))
    with trio.fail_after(1):
        assert await board.wait_changed(0) == 1
