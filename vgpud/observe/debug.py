"""The observability HTTP servers: one ASGI app served by hypercorn (trio worker).

Routes (GET; anything else is 404 or 405):

    /metrics                  the Prometheus text exposition
    /debug/state?calls=N      the state document (vgpud.observe.state), with the last N calls (20)
    /debug/calls?n=N&FILTER   {"last_seq", "calls": [...]}: the last N (100) matching calls, oldest first
    /debug/stream?FILTER      websocket: every matching call as one JSON text message, as recorded

FILTER: hook=, component=, pod=, claim=, outcome= (vgpud.observe.filters).

Two servers use it. The metrics server (`--metrics-address`, TCP, 127.0.0.1:9464 by default; may be
opened to the network for Prometheus) serves `/metrics` only. The debug server serves everything, on a
unix socket (`<plugins dir>/<driver>/debug.sock`, mode 0600: root only) and optionally on a loopback
TCP address (`--debug-address`): `curl --unix-socket /var/lib/kubelet/plugins/manager.nvidia.com/debug.sock
http://vgpud/debug/state`.

The websocket is hypercorn's own (ASGI), with trio-websocket as the client (`vgpud debug tail`): one
server, one socket, one port for every route, so curl and `vgpud debug` reach all of them at the same
address (trio-websocket's server would need a listener of its own). hypercorn writes under a cancel
shield, so `serve_app` accepts the connections itself and gives hypercorn streams whose writes give up
after WRITE_TIMEOUT: a client that stops reading cannot hold a task, or the shutdown, forever.

The stream's rules:

- a client gets its own recorder subscription; the recorder never waits for it, so hooks are never
  slowed: a client whose buffer fills (`STREAM_BUFFER` calls behind) is dropped by the recorder, gets
  what was buffered and then close code 1008 with the reason (a client that reads nothing at all is
  disconnected after WRITE_TIMEOUT instead);
- on shutdown every client gets close code 1001 (going away) before the server stops;
- a bad filter is refused before the upgrade with HTTP 400 and the reason.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import trio
from hypercorn.config import Config
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from vgpud.observe.filters import CallFilter
from vgpud.observe.metrics import NodeMetrics
from vgpud.observe.state import DebugState, StreamStats
from vgpud.recorder import CloseReason, HookCall, Recorder, Subscription

log = logging.getLogger("vgpud.observe.http")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

#: calls a stream client may be behind before the recorder drops it
STREAM_BUFFER = 1024
DEFAULT_CALLS = 100
DEFAULT_STATE_CALLS = 20
#: on shutdown: how long stream clients get for their 1001 close, then other connections to finish
CLOSE_TIMEOUT = 1.0
GRACEFUL_TIMEOUT = 1.0
#: a connection whose client reads nothing for this long is closed (it would block a task forever)
WRITE_TIMEOUT = 10.0

CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_INTERNAL = 1011
CLOSE_NORMAL = 1000
#: a close frame's reason is at most 123 bytes
MAX_REASON = 123

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"
INDEX = (
    "vgpud observability\n"
    "  GET /metrics\n"
    "  GET /debug/state?calls=N\n"
    "  GET /debug/calls?n=N&hook=&component=&pod=&claim=&outcome=\n"
    "  websocket /debug/stream?hook=&component=&pod=&claim=&outcome=\n"
)


@functools.lru_cache(maxsize=4096)
def encode_call(call: HookCall) -> str:
    """One stream message; cached, so three clients encode each call once."""
    return json.dumps(call.to_dict(), separators=(",", ":"))


def close_for(reason: CloseReason | None, *, stopping: bool, buffer: int) -> tuple[int, str, str]:
    """(close code, close reason, metric label) for a stream that ended."""
    if stopping or reason is CloseReason.RECORDER_CLOSED:
        return CLOSE_GOING_AWAY, "vgpud is shutting down", "shutdown"
    if reason is CloseReason.SLOW:
        return CLOSE_POLICY, f"too slow: more than {buffer} calls behind; reconnect to resume", "slow"
    if reason is CloseReason.FILTER_FAILED:
        return CLOSE_INTERNAL, "the stream filter failed", "filter-failed"
    return CLOSE_NORMAL, "", "closed"


class StreamHub:
    """The `/debug/stream` websocket handler, and its clients at shutdown."""

    def __init__(self, recorder: Recorder, stats: StreamStats, *, buffer: int = STREAM_BUFFER) -> None:
        self._recorder = recorder
        self.stats = stats
        self.buffer = buffer
        self.stopping = trio.Event()
        self._changed = trio.Event()

    def reopen(self) -> None:
        """Accept clients again (a new session of the debug server after a failure)."""
        self.stopping = trio.Event()

    async def close_all(self) -> None:
        """Close every client with 1001 and wait until their handlers have finished."""
        self.stopping.set()
        while self.stats.clients:
            await self._changed.wait()

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        try:
            where = CallFilter.from_query(scope.get("query_string", b""))
        except ValueError as err:
            await _reject_upgrade(send, 400, str(err))
            return
        if self.stopping.is_set():
            await _reject_upgrade(send, 503, "vgpud is shutting down")
            return
        subscription = self._recorder.subscribe(where=where, buffer=self.buffer)
        await send({"type": "websocket.accept"})
        self.stats.clients += 1
        try:
            async with subscription, trio.open_nursery() as nursery:
                nursery.start_soon(_until_disconnect, receive, nursery.cancel_scope)
                nursery.start_soon(self._until_stopping, subscription)
                async for call in subscription:
                    await send({"type": "websocket.send", "text": encode_call(call)})
                code, reason, label = close_for(
                    subscription.close_reason, stopping=self.stopping.is_set(), buffer=self.buffer
                )
                self.stats.closed[label] += 1
                if label != "shutdown":
                    log.info("debug stream: closing a client (%s): %s", code, reason)
                await send({"type": "websocket.close", "code": code, "reason": reason[:MAX_REASON]})
                nursery.cancel_scope.cancel()
        finally:
            self.stats.clients -= 1
            self._changed.set()
            self._changed = trio.Event()

    async def _until_stopping(self, subscription: Subscription) -> None:
        await self.stopping.wait()
        subscription.close()


async def _until_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    """Read (and ignore) what the client sends; end the handler when it goes."""
    while (await receive())["type"] != "websocket.disconnect":
        pass
    scope.cancel()


async def _reject_upgrade(send: Send, status: int, message: str) -> None:
    """An HTTP answer instead of the upgrade (the ASGI websocket.http.response extension)."""
    body = (message + "\n").encode()
    await send(
        {
            "type": "websocket.http.response.start",
            "status": status,
            "headers": [(b"content-type", TEXT_TYPE.encode()), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "websocket.http.response.body", "body": body})


class ObserveApp:
    """The ASGI app. Without `state` and `hub` it is the metrics server: `/metrics` only."""

    def __init__(
        self, metrics: NodeMetrics, *, state: DebugState | None = None, hub: StreamHub | None = None
    ) -> None:
        self._metrics = metrics
        self._state = state
        self._hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
        elif kind == "websocket":
            if scope["path"] == "/debug/stream" and self._hub is not None:
                await self._hub.serve(scope, receive, send)
            else:
                await receive()
                await _reject_upgrade(send, 404, f"no websocket at {scope['path']}")
        elif kind == "http":
            status, body, content_type = await self._http(scope)
            await _respond(send, status, body, content_type)

    async def _http(self, scope: Scope) -> tuple[int, bytes, str]:
        path, method = scope["path"], scope["method"]
        routes = {"/metrics"} | ({"/", "/debug/state", "/debug/calls"} if self._state is not None else set())
        if path not in routes:
            return 404, f"not found: {path}\n".encode(), TEXT_TYPE
        if method not in ("GET", "HEAD"):
            return 405, f"{method} not allowed: GET only\n".encode(), TEXT_TYPE
        if path == "/metrics":
            body, content_type = self._metrics.exposition()
            return 200, body, content_type
        if path == "/":
            return 200, INDEX.encode(), TEXT_TYPE
        query = scope.get("query_string", b"")
        try:
            document = await (self._debug_state(query) if path == "/debug/state" else self._calls(query))
        except ValueError as err:
            return 400, f"{err}\n".encode(), TEXT_TYPE
        return 200, json.dumps(document, indent=1).encode() + b"\n", JSON_TYPE

    async def _debug_state(self, query: bytes) -> dict[str, Any]:
        assert self._state is not None
        calls = _int_param(query, "calls", DEFAULT_STATE_CALLS, allowed={"calls"})
        return await self._state.snapshot(calls=calls)

    async def _calls(self, query: bytes) -> dict[str, Any]:
        assert self._state is not None
        where = CallFilter.from_query(query, extra=frozenset({"n"}))
        n = _int_param(query, "n", DEFAULT_CALLS, allowed=frozenset(CallFilter.names()) | {"n"})
        recorder = self._state.parts.recorder
        return {
            "last_seq": recorder.last_seq,
            "calls": [c.to_dict() for c in recorder.recent(n, where=where)],
        }


def _int_param(query: bytes, name: str, default: int, *, allowed: set[str] | frozenset[str]) -> int:
    params = parse_qs(query.decode("latin-1"), keep_blank_values=True)
    unknown = set(params) - set(allowed)
    if unknown:
        raise ValueError(f"unknown parameter(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    raw = params.get(name, [str(default)])[-1]
    if not raw.isdigit():
        raise ValueError(f"{name}={raw!r} is not a non-negative integer")
    return int(raw)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------------------------------------
# Listening sockets and the server


def tcp_listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def unix_listener(path: Path) -> socket.socket:
    """A listening unix socket at `path`, mode 0600 before anyone can connect; a stale socket file is
    replaced, anything else at `path` is an error (never deleted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise FileExistsError(errno.EEXIST, "exists and is not a socket; not replacing it", str(path))
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o600)  # before listen(): until then every connect is refused
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


