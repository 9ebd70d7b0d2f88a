"""remove_tree: rm -rf that decides on one lstat and never goes through a symlink at the top."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from vgpud.fsutil import read_regular, remove_tree


def test_a_tree_is_removed_and_a_missing_one_is_nothing_to_do(tmp_path: Path) -> None:
    tree = tmp_path / "claim"
    (tree / "r1" / "config").mkdir(parents=True)
    (tree / "r1" / "config" / "pids.config").write_text("")
    assert remove_tree(tree) is True and not tree.exists()
    assert remove_tree(tree) is False


def test_a_symlink_at_the_top_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious").write_text("x")
    link = tmp_path / "claim"
    link.symlink_to(target)
    with pytest.raises(OSError) as info:
        remove_tree(link)
    assert info.value.errno == errno.ELOOP
    assert (target / "precious").read_text() == "x" and link.is_symlink()
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nothing")
    with pytest.raises(OSError, match="symlink"):
        remove_tree(dangling)


def test_read_regular_reads_up_to_one_byte_over_its_limit_and_nothing_else(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_bytes(b"0123456789")
    assert read_regular(data, 100) == b"0123456789"
    assert read_regular(data, 4) == b"01234"  # one byte over: the caller sees the file is too large
    assert read_regular(tmp_path / "missing", 4) is None
    link = tmp_path / "link"
    link.symlink_to(data)
    with pytest.raises(OSError, match="is a symbolic link") as info:
        read_regular(link, 100)
    assert info.value.errno == errno.ELOOP
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file") as info:
        read_regular(fifo, 100)  # returns at once: a FIFO without a writer must not block
    assert info.value.errno == errno.EINVAL
