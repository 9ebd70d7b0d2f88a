"""Device access on cgroup v1: rules written to the container's `devices.allow` / `devices.deny`.

The kernel applies a written rule at once to the cgroup (and refuses, with EPERM, a rule its parent
does not allow). runc never rewrites them: `runc update` skips devices (docs/decisions.md). The files
are opened below a directory descriptor with O_NOFOLLOW, so a symlink planted in the path is refused.
Blocking: call it from a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from vgpud.containers.values import DeviceRule

ALLOW_FILE = "devices.allow"
DENY_FILE = "devices.deny"
#: the v1 devices hierarchy below the cgroup mount
DEVICES_HIERARCHY = "devices"


class DeviceCgroupError(Exception):
    """A rule could not be written; says which rule and file."""


def devices_dir(cgroup_mount: Path, container_dir: PurePosixPath) -> Path:
    return cgroup_mount / DEVICES_HIERARCHY / container_dir


def _write_rules(directory: Path, name: str, rules: Iterable[DeviceRule]) -> None:
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise DeviceCgroupError(
            f"cannot open the container's devices cgroup {directory}: {err.strerror}"
        ) from None
    try:
        for rule in rules:
            try:
                fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError as err:
                raise DeviceCgroupError(f"cannot open {directory / name}: {err.strerror}") from None
            try:
                os.write(fd, str(rule).encode())
            except OSError as err:
                raise DeviceCgroupError(
                    f"writing {str(rule)!r} to {directory / name}: {err.strerror}"
                ) from None
            finally:
                os.close(fd)
    finally:
        os.close(dir_fd)


def allow(directory: Path, rules: Iterable[DeviceRule]) -> None:
    """Write each rule to devices.allow (one write per rule, as the kernel parses one)."""
    _write_rules(directory, ALLOW_FILE, rules)


def deny(directory: Path, rules: Iterable[DeviceRule]) -> None:
    """Write each rule to devices.deny."""
    _write_rules(directory, DENY_FILE, rules)


def listed(directory: Path) -> list[str]:
    """The cgroup's `devices.list` lines (what the kernel allows now), for tests and debugging."""
    return (directory / "devices.list").read_text().split("\n")[:-1]
