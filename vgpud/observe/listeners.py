"""The observability servers' TCP listening sockets (the root-only unix one is
`vgpud.sockpath.private_unix_listener`)."""

from __future__ import annotations

import socket
from collections.abc import Callable


def tcp_listener(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)

    def bind() -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))

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
