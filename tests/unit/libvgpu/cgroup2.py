"""A private mount of the cgroup v2 hierarchy for a test, and cgroups in it.

A v1 or hybrid host can mount the unified hierarchy (`mount -t cgroup2`) with no controllers: it
tracks membership, which is all the library's v2 rule reads, and `unshare --cgroup` gives a process
a cgroup namespace rooted at its cgroup, as a container runtime does on a v2 node. On a hybrid host
the hierarchy is the one already mounted at /sys/fs/cgroup/unified: the test's cgroups carry a unique
name and are removed (after their processes are moved back to the root) with the mount."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

INSTALL_HINT = "run the tests as root on a Linux kernel with cgroup v2 (any host since 4.5) and util-linux"


def available() -> bool:
    """Root, util-linux's unshare, and the kernel knows cgroup2."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    with contextlib.suppress(OSError):
        return "cgroup2" in Path("/proc/filesystems").read_text()
    return False


class Hierarchy:
    """A mounted cgroup v2 hierarchy; `make(name)` creates a cgroup of this test."""

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.prefix = f"vgpud-test-{uuid.uuid4().hex[:8]}"
        self.made: list[Path] = []

    def make(self, name: str) -> Path:
        path = self.mount / f"{self.prefix}-{name}"
        path.mkdir()
        self.made.append(path)
        return path

    @staticmethod
    def move(pid: int, cgroup: Path) -> None:
        (cgroup / "cgroup.procs").write_text(f"{pid}\n")

    def release(self) -> None:
        """Every process still in our cgroups back to the root, then the cgroups removed."""
        for path in reversed(self.made):
            with contextlib.suppress(FileNotFoundError):
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, OSError):
                        self.move(int(pid), self.mount)
            with contextlib.suppress(FileNotFoundError):
                path.rmdir()


@contextlib.contextmanager
def hierarchy() -> Iterator[Hierarchy]:
    """Mount cgroup2 on a temp dir for the block; unmounted and removed after, with our cgroups."""
    where = Path(tempfile.mkdtemp(prefix="vgpud-cg2-"))
    try:
        mounted = subprocess.run(
            ["mount", "-t", "cgroup2", "none", str(where)], capture_output=True, text=True, check=False
        )
        if mounted.returncode != 0:
            raise RuntimeError(f"cannot mount cgroup2 on {where}: {mounted.stderr.strip()}")
        tree = Hierarchy(where)
        try:
            yield tree
        finally:
            tree.release()
            subprocess.run(["umount", str(where)], check=True)
    finally:
        where.rmdir()