def _config() -> Config:
    config = Config()
    config.errorlog = logging.getLogger("vgpud.observe.hypercorn")
    config.accesslog = None
    config.include_server_header = False
    return config


class _BoundedStream(trio.abc.HalfCloseableStream):
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

    The connections are accepted here (trio.serve_listeners) and handed to hypercorn's TCPServer, so
    that each is a `_BoundedStream`. Stopping: `before_stop` (closing stream clients with 1001) for at
    most CLOSE_TIMEOUT, no more accepting, idle keep-alive connections closed, GRACEFUL_TIMEOUT for the
    rest, then every connection still open is aborted; so the stop is bounded whatever clients do.
    """
    config, context, wrapped = _config(), WorkerContext(None), wrap_app(app, 0, "asgi")
    open_streams: set[_BoundedStream] = set()
    stopping, drained = trio.Event(), trio.Event()

    async def connection(stream: trio.SocketStream) -> None:
        bounded = _BoundedStream(stream)
        open_streams.add(bounded)
        try:
            await TCPServer(wrapped, config, context, ConnectionState({}), bounded)  # type: ignore[arg-type]
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
                await context.terminated.set()  # idle keep-alive connections close now
                with trio.move_on_after(GRACEFUL_TIMEOUT):
                    if open_streams:
                        await drained.wait()
                for stream in list(open_streams):
                    stream.abort()
                connections.cancel_scope.cancel()

    unix_paths = [s.getsockname() for s in listeners if s.family == socket.AF_UNIX]
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
                os.unlink(path)


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
            listeners.append(unix_listener(unix_path))
        if address is not None:
            listeners.append(tcp_listener(*address))
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    log.info("debug: serving %s", ", ".join(describe_listener(s) for s in listeners))
    await serve_app(app, listeners, ready, before_stop=hub.close_all)
