"""Serve grpclib handlers from a Trio task (DESIGN §2).

grpclib is asyncio-only; vgpud runs every server inside the one `trio_asyncio.open_loop()` that wraps
the supervisor. `serve` is one component session: it binds, reports ready, serves until cancelled,
and on the way out closes in a shielded block with a bounded wait (on Python 3.12+ `wait_closed`
blocks while a peer such as kubelet keeps its connection open) and removes its own socket file.
Requests are decoded strictly (`StrictProtoCodec`): malformed bytes get INVALID_ARGUMENT, not a
half-parsed message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
import trio_asyncio
from grpclib.server import Server

from vgpud.compat.grpclib import listening_sockets
from vgpud.grpccodec import StrictProtoCodec
from vgpud.sockpath import SocketIdentity, remove_stale_socket, unlink_if_ours

log = logging.getLogger("vgpud.grpc")

CLOSE_TIMEOUT = 2.0


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
) -> None:
    """Serve `handlers` on a unix socket `path` or on TCP `host:port` until cancelled.

    Must run inside `trio_asyncio.open_loop()`; the grpclib `Server` is built here, inside it.
    """
    if (path is None) == (port is None):
        raise ValueError("serve needs exactly one of path or port")
    server = new_server(handlers)
    identity: SocketIdentity | None = None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
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
