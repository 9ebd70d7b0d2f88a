"""The node lock: exclusive across processes and tasks, bounded wait, released on cancel, no symlinks."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from vgpud.dra.nodelock import NodeLockError, NodeLockTimeout, node_lock

HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.read()  # hold until the test closes our stdin
    """
)


@pytest.fixture
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "pu.lock"


@pytest.fixture
def other_process_holds(lock_path: Path) -> Iterator[Callable[[], None]]:
    """Another process (as a second vgpud would) holds the lock until the returned release() is called."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"locked\n"

    def release() -> None:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)

    try:
        yield release
    finally:
        if proc.poll() is None:
            release()


async def test_acquire_creates_the_file_0600(lock_path: Path) -> None:
    async with node_lock(lock_path):
        assert stat.S_IMODE(lock_path.stat().st_mode) == 0o600


async def test_another_process_makes_the_waiter_time_out_then_release_lets_it_in(
    lock_path: Path, other_process_holds: Callable[[], None]
) -> None:
    with pytest.raises(NodeLockTimeout) as caught:
        async with node_lock(lock_path, timeout=0.2):
            pytest.fail("acquired a lock another process holds")
    assert str(lock_path) in str(caught.value) and "0.2 s" in str(caught.value)
    other_process_holds()
    async with node_lock(lock_path, timeout=5):
        pass


async def test_the_waiter_gets_the_lock_when_the_other_process_lets_go(
    lock_path: Path, other_process_holds: Callable[[], None]
) -> None:
    acquired = trio.Event()

    async def waiter() -> None:
        async with node_lock(lock_path, timeout=10):
            acquired.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(0.1)
        assert not acquired.is_set()
        await trio.to_thread.run_sync(other_process_holds)
        with trio.fail_after(5):
            await acquired.wait()


async def test_two_tasks_in_one_process_exclude_each_other(
    lock_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    inside = 0
    most = 0

    async def worker() -> None:
        nonlocal inside, most
        async with node_lock(lock_path, timeout=60):
            inside += 1
            most = max(most, inside)
            await trio.sleep(1)
            inside -= 1

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(worker)
    assert most == 1


async def test_timeout_follows_the_trio_clock(
    lock_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with node_lock(lock_path):
        start = trio.current_time()
        with pytest.raises(NodeLockTimeout, match="10 s"):
            async with node_lock(lock_path):  # the reference's 10 s, on virtual time
                pass
        assert 10 <= trio.current_time() - start < 10.1


async def test_zero_timeout_tries_once(lock_path: Path) -> None:
    async with node_lock(lock_path):
        with pytest.raises(NodeLockTimeout):
            async with node_lock(lock_path, timeout=0):
                pass
    async with node_lock(lock_path, timeout=0):
        pass


async def test_cancellation_inside_releases(lock_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    with trio.move_on_after(1):
        async with node_lock(lock_path):
            await trio.sleep_forever()
    async with node_lock(lock_path, timeout=0):
        pass


async def test_an_exception_inside_releases(lock_path: Path) -> None:
    with pytest.raises(RuntimeError):
        async with node_lock(lock_path):
            raise RuntimeError("prepare failed")
    async with node_lock(lock_path, timeout=0):
        pass


def descriptors_of(path: Path) -> list[str]:
    """This process's open descriptors on `path` (counting all of them would count other tests'
    threads too)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                found.append(fd)
        except OSError:
            continue
    return found


async def test_cancellation_while_waiting_leaks_nothing(
    lock_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with node_lock(lock_path):
        with trio.move_on_after(1) as scope:
            async with node_lock(lock_path, timeout=60):
                pytest.fail("acquired a held lock")
        assert scope.cancelled_caught
        assert len(descriptors_of(lock_path)) == 1  # the waiter's is closed, the holder's open
    assert descriptors_of(lock_path) == []  # both closed
    async with node_lock(lock_path, timeout=0):
        pass


async def test_a_symlink_at_the_lock_path_is_refused(tmp_path: Path, lock_path: Path) -> None:
    target = tmp_path / "elsewhere"
    lock_path.symlink_to(target)
    with pytest.raises(NodeLockError, match="symbolic link"):
        async with node_lock(lock_path):
            pytest.fail("locked through a symlink")
    assert not target.exists()  # not created through the link


async def test_a_directory_at_the_lock_path_is_refused(lock_path: Path) -> None:
    lock_path.mkdir()
    with pytest.raises(NodeLockError):
        async with node_lock(lock_path):
            pytest.fail("locked a directory")
