"""The I/O half of `vgpud.hotplug.vgpuconfig`: the target's vgpu.config rewritten in place under the
library's protocol, and the slave claim's CDI spec read back.

The library (csrc/libvgpu/src/vgpu_config_file.c) writes and checks the file under an OFD write lock
on byte 0 and never truncates it with O_TRUNC. A change here takes the same lock (non-blocking,
retried within `LOCK_TIMEOUT`), reads the struct, applies a pure change, and writes only the changed
devices[] entries, in one pwrite: the file keeps its inode and size, and a reader with a
MAP_PRIVATE mapping never sees it shrink. The config directory is mounted read-write into the
container, so the file is opened with O_NOFOLLOW|O_NONBLOCK relative to the directory (itself opened
with O_DIRECTORY|O_NOFOLLOW) and must be a regular file with one link.

A container whose library never ran has no file; `create` makes one (O_CREAT|O_EXCL, mode 0644, a
header and nothing else) under the same lock, and the container's first library process merges its
env into it (vgpu_config_file.c `vgpu_config_publish`). A shrink leaves such a file in place even
when no entry stays active: a header-only file means nothing to the library (it merges into it)
or to vgpud's readers (no device active), and removing it would race that first process.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import trio

from vgpud.dra.cdi import spec_path
from vgpud.fsutil import read_regular
from vgpud.hotplug.vgpuconfig import ConfigError, entry_bytes
from vgpud.partition import libfiles as F

#: how long a change waits for the byte-0 lock (the library holds it only while it checks or writes
#: the file, microseconds); then it fails with ConfigError naming the file
LOCK_TIMEOUT = 2.0
LOCK_POLL = 0.005
#: a CDI spec this large is not one vgpud wrote (a few KiB per claim); refused before reading it
MAX_SPEC_BYTES = 1 << 20


class ConfigState(StrEnum):
    CHANGED = "changed"
    UNCHANGED = "unchanged"  # the file holds what was asked already
    NO_CONFIG = "no-config"  # no vgpu.config (create off), or no config directory: not a vGPU container


@dataclass(frozen=True)
class ConfigOutcome:
    """What a change did to one target's file; `detail` is the line for the caller's record."""

    state: ConfigState
    path: Path
    #: the host indexes whose entries were written
    written: tuple[int, ...] = ()
    #: vgpud made the file (header only) before writing the entries: no library process had
    created: bool = False
    #: NO_CONFIG: what is missing
    missing: str = ""

    @property
    def detail(self) -> str:
        if self.state is ConfigState.NO_CONFIG:
            return (
                f"{self.path}: {self.missing or 'it does not exist'}: the target's library enforces no "
                "limit of the added devices"
            )
        if self.state is ConfigState.UNCHANGED:
            return f"{self.path} holds these devices already"
        made = " (created)" if self.created else ""
        return f"{self.path}{made}: devices[{', '.join(map(str, self.written))}] written"


def read_claim_spec(cdi_root: Path, driver: str, claim_uid: str) -> dict[str, Any]:
    """The CDI spec vgpud wrote at Prepare for `claim_uid` (never through a symlink); ConfigError
    when it is missing, too large or not a spec. Blocking: run it in a thread."""
    path = spec_path(cdi_root, driver, claim_uid)
    try:
        data = read_regular(path, MAX_SPEC_BYTES)
    except OSError as err:
        raise ConfigError(f"CDI spec of claim {claim_uid}: {err.strerror}") from None
    if data is None:
        raise ConfigError(f"CDI spec of claim {claim_uid}: {path}: No such file or directory")
    if len(data) > MAX_SPEC_BYTES:
        raise ConfigError(f"CDI spec of claim {claim_uid}: {path} is over {MAX_SPEC_BYTES} bytes")
    try:
        spec = json.loads(data)
    except ValueError as err:
        raise ConfigError(f"CDI spec of claim {claim_uid}: {path}: {err}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"CDI spec of claim {claim_uid}: {path} is not a JSON object")
    return spec


# --------------------------------------------------------------------------------------------------
# I/O: the locked rewrite

#: struct flock (x86-64 and arm64): l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks)
_FLOCK = "hhqqi4x"


def _ofd_lock(fd: int, kind: int) -> bool:
    """Non-blocking OFD lock (or unlock) of byte 0; False when another holder has it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 1, 0))
    except OSError as err:
        if err.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _open_dir(path: Path) -> int | None:
    """The config directory's fd (never through a symlink); None when it does not exist."""
    directory = path.parent
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ConfigError(
                f"{directory} is not a directory (a symbolic link is not followed); nothing changed"
            ) from None
        raise ConfigError(f"{directory}: {err.strerror}; nothing changed") from None


