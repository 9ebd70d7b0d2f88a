"""Unix socket paths a server binds: the one stale-socket rule, and the ownership-checked unlink.

A socket file left by an earlier process is replaced; anything else at the path (a file, a
directory, a link) is refused and never deleted: the path is a setting and may be mistyped. On the
way out a server unlinks the path only while it is still the socket it bound, since a successor may
already have replaced it.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from dataclasses import dataclass
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


def private_unix_listener(path: Path, backlog: int = 128) -> socket.socket:
    """A listening, non-blocking unix socket at `path`, mode 0600 before anyone can connect (root-only
    when vgpud runs as root); a stale socket file is replaced, anything else at `path` is refused."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o600)  # before listen(): until then every connect is refused
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


@dataclass(frozen=True)
class SocketIdentity:
    """The inode we bound: paths are not identities once another instance may replace the file."""

    dev: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> SocketIdentity:
        return cls(st.st_dev, st.st_ino)

    @classmethod
    def at(cls, path: Path) -> SocketIdentity:
        """The identity of what sits at `path` now (the socket just bound), not following a link."""
        return cls.of(os.lstat(path))


@dataclass(frozen=True)
class SocketStamp:
    """A socket file as one bind made it: its inode and change time, since ext4 gives a new file the
    inode just freed (a chmod or chown also changes the time: at worst one needless redial)."""

    dev: int
    ino: int
    ctime_ns: int


def socket_at(path: Path) -> SocketStamp | None:
    """The socket a connect to `path` reaches now (links followed), None when there is none."""
    try:
        st = path.stat()
    except OSError:
        return None
    return SocketStamp(st.st_dev, st.st_ino, st.st_ctime_ns) if stat.S_ISSOCK(st.st_mode) else None


def path_state(path: Path, ours: SocketIdentity) -> str:
    """Whether `path` is "ours", "missing", or "other" (a successor's socket, or something else)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return "missing"
    return "ours" if stat.S_ISSOCK(st.st_mode) and SocketIdentity.of(st) == ours else "other"


def unlink_if_ours(path: Path, ours: SocketIdentity) -> bool:
    """Unlink `path` only while it is still the socket we bound; True when it was unlinked."""
    if path_state(path, ours) != "ours":
        return False
    path.unlink(missing_ok=True)
    return True
