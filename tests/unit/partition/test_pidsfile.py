"""The in-place pids.config reset: create or truncate keeping the inode, refuse what is not a file."""

from __future__ import annotations

import fcntl
import os
import stat
import time
from pathlib import Path

import pytest

from vgpud.partition.pidsfile import PidsFileError, PidsFileLockTimeout, create_pids_file, reset_pids_file


def test_creates_the_file_with_mode_0644(tmp_path: Path) -> None:
    old = os.umask(0o077)  # the mode must not depend on the caller's umask
    try:
        path = reset_pids_file(tmp_path)
    finally:
        os.umask(old)
    assert path == tmp_path / "pids.config"
    info = path.lstat()
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o644 and info.st_size == 0


def test_truncates_in_place_keeping_the_inode(tmp_path: Path) -> None:
    path = tmp_path / "pids.config"
    path.write_text("101\n202\n")
    path.chmod(0o777)  # an older release's mode is normalised
    inode = path.stat().st_ino
    with path.open("rb") as reader:  # a bind mount pins this inode: it must stay the file
        reset_pids_file(tmp_path)
        assert os.fstat(reader.fileno()).st_ino == inode and reader.read() == b""
    assert path.stat().st_ino == inode
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.read_bytes() == b""


def test_an_empty_file_of_the_right_mode_gets_no_metadata_write(tmp_path: Path) -> None:
    path = reset_pids_file(tmp_path)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # a past mtime a write would move
    before = path.stat()
    reset_pids_file(tmp_path)
    after = path.stat()
    assert (after.st_mtime_ns, after.st_ctime_ns, after.st_ino) == (
        before.st_mtime_ns,
        before.st_ctime_ns,
        before.st_ino,
    )


def test_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    target.chmod(0o600)
    config = tmp_path / "config"
    config.mkdir()
    (config / "pids.config").symlink_to(target)
    with pytest.raises(PidsFileError, match="symbolic link"):
        reset_pids_file(config)
    assert target.read_text() == "precious\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert (config / "pids.config").is_symlink()


def test_a_dangling_symlink_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    (tmp_path / "pids.config").symlink_to(tmp_path / "would-be-created")
    with pytest.raises(PidsFileError, match="symbolic link"):
        reset_pids_file(tmp_path)
    assert not (tmp_path / "would-be-created").exists()


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pids.config").mkdir()
    with pytest.raises(PidsFileError, match="is a directory"):
        reset_pids_file(tmp_path)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pids.config")
    with pytest.raises(PidsFileError):
        reset_pids_file(tmp_path)


def test_a_missing_config_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PidsFileError, match="cannot reset"):
        reset_pids_file(tmp_path / "absent")


def test_a_held_lock_times_out_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "pids.config"
    path.write_text("7\n")
    with path.open("r+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(
            PidsFileLockTimeout, match=r"another holder keeps its lock \(gave up after 20 ms\)"
        ):
            reset_pids_file(tmp_path, lock_budget=0.02)
        assert time.monotonic() - started < 2
    assert path.read_text() == "7\n"  # nothing was truncated without the lock
    reset_pids_file(tmp_path)  # released: now it works
    assert path.read_text() == ""


def test_create_makes_an_empty_0644_file_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        path = create_pids_file(tmp_path)
    finally:
        os.umask(old)
    info = path.lstat()
    assert path == tmp_path / "pids.config"
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o644 and info.st_size == 0


def test_create_over_an_existing_file_resets_it_in_place(tmp_path: Path) -> None:
    path = tmp_path / "pids.config"
    path.write_text("101\n")
    inode = path.stat().st_ino
    create_pids_file(tmp_path)
    assert path.stat().st_ino == inode and path.read_bytes() == b""


def test_create_refuses_a_symlink_and_a_missing_dir(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    config = tmp_path / "config"
    config.mkdir()
    (config / "pids.config").symlink_to(target)
    with pytest.raises(PidsFileError, match="symbolic link"):
        create_pids_file(config)
    assert target.read_text() == "precious\n"
    with pytest.raises(PidsFileError, match="cannot reset"):
        create_pids_file(tmp_path / "absent")
