"""Unix socket paths a server binds: the one stale-socket rule, and the ownership-checked unlink.

A socket file left by an earlier process is replaced; anything else at the path (a file, a
directory, a link) is refused and never deleted: the path is a setting and may be mistyped. On the
way out a server unlinks the path only while it is still the socket it bound, since a successor may
already have replaced it.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("vgpud.sockpath")


class SocketPathError(FileExistsError):
    """Something that is not a socket sits where a socket must be bound."""


def check_socket_path(path: Path) -> bool:
    """True when a socket sits at `path`, False when nothing does; SocketPathError for anything else."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(f"{path} exists and is not a socket; refusing to replace it")
    return True


def remove_stale_socket(path: Path) -> None:
    """Remove a socket left by an earlier process; refuse to remove anything that is not a socket."""
    if check_socket_path(path):
        path.unlink(missing_ok=True)
        log.info("removed stale socket %s", path)


def inode_of(path: Path) -> int:
    """The inode of what sits at `path` now (the socket just bound), without following a link."""
    return os.lstat(path).st_ino


def unlink_if_ours(path: Path, inode: int | None) -> None:
    """Unlink `path` only if it is still the socket we bound (inode None: whatever is there)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if inode is None or st.st_ino == inode:
        path.unlink(missing_ok=True)
