"""hypercorn's per-connection server, driven by our own accept loop (its internals, named only here).

hypercorn's public entry (`hypercorn.trio.serve`) binds and accepts itself and offers no way to
wrap a connection's stream. The debug server needs that (vgpud.observe.serve bounds every write), so
it accepts the connections and hands each to hypercorn's trio `TCPServer`, with the worker context
whose `terminated` event tells keep-alive connections to close. Internals used:

- `hypercorn.trio.tcp_server.TCPServer(app, config, context, state, stream)`, awaited: serves one
  connection; a stream without `do_handshake` is plain TCP, whose `socket` gives the addresses;
- `hypercorn.trio.worker_context.WorkerContext(max_requests)` and its `terminated` event (async `set`);
- `hypercorn.utils.wrap_app(app, wsgi_max_body_size, mode)`: the ASGI app as TCPServer calls it.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import wrap_app


def config(errorlog: logging.Logger) -> Config:
    """hypercorn's settings for vgpud: errors to `errorlog`, no access log, no Server header."""
    conf = Config()
    conf.errorlog = errorlog
    conf.accesslog = None
    conf.include_server_header = False
    return conf


class ConnectionServer:
    """Serves single connections of one ASGI app with hypercorn's HTTP/1.1 and websocket protocol."""

    def __init__(self, app: Any, conf: Config) -> None:
        self._app = wrap_app(app, 0, "asgi")
        self._config = conf
        self._context = WorkerContext(None)

    async def serve(self, stream: trio.abc.HalfCloseableStream) -> None:
        """Serve one accepted connection until it closes; `stream` must have a `socket` attribute."""
        await TCPServer(self._app, self._config, self._context, {}, stream)  # type: ignore[arg-type]

    async def close_idle(self) -> None:
        """Tell every connection to close once it is idle (keep-alive ones at once)."""
        await self._context.terminated.set()
