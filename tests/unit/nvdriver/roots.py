"""Small driver roots in a temp dir, laid out as the tests need (the full fake node is tests/fakedriver)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from tests.support import built, require

VERSION = "550.54.15"
LIB_DIR = "usr/lib/x86_64-linux-gnu"


def need_root() -> None:
    require(os.geteuid() == 0, "root (mknod of character devices)", "run the tests as root")


def place(root: Path, relative: str, source: Path | None = None, *, mode: int = 0o644) -> Path:
    """A file under the root: a copy of `source`, or a small text file."""
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if source is not None:
        shutil.copyfile(source, path)
    else:
        path.write_text(f"{relative}\n")
    path.chmod(mode)
    return path


def link(root: Path, relative: str, target: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def node(root: Path, relative: str, major: int, minor: int, *, mode: int = 0o666, gid: int = 0) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # mknod applies the umask
    if gid:
        os.chown(path, 0, gid)


def driver(root: Path, lib_dir: str = LIB_DIR, version: str = VERSION) -> None:
    """The two fake libraries of `version` with the links a driver install makes."""
    place(root, f"{lib_dir}/libcuda.so.{version}", built("fakecuda/libcuda.so.1"))
    place(root, f"{lib_dir}/libnvidia-ml.so.{version}", built("fakenvml/libnvidia-ml.so.1"))
    link(root, f"{lib_dir}/libcuda.so.1", f"libcuda.so.{version}")
    link(root, f"{lib_dir}/libcuda.so", "libcuda.so.1")
    link(root, f"{lib_dir}/libnvidia-ml.so.1", f"libnvidia-ml.so.{version}")


def gpu_nodes(root: Path, minors: tuple[int, ...] = (0, 1)) -> None:
    need_root()
    for minor in minors:
        node(root, f"dev/nvidia{minor}", 195, minor)
    node(root, "dev/nvidiactl", 195, 255)
