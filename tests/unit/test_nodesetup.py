"""The manager root vgpud prepares on the host before any claim: what the CDI mounts point at."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vgpud.nodesetup import prepare_manager_root
from vgpud.partition.layout import Layout


def test_creates_the_mount_sources_and_installs_what_it_is_given(tmp_path: Path) -> None:
    library, client = tmp_path / "lib.so", tmp_path / "client"
    library.write_bytes(b"\x7fELF library")
    client.write_bytes(b"\x7fELF client")
    layout = Layout(tmp_path / "root")
    prepare_manager_root(layout, "1.2.3", library, client)
    root = tmp_path / "root"
    assert (root / "claims").is_dir()
    assert (root / "registry").stat().st_mode & 0o777 == 0o711
    assert (root / "ld.so.preload").read_text() == "/etc/vgpu-manager/driver/libvgpu-control.so\n"
    assert (root / "libvgpu-control.so.1.2.3").read_bytes() == b"\x7fELF library"
    installed = root / "registry" / "vgpu-register"
    assert installed.read_bytes() == b"\x7fELF client"
    assert os.access(installed, os.X_OK)
    inode = installed.stat().st_ino
    prepare_manager_root(layout, "1.2.3", library, client)  # again: nothing to replace
    assert installed.stat().st_ino == inode


def test_without_a_library_a_placeholder_keeps_the_mount_valid(tmp_path: Path) -> None:
    prepare_manager_root(Layout(tmp_path), "1.0", None)
    assert (tmp_path / "libvgpu-control.so.1.0").read_bytes() == b""
    assert not (tmp_path / "registry" / "vgpu-register").exists()


def test_a_symlink_where_a_file_goes_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep")
    (tmp_path / "ld.so.preload").symlink_to(target)
    with pytest.raises(OSError, match="symbolic link"):
        prepare_manager_root(Layout(tmp_path), "1.0", None)
    assert target.read_text() == "keep"
