"""One NRI session over a Trio stream: the mux, a ttrpc server on conn 1, a ttrpc client on conn 2.

The codecs (`mux`, `ttrpc`) do no I/O; this module only moves bytes and runs hooks. Order matters
(nri-protocol.md §0): conn 1 is served before RegisterPlugin goes out on conn 2, because the runtime
may send Configure before it answers the registration. Each request runs in its own task under the
deadline the runtime sent (`timeout_nano`); all frames of one message are written together.

Calls to the runtime (conn 2) share one path, `call_runtime`: RegisterPlugin, whose failure ends the
session, and, once synchronized, the calls other tasks make through the session's `RuntimeLink`
(`vgpud.nri.runtime_link`: an unsolicited UpdateContainers), whose failure is only theirs.

The start-up check that the runtime's NRI socket answers (`probe`) keeps its connection, and the first
session runs on it: a connection that closes without registering is what a broken plugin does, and
the runtime logs it as an error ("failed to start external plugin: failed to register plugin,
connection closed").
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from vgpud import excgroup
from vgpud._pb.nri.pkg.api.v1alpha1 import RegisterPluginRequest
from vgpud.nri import mux, ttrpc
from vgpud.nri.hooks import HookError, NriHooks
from vgpud.nri.methods import plugin_methods
from vgpud.nri.runtime_link import CallFailed, RuntimeLink
from vgpud.nri.sync import gc_paused
from vgpud.sockpath import socket_at
from vgpud.wire import MalformedMessage

log = logging.getLogger("vgpud.nri")

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
REGISTRATION_TIMEOUT = 5.0
PROBE_TIMEOUT = 2.0
READ_SIZE = 256 * 1024
#: distinct method names counted in NriStats.requests; the rest count as "(other)"
COUNTED_METHODS = 64


class SessionEnded(Exception):
    """The runtime closed the connection, broke the framing, or asked the plugin to shut down."""


@dataclass(frozen=True)
class Identity:
    name: str
    idx: str


class NriSession:
    def __init__(
        self, stream: trio.abc.Stream, hooks: NriHooks, identity: Identity, link: RuntimeLink | None = None
    ) -> None:
        self._stream = stream
        self._hooks = hooks
        self._identity = identity
        self._link = link
        #: bare method name -> (decoder, hook, encoder), bound to this session's hooks
        self._methods = plugin_methods(hooks)
        #: why the session ended ("" while it runs): calls still waiting fail with it
        self._ended = ""
        self._mux = mux.MuxDecoder()
        self._server = ttrpc.ServerConnection()
        self._client = ttrpc.ClientConnection()
        self._send_lock = trio.Lock()
        self._replies: dict[int, tuple[trio.Event, list[ttrpc.Reply]]] = {}

    async def run(self, ready: Callable[[], None]) -> None:
        """Register, wait for the first Synchronize, report ready, serve until the session ends
        (always by an exception: a plugin session has no clean end while the runtime lives)."""
        synchronized = self._hooks.begin_session()
        try:
            await self._serve(ready, synchronized)
        except BaseException as exc:
            self._ended = _why_ended(exc)
            self._hooks.end_session(self._ended)
            raise
        finally:
            self._ended = self._ended or "the session ended"
            if self._link is not None:
                self._link.detach(self)
            for done, _ in self._replies.values():  # callers in other tasks stop waiting
                done.set()
            self._replies.clear()

    async def _serve(self, ready: Callable[[], None], synchronized: trio.Event) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read, nursery)
                request = RegisterPluginRequest(
                    plugin_name=self._identity.name, plugin_idx=self._identity.idx
                )
                await self._call("RegisterPlugin", bytes(request), REGISTRATION_TIMEOUT)
                log.info("NRI: registered as %s-%s", self._identity.idx, self._identity.name)
                await synchronized.wait()
                if self._link is not None:
                    self._link.attach(self)
                ready()
        except BaseExceptionGroup as group:
            ended, rest = group.split(SessionEnded)
            if ended is not None and rest is None:  # say why the session ended, not "1 sub-exception"
                raise ended.exceptions[0] from None
            raise

    async def _read(self, nursery: trio.Nursery) -> None:
        while True:
            data = await self._stream.receive_some(READ_SIZE)
            if not data:
                raise SessionEnded("the runtime closed the connection")
            try:
                chunks = self._mux.feed(data)
            except mux.MuxError as err:
                raise SessionEnded(f"mux framing lost: {err}") from err
            for conn_id, chunk in chunks:
                if conn_id == mux.PLUGIN_CONN:
                    for item in self._server.receive(chunk):
                        if isinstance(item, bytes):
                            await self._send(mux.PLUGIN_CONN, item)
                        else:
                            nursery.start_soon(self._handle, item)
                elif conn_id == mux.RUNTIME_CONN:
                    for reply in self._client.receive(chunk):
                        waiter = self._replies.pop(reply.stream_id, None)
                        if waiter is not None:
                            waiter[1].append(reply)
                            waiter[0].set()

    async def _send(self, conn_id: int, message: bytes) -> None:
        async with self._send_lock:  # the frames of one message are never interleaved with another's
            await self._stream.send_all(b"".join(mux.encode(conn_id, message)))

    async def _call(self, method: str, payload: bytes, seconds: float) -> bytes:
        """A call the session cannot go on without: its failure ends the session."""
        try:
            return await self.call_runtime(method, payload, seconds)
        except CallFailed as err:
            raise SessionEnded(str(err)) from None

    async def call_runtime(self, method: str, payload: bytes, seconds: float) -> bytes:
        """One Runtime call, from any task: the reply's payload; CallFailed on an error status (its
        message: the runtime's), no answer within `seconds`, or the connection ending first."""
        if self._ended:
            raise CallFailed(f"the NRI connection ended ({self._ended}) before {method}")
        try:
            stream_id, data = self._client.request(
                RUNTIME_SERVICE, method, payload, timeout_nano=int(seconds * 1e9)
            )
        except ttrpc.TtrpcError as err:
            raise CallFailed(f"{method} not sent: {err}") from None
        done, replies = trio.Event(), []
        self._replies[stream_id] = (done, replies)
        try:
            # a send cancelled half-way would leave a partial frame that breaks the whole connection:
            # the caller's cancellation waits for its few hundred bytes to be written
            with trio.CancelScope(shield=True):
                await self._send(mux.RUNTIME_CONN, data)
            with trio.move_on_after(seconds) as waited:
                await done.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as err:
            raise CallFailed(f"the NRI connection broke while sending {method}: {err}") from None
        finally:
            if self._replies.pop(stream_id, None) is not None and not replies:
                self._client.abandon(stream_id)
        if waited.cancelled_caught:
            raise CallFailed(f"the runtime did not answer {method} within {seconds:g}s")
        if not replies:
            raise CallFailed(f"the NRI connection ended ({self._ended}) before the runtime answered {method}")
        (reply,) = replies
        if reply.error is not None:
            raise CallFailed(f"{method} refused: {reply.error}")
        return reply.payload or b""

    async def _handle(self, request: ttrpc.IncomingRequest) -> None:
        # A Synchronize makes ~100,000 objects; with the collector on, its first pass over them
        # would run inside the runtime's wait (about 8 ms at 10,000 containers): it runs once the
        # reply is sent. Decoding and the rebuild pause it themselves too (`gc_paused` nests).
        bulk = request.service == PLUGIN_SERVICE and request.method == "Synchronize"
        with gc_paused() if bulk else contextlib.nullcontext():
            response = await self._dispatch(request)
            await self._send(mux.PLUGIN_CONN, response)
        if request.service == PLUGIN_SERVICE and request.method == "Shutdown":
            raise SessionEnded("the runtime asked the plugin to shut down")

    async def _dispatch(self, request: ttrpc.IncomingRequest) -> bytes:
        """The reply bytes for one request: the hook's response, or an error status."""
        requests = self._hooks.stats.requests
        method = (
            request.method if request.method in requests or len(requests) < COUNTED_METHODS else "(other)"
        )
        requests[method] = requests.get(method, 0) + 1
        entry = self._methods.get(request.method) if request.service == PLUGIN_SERVICE else None
        if entry is None:
            return self._server.fail(
                request.stream_id,
                ttrpc.Code.UNIMPLEMENTED,
                f"{request.service}/{request.method}: not implemented by vgpud",
            )
        decode, handler, encode = entry
        try:
            message = decode(request.payload)
        except MalformedMessage as err:
            return self._server.fail(request.stream_id, ttrpc.Code.INVALID_ARGUMENT, f"malformed {err}")
        deadline = request.timeout_nano / 1e9 if request.timeout_nano > 0 else float("inf")
        try:
            with trio.fail_after(deadline):
                response = await handler(message)
        except trio.TooSlowError:
            log.warning("NRI: %s ran past the runtime's %.1fs deadline", request.method, deadline)
            return self._server.fail(
                request.stream_id, ttrpc.Code.DEADLINE_EXCEEDED, f"{request.method}: deadline exceeded"
            )
        except HookError as err:
            return self._server.fail(request.stream_id, err.code, str(err))
        except Exception as err:  # a bug must not take the session down; the runtime sees UNKNOWN
            log.exception("NRI: %s failed", request.method)
            return self._server.fail(request.stream_id, ttrpc.Code.UNKNOWN, f"{request.method}: {err!r}")
        return self._server.respond(request.stream_id, encode(response))


