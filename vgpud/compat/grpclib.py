"""grpclib's internals that vgpud needs (named only here; tests/unit/compat/test_grpclib.py pins them).

- a server `Stream`'s HTTP/2 stream, `stream._stream`, whose `recv_data(n)` reads n bytes of the
  request's DATA frames: grpclib has no receive limit (`Stream.recv_message` reads, and acknowledges,
  as many bytes as a message's prefix claims), so the registry reads the frame itself. grpclib's
  buffer signals a stream that ended inside the n bytes with an AssertionError, turned into
  `TruncatedData` here;
- a server `Stream`'s peer transport, `stream.peer._transport` (`stream.peer` is public, the
  transport it wraps is not): the connection's socket, for SO_PEERCRED;
- a `Server`'s asyncio server, `server._server`: its sockets (the port a TCP server actually bound)
  and its `close()`, which stops accepting but leaves the open connections serving (grpclib's own
  `close()` also cancels their calls).
"""

from __future__ import annotations

import socket
from typing import Any

from grpclib.server import Server


class TruncatedData(EOFError):
    """The request stream ended before the bytes asked for."""


async def recv_data(stream: Any, size: int) -> bytes:
    """`size` bytes of the request's body as sent (a `grpclib.server.Stream`); b"" when the stream has
    ended with nothing left; TruncatedData when it ends inside them."""
    try:
        return await stream._stream.recv_data(size)
    except AssertionError:
        raise TruncatedData(f"the request ended inside {size} bytes") from None


def peer_socket(stream: Any) -> socket.socket | None:
    """The socket of a server stream's connection; None when grpclib no longer keeps it where this
    reads it (the registry then refuses every caller: fail closed)."""
    transport = getattr(getattr(stream, "peer", None), "_transport", None)
    return transport.get_extra_info("socket") if transport is not None else None


def listening_sockets(server: Server) -> list[socket.socket]:
    """The sockets a started server listens on; [] once it is closed or before it started."""
    listener = server._server
    return [] if listener is None else list(listener.sockets)


def stop_accepting(server: Server) -> None:
    """Stop accepting new connections and leave the calls on the open ones running."""
    listener = server._server
    if listener is not None:
        listener.close()
