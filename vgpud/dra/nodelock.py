"""Node-wide serialization of Prepare and Unprepare: an exclusive flock on `pu.lock` in the plugin dir.

The reference system holds the same lock (vgpu-manager-contracts.md "Identity") so that two plugin
processes on one node (an upgrade's old and new pod) never prepare at once. The wait is bounded (10 s
by default): a wedged holder becomes an error for the kubelet to retry, not a stuck node. flock
belongs to an open file description, so two holders in one process exclude each other too.

Trio-friendly: a non-blocking flock retried every `poll` seconds on the Trio clock (a MockClock
drives it), never a blocking call on the event loop. The lock file is opened with O_NOFOLLOW: a
symlink at its path is refused, never followed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

LOCK_FILE = "pu.lock"
LOCK_MODE = 0o600
DEFAULT_TIMEOUT = 10.0


class NodeLockError(Exception):
    """The lock file cannot be used (a symlink, not a regular file, unreadable)."""


class NodeLockTimeout(NodeLockError):
    """Another holder kept the node lock past the timeout."""


def _open(path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, LOCK_MODE)
    except OSError as err:
        reason = "it is a symbolic link (refused, not followed)" if err.errno == errno.ELOOP else err.strerror
        raise NodeLockError(f"cannot open node lock {path}: {reason}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NodeLockError(f"cannot open node lock {path}: it is not a regular file")
    return fd


# `timeout` rather than a caller's trio.fail_after: it bounds only the wait, not the body, and the
# error it raises names the lock and the budget.
@asynccontextmanager
async def node_lock(
    path: Path,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109
    poll: float = 0.01,
) -> AsyncIterator[None]:
    """Hold the exclusive lock on `path` for the body; NodeLockTimeout after `timeout` seconds of waiting.

    Released and closed on exit, whether the body returns, raises or is cancelled.
    """
    fd = _open(path)
    try:
        deadline = trio.current_time() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if trio.current_time() >= deadline:
                    raise NodeLockTimeout(
                        f"node lock {path} is held by another Prepare/Unprepare (gave up after {timeout:g} s)"
                    ) from None
                await trio.sleep(poll)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
