"""remove_tree: rm -rf that decides on one lstat and never goes through a symlink at the top."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from vgpud.fsutil import remove_tree


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
