"""pids.config on the host: the in-place reset (Prepare, CreateContainer) and the registry's writer.

pids.config is bind-mounted read-only into the container as a file, and a bind mount pins an inode,
so the file is created, truncated or rewritten in place, never replaced by rename or unlink. The
config dir around it is writable by the container, so the last path component is attacker-controlled:
it is opened with O_NOFOLLOW and must turn out to be a regular file; a symlink, directory or FIFO in
its place is refused, never followed or opened for I/O. Both operations hold an exclusive flock, the
library's readers a shared one. The reset takes it with a short budget because Prepare and
CreateContainer are on the runtime's synchronous path: a wedged holder becomes an error, not a
stalled node. Blocking: call these from a worker thread (a reset with lock_budget 0 never sleeps: one
try for the lock, then PidsFileLockTimeout).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from vgpud.partition.layout import PIDS_FILE

PIDS_FILE_MODE = 0o644
#: the only other holder writes a few hundred bytes; 50 ms is generous (the reference's budget)
LOCK_BUDGET = 0.05
#: the registry's writes race each other (every process of a container registers at start) and the
#: library's readers; they are off the runtime's path, so they may wait longer
WRITE_LOCK_BUDGET = 1.0
LOCK_POLL = 0.002


class PidsFileError(OSError):
    """pids.config could not be reset or written; the caller fails closed."""


class PidsFileLockTimeout(PidsFileError):
    """Another holder kept the pids.config lock past the budget."""


def _open(path: Path, verb: str) -> int:
    return _open_stat(path, verb)[0]


def _open_stat(path: Path, verb: str) -> tuple[int, os.stat_result]:
    """The file opened for writing, never through a symlink, and its stat; a regular file only."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, PIDS_FILE_MODE)
    except OSError as err:
        if err.errno == errno.ELOOP:
            reason = "it is a symbolic link (refused, not followed)"
        elif err.errno == errno.EISDIR:
            reason = "it is a directory, not a regular file"
        else:
            reason = err.strerror or str(err)
        raise PidsFileError(err.errno, f"cannot {verb} {path}: {reason}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise PidsFileError(errno.EINVAL, f"cannot {verb} {path}: it is not a regular file")
    return fd, st


def _lock(fd: int, path: Path, budget: float, verb: str) -> None:
    deadline = time.monotonic() + budget
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise PidsFileLockTimeout(
                    errno.EWOULDBLOCK,
                    f"cannot {verb} {path}: another holder keeps its lock (gave up after "
                    f"{budget * 1000:.0f} ms)",
                ) from None
            time.sleep(LOCK_POLL)
        except InterruptedError:
            continue


def reset_pids_file(config_dir: str | os.PathLike[str], *, lock_budget: float = LOCK_BUDGET) -> Path:
    """Create `<config_dir>/pids.config` (mode 0644) or empty it in place; return its path."""
    path = Path(config_dir) / PIDS_FILE
    fd, st = _open_stat(path, "reset")
    try:
        _lock(fd, path, lock_budget, "reset")
        # normalise a mode an older release or the umask left behind, then empty it in place; a new
        # file (every new container's) is already both, and each metadata write costs a journal entry
        if stat.S_IMODE(st.st_mode) != PIDS_FILE_MODE:
            os.fchmod(fd, PIDS_FILE_MODE)
        if os.fstat(fd).st_size:  # under the lock: a writer may have filled it since the open
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # also releases the lock
    return path


def create_pids_file(config_dir: str | os.PathLike[str]) -> Path:
    """A new, empty `<config_dir>/pids.config` (mode 0644) in a directory just made: Prepare's case,
    three system calls instead of a reset's five (no lock and no size check: nothing can have filled
    a file that did not exist). Anything already there is reset in place as `reset_pids_file` does."""
    path = Path(config_dir) / PIDS_FILE
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, PIDS_FILE_MODE)
    except FileExistsError:
        return reset_pids_file(config_dir)
    except OSError as err:
        raise PidsFileError(err.errno, f"cannot reset {path}: {err.strerror or err}") from None
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != PIDS_FILE_MODE:  # the umask narrowed it
            os.fchmod(fd, PIDS_FILE_MODE)
    finally:
        os.close(fd)
    return path


def format_pids(pids: Iterable[int]) -> bytes:
    """The file's content: distinct PIDs ascending, one decimal per line, each `\\n`-terminated."""
    values = sorted(set(pids))
    if not values:
        raise ValueError("an empty PID list is never written (the library reads it as 'not registered')")
    if values[0] <= 0 or not all(type(pid) is int for pid in values):
        raise ValueError(f"PIDs must be positive integers, got {values!r}")
    return "".join(f"{pid}\n" for pid in values).encode("ascii")


def write_pids_file(
    config_dir: str | os.PathLike[str], pids: Iterable[int], *, lock_budget: float = WRITE_LOCK_BUDGET
) -> Path:
    """Write the registered container's host PIDs into `<config_dir>/pids.config`; return its path.

    No O_TRUNC and no rename: truncating at open would publish an empty file before the lock is
    held, and an empty list is what the library treats as "no registered process" (fatal there).
    The new list is written at offset 0 and only then is the file shrunk to its length, so even a
    reader that takes no lock sees a whole list, at worst followed by stale PIDs of this container.
    """
    data = format_pids(pids)  # refuses an empty list before anything is opened
    path = Path(config_dir) / PIDS_FILE
    fd = _open(path, "write")
    try:
        _lock(fd, path, lock_budget, "write")
        os.fchmod(fd, PIDS_FILE_MODE)
        written = os.pwrite(fd, data, 0)
        if written != len(data):
            raise PidsFileError(errno.EIO, f"cannot write {path}: short write ({written} of {len(data)})")
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)  # also releases the lock
    return path
