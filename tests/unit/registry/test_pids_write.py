"""The registry's pids.config writer: in place, locked, never empty, never through a symlink."""

from __future__ import annotations

import fcntl
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from vgpud.partition.pidsfile import (
    PidsFileError,
    PidsFileLockTimeout,
    format_pids,
    reset_pids_file,
    write_pids_file,
)


def test_pids_ascending_distinct_one_per_line(tmp_path: Path) -> None:
    path = write_pids_file(tmp_path, [300, 7, 42, 7])
    assert path == tmp_path / "pids.config"
    assert path.read_bytes() == b"7\n42\n300\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_rewrites_in_place_and_shrinks(tmp_path: Path) -> None:
    path = reset_pids_file(tmp_path)  # what Prepare / CreateContainer leave behind
    inode = path.stat().st_ino
    with path.open("rb") as mounted:  # a bind mount pins the inode
        write_pids_file(tmp_path, range(1000, 1100))
        write_pids_file(tmp_path, [5])
        assert os.fstat(mounted.fileno()).st_ino == inode
        assert mounted.read() == b"5\n"
    assert path.stat().st_ino == inode


@pytest.mark.parametrize("pids", [[], [0], [-3], [True]])
def test_an_empty_or_bogus_list_is_refused_and_the_file_untouched(tmp_path: Path, pids: list) -> None:
    path = tmp_path / "pids.config"
    path.write_text("12\n")
    with pytest.raises(ValueError):
        write_pids_file(tmp_path, pids)
    assert path.read_text() == "12\n"


def test_nothing_is_created_for_an_empty_list(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty PID list"):
        format_pids([])
    with pytest.raises(ValueError):
        write_pids_file(tmp_path, [])
    assert not (tmp_path / "pids.config").exists()


def test_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    precious = tmp_path / "etc-shadow"
    precious.write_text("root:x:0:0\n")
    precious.chmod(0o600)
    config = tmp_path / "config"
    config.mkdir()
    (config / "pids.config").symlink_to(precious)
    with pytest.raises(PidsFileError, match="symbolic link"):
        write_pids_file(config, [1, 2, 3])
    assert precious.read_text() == "root:x:0:0\n"
    assert stat.S_IMODE(precious.stat().st_mode) == 0o600
    assert (config / "pids.config").is_symlink()


def test_a_dangling_symlink_creates_nothing(tmp_path: Path) -> None:
    (tmp_path / "pids.config").symlink_to(tmp_path / "created-through-the-link")
    with pytest.raises(PidsFileError, match="symbolic link"):
        write_pids_file(tmp_path, [1])
    assert not (tmp_path / "created-through-the-link").exists()


@pytest.mark.parametrize("kind", ["dir", "fifo"])
def test_a_non_file_is_refused(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "pids.config"
    target.mkdir() if kind == "dir" else os.mkfifo(target)
    with pytest.raises(PidsFileError, match="cannot write"):
        write_pids_file(tmp_path, [1])


def test_a_held_lock_times_out(tmp_path: Path) -> None:
    path = write_pids_file(tmp_path, [9])
    with path.open("rb") as reader:
        fcntl.flock(reader, fcntl.LOCK_SH)
        with pytest.raises(PidsFileLockTimeout, match=r"gave up after 20 ms"):
            write_pids_file(tmp_path, [1, 2], lock_budget=0.02)
    assert path.read_text() == "9\n"


def test_concurrent_writers_and_readers_never_see_a_partial_or_empty_file(tmp_path: Path) -> None:
    """Writers alternate a long and a short list; readers that take LOCK_SH (as the library does)
    only ever see one whole list; readers without the lock (an old library) never see an empty file."""
    lists = [list(range(100_000, 100_400)), [3], list(range(50, 90))]
    valid = {format_pids(pids) for pids in lists}
    path = write_pids_file(tmp_path, lists[0])
    stop = time.monotonic() + 1.0
    seen: list[bytes] = []
    failures: list[str] = []

    def writer(offset: int) -> None:
        i = offset
        while time.monotonic() < stop:
            write_pids_file(tmp_path, lists[i % len(lists)])
            i += 1

    def locked_reader() -> None:
        while time.monotonic() < stop:
            with path.open("rb") as file:
                fcntl.flock(file, fcntl.LOCK_SH)
                data = file.read()
            if data not in valid:
                failures.append(f"locked reader saw {data[:60]!r}... ({len(data)} bytes)")
                return
            seen.append(data)

    def unlocked_reader() -> None:
        while time.monotonic() < stop:
            if not path.read_bytes():
                failures.append("unlocked reader saw an empty file")
                return

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=locked_reader) for _ in range(3)]
    threads.append(threading.Thread(target=unlocked_reader))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert len(set(seen)) > 1  # the readers really saw the writers at work
