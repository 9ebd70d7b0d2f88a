"""Serve grpclib handlers from a Trio task (DESIGN §2).

grpclib is asyncio-only; vgpud runs every server inside the one `trio_asyncio.open_loop()` that wraps
the supervisor. `serve` is one component session: it binds, reports ready, serves until cancelled,
and on the way out closes in a shielded block with a bounded wait (on Python 3.12+ `wait_closed`
blocks while a peer such as kubelet keeps its connection open) and removes its own socket file.
Requests are decoded strictly (`StrictProtoCodec`): malformed bytes get INVALID_ARGUMENT, not a
half-parsed message; a handler that must bound what it reads uses `read_unary`. A root-only socket
(`private=True`) is mode 0600 before it listens (`vgpud.sockpath.private_unix_listener`).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
import trio_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from vgpud.compat.grpclib import TruncatedData, listening_sockets, recv_data
from vgpud.grpccodec import StrictProtoCodec
from vgpud.sockpath import SocketIdentity, private_unix_listener, remove_stale_socket, unlink_if_ours
from vgpud.wire import M, MalformedMessage, parse_strict

log = logging.getLogger("vgpud.grpc")

CLOSE_TIMEOUT = 2.0
MESSAGE_PREFIX = struct.Struct(">?I")  # gRPC message framing: compressed flag, length


async def read_unary(stream: Any, message_type: type[M], limit: int) -> M:
    """A unary request of `message_type`, refused from its length prefix when over `limit`
    (RESOURCE_EXHAUSTED).

    grpclib has no receive limit: `Stream.recv_message` reads (and acknowledges) as many bytes as
    the prefix claims. So the frame is read here (vgpud.compat.grpclib.recv_data) and decoded
    strictly (INVALID_ARGUMENT for malformed or truncated bytes: a stream that ends inside the prefix,
    or before the bytes the prefix announces, none at all included).
    """
    name = message_type.__name__
    try:
        prefix = await recv_data(stream, MESSAGE_PREFIX.size)
    except TruncatedData:
        raise GRPCError(Status.INVALID_ARGUMENT, "truncated message prefix") from None
    if len(prefix) < MESSAGE_PREFIX.size:
        raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
    compressed, length = MESSAGE_PREFIX.unpack(prefix)
    if compressed:
        raise GRPCError(Status.UNIMPLEMENTED, "compressed messages are not supported")
    if length > limit:
        raise GRPCError(
            Status.RESOURCE_EXHAUSTED, f"request message of {length} bytes exceeds the limit of {limit}"
        )
    try:
        message = await recv_data(stream, length)
    except TruncatedData:
        message = b""
    if len(message) < length:  # the stream ended inside the message, or right after its prefix
        raise GRPCError(Status.INVALID_ARGUMENT, "truncated request message")
    try:
        return parse_strict(message, message_type)
    except MalformedMessage as err:
        raise GRPCError(Status.INVALID_ARGUMENT, f"malformed {name}: {err}") from None


@dataclass(frozen=True)
class Bound:
    """Where a server listens: a unix socket path, or a TCP host and the port actually bound."""

    path: Path | None = None
    host: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.path is not None else f"{self.host}:{self.port}"


def new_server(handlers: Sequence[Any]) -> Server:
    """A grpclib server with the strict codec; build it inside `trio_asyncio.open_loop()`."""
    return Server(list(handlers), codec=StrictProtoCodec())


async def close_server(server: Server, where: object, close_timeout: float = CLOSE_TIMEOUT) -> None:
    """Stop accepting, cancel the running handlers and wait for them, at most `close_timeout`
    seconds (shielded: this runs while the component is being cancelled)."""
    with trio.CancelScope(shield=True):
        server.close()
        with trio.move_on_after(close_timeout) as waited:
            await trio_asyncio.aio_as_trio(server.wait_closed)()
        if waited.cancelled_caught:
            log.warning(
                "gRPC server on %s: peers still connected after %.1fs; closed anyway", where, close_timeout
            )


async def serve(
    handlers: Sequence[Any],
    *,
    path: Path | None = None,
    host: str | None = None,
    port: int | None = None,
    ready: Callable[[Bound], None] | None = None,
    close_timeout: float = CLOSE_TIMEOUT,
    private: bool = False,
) -> None:
    """Serve `handlers` on a unix socket `path` or on TCP `host:port` until cancelled; `private`: the
    unix socket is root-only (mode 0600 before anyone can connect).

    Must run inside `trio_asyncio.open_loop()`; the grpclib `Server` is built here, inside it.
    """
    if (path is None) == (port is None):
        raise ValueError("serve needs exactly one of path or port")
    if private and path is None:
        raise ValueError("private applies to a unix socket path only")
    server = new_server(handlers)
    identity: SocketIdentity | None = None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if private:
            sock = private_unix_listener(path)
            identity = SocketIdentity.at(path)
            try:
                await trio_asyncio.aio_as_trio(server.start)(sock=sock)
            except BaseException:
                sock.close()
                unlink_if_ours(path, identity)
                raise
        else:
            remove_stale_socket(path)
            await trio_asyncio.aio_as_trio(server.start)(path=str(path))
        identity = SocketIdentity.at(path)
        bound = Bound(path=path)
    else:
        await trio_asyncio.aio_as_trio(server.start)(host=host, port=port)
        sockname = listening_sockets(server)[0].getsockname()  # the real port when port=0
        bound = Bound(host=sockname[0], port=sockname[1])
    log.info("gRPC %s serving on %s", ", ".join(type(h).__name__ for h in handlers), bound)
    try:
        if ready is not None:
            ready(bound)
        await trio.sleep_forever()
    finally:
        await close_server(server, bound, close_timeout)
        if path is not None and identity is not None:
            unlink_if_ours(path, identity)
        log.info("gRPC server on %s closed", bound)
