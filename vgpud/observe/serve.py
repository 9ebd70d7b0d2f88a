"""The observability servers: the app served by hypercorn (trio) on our listeners, with bounded stops.

Two servers use it. The metrics server (`--metrics-address`, TCP, 127.0.0.1:9464 by default; may be
opened to the network for Prometheus) serves `/metrics` only. The debug server serves every route
(vgpud.observe.app), on a unix socket (`<plugins dir>/<driver>/debug.sock`, mode 0600: root only) and
optionally on a loopback TCP address (`--debug-address`): `curl --unix-socket
/var/lib/kubelet/plugins/manager.nvidia.com/debug.sock http://vgpud/debug/state`.

The websocket is hypercorn's own (ASGI), with trio-websocket as the client (`vgpud debug tail`): one
server, one socket, one port for every route, so curl and `vgpud debug` reach all of them at the same
address (trio-websocket's server would need a listener of its own). hypercorn writes under a cancel
shield, so `serve_app` accepts the connections itself and gives hypercorn (vgpud.compat.hypercorn)
streams whose writes give up after WRITE_TIMEOUT: a client that stops reading cannot hold a task, or
the shutdown, forever.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import trio

from vgpud.compat import hypercorn
from vgpud.observe.app import ObserveApp
from vgpud.observe.hub import StreamHub
from vgpud.observe.listeners import describe_listener, tcp_listener
from vgpud.observe.metrics import NodeMetrics
from vgpud.sockpath import SocketIdentity, private_unix_listener, unlink_if_ours

log = logging.getLogger("vgpud.observe.http")

#: on shutdown: how long stream clients get for their 1001 close, then other connections to finish
CLOSE_TIMEOUT = 1.0
GRACEFUL_TIMEOUT = 1.0
#: a connection whose client reads nothing for this long is closed (it would block a task forever)
WRITE_TIMEOUT = 10.0


class BoundedStream(trio.abc.HalfCloseableStream):
    """A connection whose writes give up after WRITE_TIMEOUT without progress.

    hypercorn writes under a cancel shield it never lifts (`TCPServer.protocol_send`), so a client that
    stops reading would hold its connection task, and hypercorn's shutdown with it, forever. The bound
    here sits below that shield; `abort` closes the socket from outside at shutdown.
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self.socket = stream.socket  # hypercorn reads the peer and local address from it

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with trio.move_on_after(WRITE_TIMEOUT) as waited:
            await self._stream.send_all(data)
        if waited.cancelled_caught:
            log.info("debug http: a client read nothing for %.0f s; closing its connection", WRITE_TIMEOUT)
            self.abort()
            raise trio.BrokenResourceError("the client stopped reading")

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self._stream.aclose()

    def abort(self) -> None:
        """Close the socket now; a task blocked writing or reading it wakes up with an error."""
        self._stream.socket.close()


async def serve_app(
    app: ObserveApp,
    listeners: list[socket.socket],
    ready: Callable[[], None],
    *,
    before_stop: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve `app` with hypercorn's HTTP/1.1 and websocket protocol on `listeners` until cancelled.

    The connections are accepted here (trio.serve_listeners) and handed to hypercorn, so that each is
    a `BoundedStream`. Stopping: `before_stop` (closing stream clients with 1001) for at most
    CLOSE_TIMEOUT, no more accepting, idle keep-alive connections closed, GRACEFUL_TIMEOUT for the
    rest, then every connection still open is aborted; so the stop is bounded whatever clients do.
    """
    connections_server = hypercorn.ConnectionServer(
        app, hypercorn.config(logging.getLogger("vgpud.observe.hypercorn"))
    )
    open_streams: set[BoundedStream] = set()
    stopping, drained = trio.Event(), trio.Event()

    async def connection(stream: trio.SocketStream) -> None:
        bounded = BoundedStream(stream)
        open_streams.add(bounded)
        try:
            await connections_server.serve(bounded)
        finally:
            open_streams.discard(bounded)
            if not open_streams and stopping.is_set():
                drained.set()

    async def server() -> None:
        with trio.CancelScope(shield=True):  # ends by `stopping`, in the orderly way below
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as accepting:
                    trio_listeners = [
                        trio.SocketListener(trio.socket.from_stdlib_socket(s)) for s in listeners
                    ]
                    accepting.start_soon(
                        partial(trio.serve_listeners, connection, trio_listeners, handler_nursery=connections)
                    )
                    await stopping.wait()
                    accepting.cancel_scope.cancel()
                await connections_server.close_idle()  # idle keep-alive connections close now
                with trio.move_on_after(GRACEFUL_TIMEOUT):
                    if open_streams:
                        await drained.wait()
                for stream in list(open_streams):
                    stream.abort()
                connections.cancel_scope.cancel()

    unix_paths = [Path(s.getsockname()) for s in listeners if s.family == socket.AF_UNIX]
    identities = {path: SocketIdentity.at(path) for path in unix_paths}
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server)
            try:
                ready()
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    if before_stop is not None:
                        with trio.move_on_after(CLOSE_TIMEOUT):
                            await before_stop()
                    stopping.set()
    finally:
        for sock in listeners:
            sock.close()
        for path in unix_paths:
            with contextlib.suppress(OSError):
                unlink_if_ours(path, identities[path])


async def run_metrics_server(
    metrics: NodeMetrics, address: tuple[str, int], ready: Callable[[], None]
) -> None:
    """The `metrics` component: `/metrics` on a TCP address."""
    listener = tcp_listener(*address)
    log.info("metrics: serving %s/metrics", describe_listener(listener))
    await serve_app(ObserveApp(metrics), [listener], ready)


async def run_debug_server(
    app: ObserveApp,
    hub: StreamHub,
    ready: Callable[[], None],
    *,
    unix_path: Path | None,
    address: tuple[str, int] | None,
) -> None:
    """The `debug-http` component: every route on the unix socket and/or a loopback TCP address."""
    hub.reopen()
    listeners = []
    try:
        if unix_path is not None:
            listeners.append(private_unix_listener(unix_path))
        if address is not None:
            listeners.append(tcp_listener(*address))
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    log.info("debug: serving %s", ", ".join(describe_listener(s) for s in listeners))
    await serve_app(app, listeners, ready, before_stop=hub.close_all)
