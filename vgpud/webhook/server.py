"""The webhook's HTTPS server: Trio TCP listeners, `trio.SSLStream`, HTTP/1.1 through h11.

Why not hypercorn (which serves the daemon's debug HTTP): it builds its SSLContext once, from certfile
and keyfile, when it starts, so a renewed certificate would need a restart. Here every accepted
connection is wrapped with the context current at that moment (`tls.ReloadingTls`), which gives reload
without restart; and the HTTP this server needs is small enough to own outright: three routes, bodies
bounded, every phase under a timeout, keep-alive for the API server's connection pool.

Routes: POST /validate (AdmissionReview, any query string: the API server adds `?timeout=10s`),
GET /healthz, GET /metrics. A body that is not a review gets 400 with the reason as text; a body over
the limit gets 400 (the reason names the limit) before it is read; malformed HTTP gets 400; a request
that does not arrive in time gets 408. Whatever a client sends, only its own connection ends: the
server keeps serving. Each answer is written in one write, so it arrives whole or not at all; a
failed TLS handshake is logged with its cause (plain HTTP, an untrusted certificate, no common TLS
version), which is what an operator needs when the API server cannot call the webhook.

On SIGTERM the process calls `drain()` and keeps serving for its shutdown delay (vgpud.webhook.main),
as Go's `Server.Shutdown` after a preStop sleep: /healthz answers 503 "draining", every answer carries
`Connection: close`, kept-alive connections idle between requests close at once, a request already
begun gets its answer and a new connection one answer; so the API server, which learns a moment late
that the pod is going, loses no review to a connection cut under it.
"""

from __future__ import annotations

import errno
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import h11
import trio

from vgpud.recorder import HookCall, Outcome
from vgpud.webhook.admit import Admitter, result_of
from vgpud.webhook.cpu import INLINE_BODY_BYTES
from vgpud.webhook.metrics import WebhookMetrics
from vgpud.webhook.review import BadReview, encode, parse_review, review_response

log = logging.getLogger("vgpud.webhook.server")

MIB = 1 << 20
#: the API server sends object and oldObject, each up to etcd's 1.5 MiB default, JSON-encoded
MAX_BODY = 6 * MIB
#: request line plus headers
MAX_HEADER = 16 * 1024
RECEIVE_CHUNK = 64 * 1024
#: kinds the metrics label by name; any other resource is "other" (a client cannot grow the label set)
KNOWN_KINDS = frozenset({"pods", "resourceclaims", "resourceclaims/status"})
_STATUS_TEXT = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


@dataclass(frozen=True)
class Limits:
    max_body: int = MAX_BODY
    handshake_timeout: float = 10.0
    #: from the first byte of a request to its last
    request_timeout: float = 15.0
    #: for writing an answer (a client that does not read it loses its connection)
    write_timeout: float = 15.0
    #: keep-alive between requests: above Go's 90 s idle timeout, so the API server closes first and
    #: never sends a review into a connection this side is closing
    idle_timeout: float = 120.0
    max_connections: int = 512
    #: after an error answer, read (and drop) what the client still sends until it closes or is quiet
    #: for this long (at most 2 * max_body bytes, within request_timeout): closing while its bytes
    #: are unread would reset the connection, and the reset throws away the answer the client has
    #: not read yet
    linger: float = 2.0


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False


def text(
    status: int, message: str, *, close: bool = False, headers: tuple[tuple[str, str], ...] = ()
) -> Response:
    return Response(status, (message + "\n").encode(), headers=headers, close=close)