def _create(dir_fd: int, path: Path) -> int | None:
    """A new, empty vgpu.config (mode 0644) in the directory; None when it exists already (the
    library, or another change, created it at the same moment: the caller opens that one)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path.name, flags, 0o644, dir_fd=dir_fd)
    except FileExistsError:
        return None
    except OSError as err:
        raise ConfigError(f"{path} cannot be created: {err.strerror}; nothing changed") from None
    os.fchmod(fd, 0o644)  # not narrowed by vgpud's umask: every user of the container reads it
    return fd


def _open_config(path: Path, create: bool) -> tuple[int | None, str]:
    """The file's fd, or None when it (or its directory) does not exist and `create` is off (the
    second item says which). With `create`, a missing file is created empty in the existing
    directory; a race with its other creator retries the open."""
    dir_fd = _open_dir(path)
    if dir_fd is None:
        return None, "its directory does not exist"
    try:
        while True:
            try:
                fd = os.open(
                    path.name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd
                )
                break
            except FileNotFoundError:
                if not create:
                    return None, "it does not exist"
                new = _create(dir_fd, path)
                if new is not None:
                    fd = new
                    break
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise ConfigError(f"{path} is a symbolic link (not followed); nothing changed") from None
                raise ConfigError(f"{path}: {err.strerror}; nothing changed") from None
    finally:
        os.close(dir_fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise ConfigError(f"{path} is not a regular file with one link; nothing changed")
    return fd, ""


def _write(fd: int, path: Path, data: bytes, offset: int) -> None:
    try:
        done = os.pwrite(fd, data, offset)
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror}; nothing changed") from None
    if done != len(data):
        raise ConfigError(f"{path}: short write ({done} of {len(data)} bytes)")


def _initialise(fd: int, path: Path) -> bool:
    """Give an empty file (one `_create` made, or a library process left without writing) a valid
    header and nothing else, under the lock the caller holds; False when it is not empty."""
    if os.fstat(fd).st_size:
        return False
    _write(fd, path, _HEADER_ONLY + bytes(F.CONFIG_FILE_SIZE - F.CONFIG_STRUCT_SIZE), 0)
    return True


def _apply(path: Path, change: Callable[[bytes], bytes], before: bytes) -> bytes:
    try:
        after = change(before)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}; nothing changed") from None
    if len(after) != len(before) or after[: F.CONFIG_DEVICES_OFFSET] != before[: F.CONFIG_DEVICES_OFFSET]:
        raise ValueError("a vgpu.config change may only rewrite devices[] entries")
    return after


#: the struct of the file `create` makes
_HEADER_ONLY = F.build_vgpu_config(F.VgpuConfig())[: F.CONFIG_STRUCT_SIZE]


def _try_change(path: Path, change: Callable[[bytes], bytes], create: bool) -> ConfigOutcome | None:
    """One attempt under the lock; None when the lock is taken."""
    if create:  # a change refused on the file `create` would make is refused before it is made,
        # and one that would write nothing there makes none
        create = _apply(path, change, _HEADER_ONLY) != _HEADER_ONLY
    fd, missing = _open_config(path, create)
    if fd is None:
        return ConfigOutcome(ConfigState.NO_CONFIG, path, missing=missing)
    try:
        if not _ofd_lock(fd, fcntl.F_WRLCK):
            return None
        try:
            created = create and _initialise(fd, path)
            before = os.pread(fd, F.CONFIG_STRUCT_SIZE, 0)
            after = _apply(path, change, before)
            written = tuple(
                i for i in range(F.MAX_DEVICES) if entry_bytes(after, i) != entry_bytes(before, i)
            )
            if written:  # one write from the first changed entry to the end of the last
                start = F.config_device_offset(written[0])
                end = F.config_device_offset(written[-1]) + F.CONFIG_DEVICE_SIZE
                _write(fd, path, after[start:end], start)
        finally:
            _ofd_lock(fd, fcntl.F_UNLCK)
    finally:
        os.close(fd)
    state = ConfigState.CHANGED if written or created else ConfigState.UNCHANGED
    return ConfigOutcome(state, path, written, created=created)


async def change_target_config(
    config_path: Path,
    change: Callable[[bytes], bytes],
    *,
    lock_wait: float = LOCK_TIMEOUT,
    create: bool = False,
) -> ConfigOutcome:
    """Apply `change` (e.g. `functools.partial(extend_config, added=...)`) to the target's vgpu.config
    under the library's byte-0 lock. NO_CONFIG when the file does not exist (the caller decides
    whether the grant still happens), or with `create` when its directory does not: `create` makes
    a missing (or empty) file a header-only vgpu.config first when the change writes an entry, so
    the container's processes started later adopt it before any of them wrote the file (its library
    merges its own env in).
    ConfigError, with nothing changed or created, for a symlink (file or directory), a file that is
    not a valid vgpu.config, a refused change, or a lock still held after `lock_wait` seconds."""
    with trio.move_on_after(lock_wait):
        while True:
            outcome = await trio.to_thread.run_sync(_try_change, config_path, change, create)
            if outcome is not None:
                return outcome
            await trio.sleep(LOCK_POLL)
    raise ConfigError(f"{config_path}: its lock (byte 0) stayed taken for {lock_wait:g} s; nothing changed")
