"""The one stale-socket rule and the ownership-checked unlink (vgpud.sockpath), on real files."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from vgpud.sockpath import (
    SocketIdentity,
    SocketPathError,
    check_socket_path,
    path_state,
    remove_stale_socket,
    unlink_if_ours,
)


def _bind(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    return sock


def test_a_stale_socket_is_removed(short_tmp: Path) -> None:
    path = short_tmp / "s.sock"
    _bind(path).close()  # the file stays, as after a crash
    assert check_socket_path(path)
    remove_stale_socket(path)
    assert not path.exists()
    remove_stale_socket(path)  # nothing there: nothing to do
    assert not check_socket_path(path)


@pytest.mark.parametrize("kind", ["file", "directory", "symlink to a socket"])
def test_anything_but_a_socket_is_refused_and_kept(short_tmp: Path, kind: str) -> None:
    path = short_tmp / "s.sock"
    if kind == "file":
        path.write_text("not a socket")
    elif kind == "directory":
        path.mkdir()
    else:
        _bind(short_tmp / "real.sock").close()
        path.symlink_to(short_tmp / "real.sock")
    with pytest.raises(SocketPathError, match="is not a socket"):
        remove_stale_socket(path)
    assert path.is_symlink() if kind.startswith("symlink") else path.exists()
    assert isinstance(SocketPathError("x"), FileExistsError)


def test_unlink_if_ours_leaves_a_successors_socket(short_tmp: Path) -> None:
    path = short_tmp / "s.sock"
    with _bind(path):  # still open (serving) while a successor takes the path over
        ours = SocketIdentity.at(path)
        assert path_state(path, ours) == "ours"
        path.unlink()
        assert path_state(path, ours) == "missing"
        with _bind(path):
            assert path_state(path, ours) == "other"
            assert not unlink_if_ours(path, ours)
            assert path.exists()
            assert unlink_if_ours(path, SocketIdentity.at(path))
            assert not path.exists()
        assert not unlink_if_ours(path, ours)  # gone already: nothing to do
