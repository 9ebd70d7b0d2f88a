"""The I/O half of `vgpud.hotplug.vgpuconfig`: the target's vgpu.config rewritten in place under the
library's protocol, and the slave claim's CDI spec read back.

The library (csrc/libvgpu/src/vgpu_config_file.c) writes and checks the file under an OFD write lock
on byte 0 and never truncates it with O_TRUNC. A change here takes the same lock (non-blocking,
retried within `LOCK_TIMEOUT`), reads the struct, applies a pure change, and writes only the changed
devices[] entries, in one pwrite: the file keeps its inode and size, and a reader with a
MAP_PRIVATE mapping never sees it shrink. The config directory is mounted read-write into the
container, so the file is opened with O_NOFOLLOW|O_NONBLOCK and must be a regular file with one link.
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
    NO_CONFIG = "no-config"  # no vgpu.config: not a vGPU container, or its library never ran


@dataclass(frozen=True)
class ConfigOutcome:
    """What a change did to one target's file; `detail` is the line for the caller's record."""

    state: ConfigState
    path: Path
    #: the host indexes whose entries were written
    written: tuple[int, ...] = ()

    @property
    def detail(self) -> str:
        if self.state is ConfigState.NO_CONFIG:
            return f"{self.path} does not exist: the target's library enforces no limit of the added devices"
        if self.state is ConfigState.UNCHANGED:
            return f"{self.path} holds these devices already"
        return f"{self.path}: devices[{', '.join(map(str, self.written))}] written"


def read_claim_spec(cdi_root: Path, driver: str, claim_uid: str) -> dict[str, Any]:
    """The CDI spec vgpud wrote at Prepare for `claim_uid` (never through a symlink); ConfigError
    when it is missing, too large or not a spec. Blocking: run it in a thread."""
    path = spec_path(cdi_root, driver, claim_uid)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        raise ConfigError(f"CDI spec of claim {claim_uid}: {path}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"CDI spec of claim {claim_uid}: {path} is not a regular file")
        data = f.read(MAX_SPEC_BYTES + 1)
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


def _open_config(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link (not followed); nothing changed") from None
        raise ConfigError(f"{path}: {err.strerror}; nothing changed") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise ConfigError(f"{path} is not a regular file with one link; nothing changed")
    return fd


def _write(fd: int, path: Path, data: bytes, offset: int) -> None:
    try:
        done = os.pwrite(fd, data, offset)
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror}; nothing changed") from None
    if done != len(data):
        raise ConfigError(f"{path}: short write ({done} of {len(data)} bytes)")


def _try_change(path: Path, change: Callable[[bytes], bytes]) -> ConfigOutcome | None:
    """One attempt under the lock; None when the lock is taken."""
    fd = _open_config(path)
    if fd is None:
        return ConfigOutcome(ConfigState.NO_CONFIG, path)
    try:
        if not _ofd_lock(fd, fcntl.F_WRLCK):
            return None
        try:
            before = os.pread(fd, F.CONFIG_STRUCT_SIZE, 0)
            try:
                after = change(before)
            except ConfigError as err:
                raise ConfigError(f"{path}: {err}; nothing changed") from None
            if (
                len(after) != len(before)
                or after[: F.CONFIG_DEVICES_OFFSET] != before[: F.CONFIG_DEVICES_OFFSET]
            ):
                raise ValueError("a vgpu.config change may only rewrite devices[] entries")
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
    return ConfigOutcome(ConfigState.CHANGED if written else ConfigState.UNCHANGED, path, written)


async def change_target_config(
    config_path: Path, change: Callable[[bytes], bytes], *, lock_wait: float = LOCK_TIMEOUT
) -> ConfigOutcome:
    """Apply `change` (e.g. `functools.partial(extend_config, added=...)`) to the target's vgpu.config
    under the library's byte-0 lock. NO_CONFIG when the file does not exist (the caller decides
    whether the grant still happens); ConfigError, with the file unchanged, for a symlink, a file
    that is not a valid vgpu.config, a refused change, or a lock still held after `lock_wait` seconds."""
    with trio.move_on_after(lock_wait):
        while True:
            outcome = await trio.to_thread.run_sync(_try_change, config_path, change)
            if outcome is not None:
                return outcome
            await trio.sleep(LOCK_POLL)
    raise ConfigError(f"{config_path}: its lock (byte 0) stayed taken for {lock_wait:g} s; nothing changed")