def _why_ended(exc: BaseException) -> str:
    """One line for the debug state: why a session ended (the first SessionEnded, else the first
    error; only cancellations: vgpud stopped it)."""
    leaves = list(excgroup.leaves(exc))
    for leaf in leaves:
        if isinstance(leaf, SessionEnded):
            return str(leaf)
    for leaf in leaves:
        if not isinstance(leaf, trio.Cancelled):
            return f"{type(leaf).__name__}: {leaf}"
    return "vgpud stopped the session"


def probe(path: str, timeout: float = PROBE_TIMEOUT) -> socket.socket | str:
    """Blocking (before Trio starts): a socket connected to `path` when something accepts there, else
    why not. Hand the socket to `Dialer`: closing it unregistered leaves an error in the runtime's log."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as err:
        sock.close()
        return err.strerror or str(err)
    return sock


class Dialer:
    """Connections to the runtime's NRI socket: the start-up probe's first (if any), then new ones.

    It remembers which socket it dialed last, so that `replaced` can tell the supervisor when the
    runtime has bound a new one: a restarted containerd is served at once, not after a backoff that
    its earlier restarts grew (containers it creates meanwhile would get no NRI hook)."""

    def __init__(self, path: str, first: socket.socket | None = None, *, poll: float = 0.2) -> None:
        self.path = path
        self._first = first
        self._poll = poll
        self._dialed = socket_at(Path(path)) if first is not None else None

    async def connect(self) -> trio.SocketStream:
        first, self._first = self._first, None
        if first is not None:
            return trio.SocketStream(trio.socket.from_stdlib_socket(first))
        self._dialed = socket_at(Path(self.path))
        try:
            return await trio.open_unix_socket(self.path)
        except OSError as err:
            raise SessionEnded(f"cannot connect to {self.path}: {err.strerror or err}") from err

    async def replaced(self) -> str:
        """Return once a socket other than the one dialed last has sat at the path for a poll
        interval (a runtime binds before it listens); the supervisor's `Restart.wake`. One return per
        new socket, so a runtime that binds and then refuses cannot make vgpud loop without its backoff."""
        seen = None
        while True:
            now = socket_at(Path(self.path))
            if now is not None and now != self._dialed and now == seen:
                return f"the runtime bound a new socket at {self.path}"
            seen = now
            await trio.sleep(self._poll)


async def run_session(
    target: Dialer | str,
    hooks: NriHooks,
    identity: Identity,
    ready: Callable[[], None],
    link: RuntimeLink | None = None,
) -> None:
    """One supervised session: dial the runtime's NRI socket (a path, or a `Dialer` that may hold the
    probe's connection) and serve until the connection ends; `link` carries other tasks' calls to
    the runtime while the session is synchronized."""
    dialer = target if isinstance(target, Dialer) else Dialer(target)
    stream = await dialer.connect()
    async with stream:
        await NriSession(stream, hooks, identity, link).run(ready)
