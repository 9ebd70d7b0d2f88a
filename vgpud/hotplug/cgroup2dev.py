"""Replace the device program of a cgroup v2 cgroup, to give a running container more devices.

runc attaches a container's device rules to its cgroup as a BPF_PROG_TYPE_CGROUP_DEVICE program
with BPF_F_ALLOW_MULTI, and every attached program must allow an access, so one more program can
only narrow it. To widen it, vgpud loads a program of the container's whole rule list (its own
rules plus the added ones), attaches it, and then detaches the programs that were there, as runc
does when it creates the cgroup. Between the attach and the detaches both programs run, so the
container never has more access than either list gives.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from vgpud.containers.values import DeviceRule
from vgpud.hotplug import bpfsys
from vgpud.hotplug.devfilter import LICENSE, compile_filter


class DeviceFilterError(Exception):
    """A step of the replacement failed; `step` is "query", "load", "attach" or "detach"."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message


@contextlib.contextmanager
def _open_cgroup(cgroup_dir: Path) -> Iterator[int]:
    try:
        fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise DeviceFilterError("query", f"cannot open cgroup {cgroup_dir}: {error.strerror}") from error
    try:
        yield fd
    finally:
        os.close(fd)


def _query(cgroup_fd: int, cgroup_dir: Path) -> list[int]:
    try:
        return bpfsys.prog_query(cgroup_fd)
    except OSError as error:
        raise DeviceFilterError("query", f"cgroup {cgroup_dir}: {error.strerror}") from error


def attached_filters(cgroup_dir: Path) -> list[int]:
    """Ids of the device programs attached to this cgroup v2 directory."""
    with _open_cgroup(cgroup_dir) as cgroup_fd:
        return _query(cgroup_fd, cgroup_dir)


def _open_programs(ids: list[int], cgroup_dir: Path, fds: dict[int, int]) -> None:
    """An fd for each attached program into `fds`; one that ended since the query is left out.
    One this process may not open (an LSM's label) is an error: it would stay attached and keep
    narrowing what the new program allows."""
    for prog_id in ids:
        try:
            fds[prog_id] = bpfsys.prog_get_fd_by_id(prog_id)
        except OSError as error:
            if error.errno == errno.ENOENT:  # detached and freed since the query
                continue
            raise DeviceFilterError(
                "query", f"cgroup {cgroup_dir}: cannot open device program {prog_id}: {error.strerror}"
            ) from error


def _rollback(cgroup_fd: int, new_fd: int, detached: list[int]) -> str:
    """Re-attach the old programs already detached and detach the new one; what failed, if any."""
    failures = []
    for fd in detached:
        try:
            bpfsys.prog_attach(cgroup_fd, fd)
        except OSError as error:
            failures.append(f"re-attaching an old program: {error.strerror}")
    try:
        bpfsys.prog_detach(cgroup_fd, new_fd)
    except OSError as error:
        failures.append(f"detaching the new program: {error.strerror}")
    return "; rollback failed: " + "; ".join(failures) if failures else "; rolled back"


def replace_device_filter(cgroup_dir: Path, rules: Sequence[DeviceRule]) -> None:
    """Make `rules` (the container's whole list, in order) the one device program of the cgroup.

    A failure before the attach changes nothing; a failed detach re-attaches the old programs
    already detached and detaches the new one, then raises DeviceFilterError."""
    try:
        instructions = compile_filter(rules)
    except ValueError as error:
        raise DeviceFilterError("load", str(error)) from error
    fds: dict[int, int] = {}
    new_fd = -1
    try:
        with _open_cgroup(cgroup_dir) as cgroup_fd:
            _open_programs(_query(cgroup_fd, cgroup_dir), cgroup_dir, fds)
            try:
                new_fd = bpfsys.prog_load(instructions, LICENSE)
            except OSError as error:
                raise DeviceFilterError("load", f"cgroup {cgroup_dir}: {error.strerror}") from error
            try:
                bpfsys.prog_attach(cgroup_fd, new_fd)
            except OSError as error:
                raise DeviceFilterError("attach", f"cgroup {cgroup_dir}: {error.strerror}") from error
            detached: list[int] = []
            for prog_id, fd in fds.items():
                try:
                    bpfsys.prog_detach(cgroup_fd, fd)
                except OSError as error:
                    outcome = _rollback(cgroup_fd, new_fd, detached)
                    message = f"cgroup {cgroup_dir}: old program {prog_id}: {error.strerror}{outcome}"
                    raise DeviceFilterError("detach", message) from error
                detached.append(fd)
    finally:
        for fd in [*fds.values(), new_fd]:
            if fd >= 0:
                os.close(fd)
