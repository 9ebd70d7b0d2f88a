"""The observability servers' listening sockets: TCP, and a root-only unix socket."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

from vgpud.sockpath import remove_stale_socket


def tcp_listener(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)

    def bind() -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))

    return _listening(sock, bind)


def unix_listener(path: Path) -> socket.socket:
    """A listening unix socket at `path`, mode 0600 before anyone can connect; a stale socket file is
    replaced, anything else at `path` is an error (never deleted: vgpud.sockpath)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def bind() -> None:
        sock.bind(str(path))
        os.chmod(path, 0o600)  # before listen(): until then every connect is refused

    return _listening(sock, bind)


def _listening(sock: socket.socket, bind: Callable[[], None]) -> socket.socket:
    """`sock` bound by `bind`, listening and non-blocking; closed if any step fails."""
    try:
        bind()
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def describe_listener(sock: socket.socket) -> str:
    if sock.family == socket.AF_UNIX:
        return f"unix:{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