class _HttpError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class WebhookServer:
    def __init__(
        self,
        admitter: Admitter,
        tls: Callable[[], ssl.SSLContext],
        metrics: WebhookMetrics,
        *,
        healthy: Callable[[], bool] = lambda: True,
        limits: Limits | None = None,
    ) -> None:
        """`tls()` returns the ssl.SSLContext for the next connection (ReloadingTls's, current)."""
        self._admitter = admitter
        self._tls = tls
        self._metrics = metrics
        self._healthy = healthy
        self.limits = limits or Limits()
        self.open_connections = 0
        self._draining = False
        #: the idle waits of kept-alive connections between two requests, which drain() cancels
        self._idle: set[trio.CancelScope] = set()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def idle_connections(self) -> int:
        """Kept-alive connections waiting for their next request (the ones drain() closes)."""
        return len(self._idle)

    def drain(self) -> None:
        """Make the API server stop using this replica before it stops, as Go's Server.Shutdown does:
        /healthz fails, every answer says `Connection: close`, kept-alive connections idle between
        requests close now and others when they go idle; a request already begun gets its answer, and
        a new connection still gets one (the API server dials this pod until it learns it is going).
        Idempotent."""
        if self._draining:
            return
        self._draining = True
        for scope in self._idle:
            scope.cancel()

    async def serve(
        self, listeners: Sequence[trio.SocketListener], ready: Callable[[], None] | None = None
    ) -> None:
        """Accept on every listener until cancelled; the listeners stay open (the caller owns them)."""
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept, listener, nursery)
            if ready is not None:
                ready()

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except trio.ClosedResourceError:
                return  # its owner closed the listener: serving is over
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS):
                    log.error("accept failed (%s): pausing 100 ms", err)
                    await trio.sleep(0.1)
                    continue
                raise
            if self.open_connections >= self.limits.max_connections:
                log.warning("%d connections open: refusing one", self.open_connections)
                await trio.aclose_forcefully(stream)
                continue
            nursery.start_soon(self._connection, stream)

    async def _connection(self, tcp: trio.SocketStream) -> None:
        self.open_connections += 1
        stream: trio.abc.AsyncResource = tcp
        try:
            stream = tls = trio.SSLStream(tcp, self._tls(), server_side=True, https_compatible=True)
            if await self._handshake(tls, _peer(tcp)):
                await self._http(tls)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away: nothing to answer
        except Exception:
            log.exception("connection failed; the server goes on")
        finally:
            self.open_connections -= 1
            await trio.aclose_forcefully(stream)

    async def _handshake(self, tls: trio.SSLStream[trio.SocketStream], peer: str) -> bool:
        """True when the TLS handshake completed; otherwise one log line that says why not."""
        try:
            with trio.move_on_after(self.limits.handshake_timeout) as scope:
                await tls.do_handshake()
        except trio.BrokenResourceError as err:
            cause = err.__cause__
            if isinstance(cause, ssl.SSLError) and not isinstance(cause, ssl.SSLEOFError):
                log.warning("TLS handshake with %s failed: %s", peer, handshake_failure(cause))
            else:
                log.info("TLS handshake with %s failed: the client closed the connection (%s)", peer, cause)
            return False
        if scope.cancelled_caught:
            log.info(
                "TLS handshake with %s failed: not finished within %gs", peer, self.limits.handshake_timeout
            )
            return False
        return True

    async def _http(self, stream: trio.SSLStream[trio.SocketStream]) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER)
        kept_alive = False
        while True:
            try:
                received = await self._read_request(conn, stream, kept_alive)
            except _HttpError as err:
                self._bad_request(err.reason)
                await self._send_error(stream, text(err.status, err.reason, close=True))
                await self._linger(stream)
                return
            if received is None:
                return
            request, body = received
            response = await self._route(request, body)
            if self._draining and not response.close:
                response = replace(response, close=True)  # the client dials another replica next time
            await self._send(conn, stream, response, head=request.method == b"HEAD")
            if response.close or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                await self._linger(stream)
                return
            conn.start_next_cycle()
            kept_alive = True

    async def _read_request(
        self, conn: h11.Connection, stream: trio.SSLStream[trio.SocketStream], kept_alive: bool
    ) -> tuple[h11.Request, bytes] | None:
        """The next request and its body; None when the client closed (or idled out, or drain() closed
        it) between requests. `kept_alive`: the connection has answered a request before."""
        limits = self.limits
        request: h11.Request | None = None
        body = bytearray()
        pending, closed = conn.trailing_data
        if not pending and not closed:
            first = await self._wait_for_request(stream, kept_alive)
            if not first:
                return None
            conn.receive_data(first)
        begun = bool(conn.trailing_data[0])
        with trio.move_on_after(limits.request_timeout):
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError as err:
                    raise _HttpError(err.error_status_hint, f"malformed HTTP request: {err}") from None
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(RECEIVE_CHUNK))
                elif isinstance(event, h11.Request):
                    request = event
                    size = len(event.target) + sum(
                        len(name) + len(value) + 4 for name, value in event.headers
                    )
                    if size > MAX_HEADER:  # h11 bounds only a header still incomplete after one read
                        raise _HttpError(431, f"request headers are over the limit of {MAX_HEADER} bytes")
                    length = _content_length(event)
                    if length is not None and length > limits.max_body:
                        raise _HttpError(
                            400, f"request body of {length} bytes is over the limit of {limits.max_body}"
                        )
                    if conn.client_is_waiting_for_100_continue:
                        await stream.send_all(
                            conn.send(h11.InformationalResponse(status_code=100, headers=[]))
                        )
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > limits.max_body:
                        raise _HttpError(400, f"request body is over the limit of {limits.max_body} bytes")
                elif isinstance(event, h11.EndOfMessage):
                    assert request is not None
                    return request, bytes(body)
                elif isinstance(event, h11.ConnectionClosed):
                    if begun:
                        raise _HttpError(400, "the connection closed in the middle of the request")
                    return None
        if begun:
            raise _HttpError(408, f"the request did not arrive completely within {limits.request_timeout:g}s")
        return None

    async def _wait_for_request(self, stream: trio.SSLStream[trio.SocketStream], kept_alive: bool) -> bytes:
        """The first bytes of the next request; b"" when the client closed or was idle for idle_timeout.

        A kept-alive connection's wait is drain()'s to cancel (b"" too): it has had its answer, and
        its client's pool dials anew, soon only replicas that stay. A new connection's is not: it was
        dialled for a request, which it gets. The wait has its own scope, so a cancel that comes once
        the first bytes are in never cuts the request they begin."""
        with trio.move_on_after(self.limits.idle_timeout) as scope:
            if kept_alive:
                if self._draining:
                    return b""
                self._idle.add(scope)
            try:
                return await stream.receive_some(RECEIVE_CHUNK)
            finally:
                self._idle.discard(scope)
        return b""

    async def _route(self, request: h11.Request, body: bytes) -> Response:
        path = request.target.decode("ascii", "replace").partition("?")[0]
        method = request.method.decode("ascii", "replace")
        if path == "/validate":
            if method != "POST":
                return text(405, "use POST for admission reviews", headers=(("allow", "POST"),))
            return await self._review(body)
        if path in ("/healthz", "/metrics"):
            if method not in ("GET", "HEAD"):
                return text(405, f"use GET for {path}", headers=(("allow", "GET, HEAD"),))
            if path == "/metrics":
                data, content_type = self._metrics.exposition()
                return Response(200, data, content_type)
            if self._draining:
                return text(503, "draining")
            return text(200, "ok") if self._healthy() else text(503, "unhealthy")
        return text(404, f"no route {path}: POST /validate, GET /healthz, GET /metrics")

    async def _review(self, body: bytes) -> Response:
        started = time.perf_counter()
        try:
            # a large body is decoded in a worker thread, as the rules over a large pod are (cpu.py)
            request = await self._admitter.cpu.run(len(body) > INLINE_BODY_BYTES, parse_review, body)
        except BadReview as err:
            self._bad_request(err.reason)
            return text(400, f"bad AdmissionReview: {err.reason}")
        decision = await self._admitter.decide(request)
        kind = request.resource_path if request.resource_path in KNOWN_KINDS else "other"
        self._metrics.review(kind, request.operation, result_of(decision), time.perf_counter() - started)
        return Response(200, encode(review_response(request.uid, decision)), "application/json")

    def _bad_request(self, reason: str) -> None:
        log.info("bad request: %s", reason)
        self._metrics.review("-", "-", "bad_request")
        self._admitter.recorder.record(
            HookCall(component="webhook", call="AdmissionReview", outcome=Outcome.REJECTED, detail=reason)
        )

    async def _send(
        self,
        conn: h11.Connection,
        stream: trio.SSLStream[trio.SocketStream],
        response: Response,
        *,
        head: bool = False,
    ) -> None:
        """The answer, under the request timeout; a HEAD gets the headers only (h11 insists)."""
        headers = [
            ("content-type", response.content_type),
            ("content-length", str(len(response.body))),
            *response.headers,
        ]
        if response.close:
            headers.append(("connection", "close"))
        reason = _STATUS_TEXT.get(response.status, b"")
        data = conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
        if response.body and not head:
            data += conn.send(h11.Data(data=response.body))
        data += conn.send(h11.EndOfMessage())
        if not await self._write(stream, data):
            raise trio.BrokenResourceError("the client did not read the answer in time")

    async def _send_error(self, stream: trio.SSLStream[trio.SocketStream], response: Response) -> None:
        """An error answer written directly: whatever state h11 is in after bad input (a request that
        never completed, a protocol error), the connection closes after it anyway."""
        status = f"HTTP/1.1 {response.status} {_STATUS_TEXT.get(response.status, b'').decode()}\r\n"
        head = f"content-type: {response.content_type}\r\ncontent-length: {len(response.body)}\r\n"
        await self._write(stream, f"{status}{head}connection: close\r\n\r\n".encode() + response.body)

    async def _write(self, stream: trio.SSLStream[trio.SocketStream], data: bytes) -> bool:
        """One whole answer in one write, under the write timeout; False when it ran out.

        One write, not head and body apart: the deadline is only looked at when a write starts or
        blocks, so a process held up between two writes (a loaded machine) would otherwise find it
        passed after the head, and the close that follows would cut the answer in two."""
        with trio.move_on_after(self.limits.write_timeout) as scope:
            await stream.send_all(data)
        return not scope.cancelled_caught

    async def _linger(self, stream: trio.SSLStream[trio.SocketStream]) -> None:
        """Drain what the client still sends (a body it writes before it reads the answer) while it
        keeps sending, so the close that follows is a clean one."""
        limits = self.limits
        drained = 0
        with trio.move_on_after(limits.request_timeout):
            while drained <= 2 * limits.max_body:
                with trio.move_on_after(limits.linger):
                    data = await stream.receive_some(RECEIVE_CHUNK)
                    if not data:
                        return
                    drained += len(data)
                    continue
                return  # quiet for `linger`: it has read the answer, or is not going to


