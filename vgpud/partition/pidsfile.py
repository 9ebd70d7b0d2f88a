"""The in-place pids.config reset: the one filesystem operation of the partition package.

pids.config is bind-mounted read-only into the container as a file, and a bind mount pins an inode,
so the file is created or truncated in place, never replaced by rename or unlink. The config dir
around it is writable by the container, so the last path component is attacker-controlled: it is
opened with O_NOFOLLOW and must turn out to be a regular file; a symlink, directory or FIFO in its
place is refused, never followed or opened for I/O. The lock is the registry writer's (flock), taken
with a short budget because Prepare and CreateContainer are on the runtime's synchronous path: a
wedged holder becomes an error, not a stalled node. Blocking: call it from a worker thread.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path

from vgpud.partition.layout import PIDS_FILE

PIDS_FILE_MODE = 0o644
#: the only other holder writes a few hundred bytes; 50 ms is generous (the reference's budget)
LOCK_BUDGET = 0.05
LOCK_POLL = 0.002


class PidsFileError(OSError):
    """pids.config could not be reset; the caller fails closed (no container without its PID list)."""


class PidsFileLockTimeout(PidsFileError):
    """Another holder kept the pids.config lock past the budget."""


def _open(path: Path) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        return os.open(path, flags, PIDS_FILE_MODE)
    except OSError as err:
        if err.errno == errno.ELOOP:
            reason = "it is a symbolic link (refused, not followed)"
        elif err.errno == errno.EISDIR:
            reason = "it is a directory, not a regular file"
        else:
            reason = err.strerror or str(err)
        raise PidsFileError(err.errno, f"cannot reset {path}: {reason}") from None


def _lock(fd: int, path: Path, budget: float) -> None:
    deadline = time.monotonic() + budget
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise PidsFileLockTimeout(
                    errno.EWOULDBLOCK,
                    f"cannot reset {path}: another holder keeps its lock (gave up after "
                    f"{budget * 1000:.0f} ms)",
                ) from None
            time.sleep(LOCK_POLL)
        except InterruptedError:
            continue


def reset_pids_file(config_dir: str | os.PathLike[str], *, lock_budget: float = LOCK_BUDGET) -> Path:
    """Create `<config_dir>/pids.config` (mode 0644) or empty it in place; return its path."""
    path = Path(config_dir) / PIDS_FILE
    fd = _open(path)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PidsFileError(errno.EINVAL, f"cannot reset {path}: it is not a regular file")
        _lock(fd, path, lock_budget)
        # normalise a mode an older release or the umask left behind, then empty it in place
        os.fchmod(fd, PIDS_FILE_MODE)
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # also releases the lock
    return path
