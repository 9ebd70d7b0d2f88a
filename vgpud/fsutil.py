"""Small filesystem primitives shared by everything that writes state files.

Writes are atomic (readers see the old file or the new) and refuse to go through a symlink or to
replace anything that is not a regular file: the directories vgpud writes to may be reachable by
workloads.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from pathlib import Path


def _refuse_non_regular(path: Path) -> None:
    """OSError (ELOOP, EINVAL) when something other than a regular file is at `path`."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise OSError(errno.ELOOP, f"{path} is a symbolic link (refused, not followed)")
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EINVAL, f"{path} is not a regular file (refused)")


def read_regular(path: Path, limit: int) -> bytes | None:
    """At most `limit` + 1 bytes of the regular file at `path` (so a caller sees a file over its
    limit), None when there is none. Never through a symlink (OSError ELOOP), without blocking on a
    FIFO; OSError (EINVAL) for anything else that is not a regular file. An OSError's strerror
    starts with the path."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{path} is a symbolic link (refused, not followed)") from None
        raise OSError(err.errno, f"{path}: {err.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file (refused)")
        with os.fdopen(os.dup(fd), "rb") as reader:
            return reader.read(limit + 1)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int, *, durable: bool = True) -> None:
    """Replace `path` with `data` so that a reader (or a crash) sees the old file or the new, never a mix.

    Temp file in the same directory (O_EXCL|O_NOFOLLOW, named `.<name>.<random>.tmp` so that
    directory scanners looking for `*.json` skip it), write, fsync, rename over, fsync the directory.
    Something at `path` that is not a regular file (a symlink, a directory) is refused, not replaced.
    On any failure the temp file is removed and `path` is untouched. Raises OSError.
    `durable=False` skips both fsyncs: for files on tmpfs, or whose loss in a crash is harmless.
    """
    _refuse_non_regular(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have narrowed it
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if durable:
        fsync_dir(path.parent)


def remove_tree(path: Path) -> bool:
    """rm -rf that refuses a symlink at the top (rmtree itself never follows links inside); False when
    there was nothing to remove. One lstat decides (Prepare calls it for every claim)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(info.st_mode):
        raise OSError(errno.ELOOP, f"{path} is a symlink; refusing to remove through it")
    shutil.rmtree(path)
    return True