#: OpenSSL's reason for a failed server handshake -> what it means for the webhook's operator
_HANDSHAKE_HINTS = {
    "HTTP_REQUEST": "plain HTTP sent to the HTTPS port",
    "TLSV1_ALERT_UNKNOWN_CA": "the client does not trust the serving certificate's CA "
    "(is the caBundle of the webhook configuration this certificate's CA?)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the client rejected the serving certificate (is the caBundle of "
    "the webhook configuration its CA, and does it name the host the client dials?)",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the client rejected the serving certificate",
    "TLSV1_ALERT_PROTOCOL_VERSION": "the client offers no TLS version this server accepts (TLS 1.2+)",
    "UNSUPPORTED_PROTOCOL": "the client offers no TLS version this server accepts (TLS 1.2+)",
    "WRONG_VERSION_NUMBER": "the client does not speak TLS 1.2+ (a wrong protocol or version)",
    "NO_SHARED_CIPHER": "no cipher suite in common with the client",
}


def handshake_failure(err: ssl.SSLError) -> str:
    """A failed handshake's cause in words, with OpenSSL's reason: `plain HTTP ... (HTTP_REQUEST)`."""
    reason = err.reason or type(err).__name__
    hint = _HANDSHAKE_HINTS.get(reason)
    return f"{hint} ({reason})" if hint else f"{err.strerror or err} ({reason})"


def _peer(tcp: trio.SocketStream) -> str:
    try:
        host, port = tcp.socket.getpeername()[:2]
    except OSError:
        return "a client that has gone"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)  # h11 has checked it is a number
    return None
