"""The HTTPS server in process, over real TLS on 127.0.0.1: routes, keep-alive, every kind of bad
request answered with a clear status and reason while the server keeps serving, and certificate reload
without restart."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import shutil
import socket
import ssl
import subprocess
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests import objects as o
from tests.unit.webhook.builders import POLICY, FakeLookup, review, spec_claim
from vgpud.metrics_names import WEBHOOK_PRESET_RESULTS, WEBHOOK_PRESET_REVIEWS
from vgpud.webhook.admit import Admitter
from vgpud.webhook.metrics import WebhookMetrics
from vgpud.webhook.server import Limits, WebhookServer
from vgpud.webhook.tls import ReloadingTls, SelfSigned, TlsError, ensure_self_signed

GPU = spec_claim("gpu-claim", o.exactly("r0"))
HOSTS = ("localhost", "127.0.0.1")
LIMITS = Limits(
    max_body=64 * 1024,
    handshake_timeout=0.5,
    request_timeout=0.5,
    idle_timeout=1.0,
    max_connections=8,
    linger=0.5,
    write_timeout=5.0,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> SelfSigned:
    return ensure_self_signed(tmp_path_factory.mktemp("certs"), HOSTS)


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> SelfSigned:
    return ensure_self_signed(tmp_path_factory.mktemp("other"), HOSTS)


@dataclass
class Running:
    port: int
    ca: Path
    metrics: WebhookMetrics
    admitter: Admitter
    server: WebhookServer
    tls: ReloadingTls

    def client_context(self, ca: Path | None = None) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(ca or self.ca))

    async def connect(self, ca: Path | None = None) -> trio.SSLStream[trio.SocketStream]:
        """A TLS connection, handshake done (so a certificate the CA does not sign fails here)."""
        stream = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1", self.port, ssl_context=self.client_context(ca), https_compatible=True
        )
        try:
            await stream.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return stream


@pytest.fixture
def live_certs(certs: SelfSigned, tmp_path: Path) -> Iterator[SelfSigned]:
    """A copy of the certificate files the test may replace."""
    copy = SelfSigned(tmp_path / "ca.crt", tmp_path / "tls.crt", tmp_path / "tls.key")
    for source, target in zip((certs.ca, certs.cert, certs.key), (copy.ca, copy.cert, copy.key), strict=True):
        shutil.copyfile(source, target)
    yield copy


class StallingStream(trio.abc.Stream):
    """A server-side TCP stream that, once `stalls.armed`, holds the whole process (a blocking sleep,
    no checkpoint) right after each write has reached the kernel: what a loaded machine does to a
    process between two system calls. Then it calls `stalls.then`: what else happened meanwhile."""

    def __init__(self, inner: trio.SocketStream, stalls: Stalls) -> None:
        self.inner, self.stalls, self.socket = inner, stalls, inner.socket

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)
        if self.stalls.armed:
            time.sleep(self.stalls.seconds)  # noqa: ASYNC251 - the point: a stall without a checkpoint
            self.stalls.then()

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Stalls:
    seconds: float
    armed: bool = False
    then: Callable[[], None] = lambda: None


class StallingListener(trio.abc.Listener[trio.abc.Stream]):
    def __init__(self, inner: trio.SocketListener, stalls: Stalls) -> None:
        self.inner, self.stalls, self.socket = inner, stalls, inner.socket

    async def accept(self) -> StallingStream:
        return StallingStream(await self.inner.accept(), self.stalls)

    async def aclose(self) -> None:
        await self.inner.aclose()


@asynccontextmanager
async def serving(
    live_certs: SelfSigned,
    limits: Limits = LIMITS,
    stalls: Stalls | None = None,
    lookup: FakeLookup | None = None,
) -> AsyncIterator[Running]:
    metrics = WebhookMetrics()
    tls = ReloadingTls(live_certs.cert, live_certs.key, metrics)
    tls.load()
    admitter = Admitter(lookup or FakeLookup({"gpu-claim": GPU}), POLICY)
    server = WebhookServer(admitter, lambda: tls.context, metrics, limits=limits)
    listeners: list[Any] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    served = listeners if stalls is None else [StallingListener(ls, stalls) for ls in listeners]
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: server.serve(served, task_status.started))
        yield Running(listeners[0].socket.getsockname()[1], live_certs.ca, metrics, admitter, server, tls)
        nursery.cancel_scope.cancel()
    for listener in listeners:
        await listener.aclose()


@pytest.fixture
async def running(live_certs: SelfSigned) -> AsyncIterator[Running]:
    async with serving(live_certs) as running:
        yield running


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


async def read_reply(stream: trio.abc.Stream, *, head: bool = False) -> Reply:
    """One answer; `head`: to a HEAD request (Content-Length without a body)."""
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError(f"connection closed before a full answer: {buffer!r}")
        buffer += data
    top, _, body = buffer.partition(b"\r\n\r\n")
    status_line, *lines = top.decode().split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    length = 0 if head else int(headers.get("content-length", "0"))
    while len(body) < length:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError("connection closed in the body")
        body += data
    return Reply(int(status_line.split()[1]), headers, body[:length])


def http(method: str, path: str, body: bytes = b"", *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def review_body(*containers: dict) -> bytes:
    pod = o.pod("p", o.POD1_UID, containers=list(containers))
    return json.dumps(review(pod, uid="the-uid")).encode()


VALID = review_body(o.container("a", o.ref("gpu")))
VIOLATING = review_body(o.container("a", o.ref("gpu")), o.container("b", o.ref("gpu")))


async def ask(running: Running, raw: bytes) -> Reply:
    stream = await running.connect()
    try:
        await stream.send_all(raw)
        return await read_reply(stream, head=raw.startswith(b"HEAD "))
    finally:
        await trio.aclose_forcefully(stream)


async def assert_serving(running: Running) -> None:
    """A valid review right after: 200 with the decision."""
    reply = await ask(running, http("POST", "/validate?timeout=10s", VALID, "Content-Type: application/json"))
    assert reply.status == 200, reply.text
    assert json.loads(reply.body)["response"] == {"uid": "the-uid", "allowed": True}


async def test_reviews_are_answered_on_a_kept_alive_connection(running: Running) -> None:
    stream = await running.connect()
    with trio.fail_after(5):
        await stream.send_all(http("POST", "/validate?timeout=10s", VIOLATING))
        denied = await read_reply(stream)
        await stream.send_all(http("POST", "/validate", VALID))
        allowed = await read_reply(stream)
    await stream.aclose()
    assert (denied.status, denied.headers["content-type"]) == (200, "application/json")
    response = json.loads(denied.body)["response"]
    assert (response["uid"], response["allowed"], response["status"]["code"]) == ("the-uid", False, 403)
    assert 'app container "b" uses request "r0" of vGPU claim "gpu-claim"' in response["status"]["message"]
    assert json.loads(allowed.body)["response"]["allowed"] is True


async def test_health_metrics_and_unknown_routes(running: Running) -> None:
    assert (await ask(running, http("GET", "/healthz"))).text == "ok\n"
    await assert_serving(running)
    metrics = await ask(running, http("GET", "/metrics"))
    assert metrics.status == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=")
    assert 'vgpud_webhook_reviews_total{kind="pods",operation="CREATE",result="allowed"} 1.0' in metrics.text
    assert 'vgpud_webhook_review_duration_seconds_count{kind="pods"} 1.0' in metrics.text
    assert "vgpud_webhook_tls_loaded_timestamp_seconds" in metrics.text
    missing = await ask(running, http("GET", "/nope"))
    assert (missing.status, missing.text) == (
        404,
        "no route /nope: POST /validate, GET /healthz, GET /metrics\n",
    )
    wrong = await ask(running, http("GET", "/validate"))
    assert (wrong.status, wrong.headers["allow"]) == (405, "POST")
    head = await ask(running, http("HEAD", "/healthz"))
    assert (head.status, head.body) == (200, b"")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"garbage", "bad AdmissionReview: the body is not JSON: Expecting value: line 1 column 1 (char 0)"),
        (VALID[: len(VALID) // 2], "bad AdmissionReview: the body is not JSON: "),
        (b"", "bad AdmissionReview: the body is not JSON: "),
        (b"\x00\xff" * 100, "bad AdmissionReview: the body is not JSON: "),
        (
            b'{"apiVersion": "v1", "kind": "Pod"}',
            "bad AdmissionReview: apiVersion 'v1' is not admission.k8s.io/v1",
        ),
        (json.dumps({**json.loads(VALID), "request": None}).encode(), "AdmissionReview.request is missing"),
    ],
    ids=["garbage", "truncated JSON", "empty", "binary", "not a review", "no request"],
)
async def test_bad_bodies_get_400_with_the_reason(running: Running, body: bytes, reason: str) -> None:
    stream = await running.connect()
    with trio.fail_after(5):
        await stream.send_all(http("POST", "/validate", body))
        reply = await read_reply(stream)
        assert reply.status == 400
        assert reply.text.startswith(reason) or reason in reply.text
        # a bad body is not bad HTTP: the same connection goes on
        await stream.send_all(http("POST", "/validate", VALID))
        assert (await read_reply(stream)).status == 200
    await stream.aclose()
    assert 'result="bad_request"} 1.0' in running.metrics.exposition()[0].decode()
    (call,) = running.admitter.recorder.recent(call="AdmissionReview")
    assert call.outcome == "rejected"


async def test_a_stall_between_writes_does_not_cut_a_reply(live_certs: SelfSigned) -> None:
    """The process held for longer than the write timeout right after a write (a loaded machine): each
    answer still arrives whole, because an answer is written at once, not head and body apart."""
    limits = dataclasses.replace(LIMITS, write_timeout=0.5)
    stalls = Stalls(seconds=limits.write_timeout + 0.3)
    async with serving(live_certs, limits, stalls) as running:
        stream = await running.connect()
        with trio.fail_after(10):
            await stream.send_all(http("GET", "/healthz"))  # the handshake is over on both sides
            assert (await read_reply(stream)).status == 200
            stalls.armed = True
            await stream.send_all(http("POST", "/validate", b"garbage"))
            reply = await read_reply(stream)
            assert (reply.status, reply.text) == (
                400,
                "bad AdmissionReview: the body is not JSON: Expecting value: line 1 column 1 (char 0)\n",
            )
            await stream.send_all(http("POST", "/validate", VALID))
            assert json.loads((await read_reply(stream)).body)["response"]["allowed"] is True
        await stream.aclose()


async def test_an_oversized_body_gets_400_before_it_is_read(running: Running) -> None:
    big = b"{" + b" " * (LIMITS.max_body + 10) + b"}"
    reply = await ask(running, http("POST", "/validate", big))
    assert reply.status == 400
    assert reply.text == f"request body of {len(big)} bytes is over the limit of {LIMITS.max_body}\n"
    assert reply.headers["connection"] == "close"
    await assert_serving(running)


async def test_an_oversized_body_still_being_sent_keeps_its_answer(live_certs: SelfSigned) -> None:
    """A client that writes its whole body before it reads (curl, Python's http.client), slower than
    the linger time in all but faster between its writes: the server drains until it is done, so its
    close resets nothing and the 400 waiting in the client's socket is not thrown away."""
    chunk = b" " * 8192
    chunks = int(3 * LIMITS.linger / 0.1)  # 0.1 s apart: 3 linger times in all
    size = len(chunk) * chunks
    async with serving(live_certs, dataclasses.replace(LIMITS, request_timeout=10)) as running:
        await _send_slowly_then_read(running, chunk, chunks, size)


async def _send_slowly_then_read(running: Running, chunk: bytes, chunks: int, size: int) -> None:
    stream = await running.connect()
    with trio.fail_after(10):
        head = f"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
        await stream.send_all(head.encode())
        for _ in range(chunks):
            await stream.send_all(chunk)
            await trio.sleep(0.1)
        reply = await read_reply(stream)
    await trio.aclose_forcefully(stream)
    assert (reply.status, reply.headers["connection"]) == (400, "close")
    assert reply.text == f"request body of {size} bytes is over the limit of {LIMITS.max_body}\n"
    await assert_serving(running)


async def test_an_oversized_chunked_body_gets_400(running: Running) -> None:
    stream = await running.connect()
    await stream.send_all(http("POST", "/validate", b"", "Transfer-Encoding: chunked"))
    chunk = b"x" * 16384
    with trio.fail_after(5), pytest.raises((trio.BrokenResourceError, EOFError)):
        for _ in range(LIMITS.max_body // len(chunk) + 2):
            await stream.send_all(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        reply = await read_reply(stream)
        assert (reply.status, reply.text) == (
            400,
            f"request body is over the limit of {LIMITS.max_body} bytes\n",
        )
        await stream.send_all(b"0\r\n\r\n")
        await read_reply(stream)  # the server closed after the answer
    await trio.aclose_forcefully(stream)
    await assert_serving(running)


async def test_a_truncated_body_times_out_with_408(running: Running) -> None:
    stream = await running.connect()
    with trio.fail_after(5):
        await stream.send_all(http("POST", "/validate", VALID)[:-100])  # the last 100 bytes never come
        reply = await read_reply(stream)
    await trio.aclose_forcefully(stream)
    assert (reply.status, reply.text) == (408, "the request did not arrive completely within 0.5s\n")
    await assert_serving(running)


async def test_a_client_that_leaves_mid_body_harms_nobody(running: Running) -> None:
    stream = await running.connect()
    await stream.send_all(http("POST", "/validate", VALID)[:-50])
    await trio.aclose_forcefully(stream)
    await assert_serving(running)


@pytest.mark.parametrize(
    ("raw", "status", "reason"),
    [
        (b"GARBAGE\r\n\r\n", 400, "malformed HTTP request: illegal request line"),
        (b"POST /validate HTTP/1.1\r\nContent-Length: nope\r\n\r\n", 400, "malformed HTTP request"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
            431,
            "request headers are over the limit of 16384 bytes",
        ),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 100_000, 431, "malformed HTTP request: "),
    ],
    ids=["request line", "content length", "headers too long", "header never ends"],
)
async def test_malformed_http_gets_an_error_and_the_server_goes_on(
    running: Running, raw: bytes, status: int, reason: str
) -> None:
    reply = await ask(running, raw)
    assert reply.status == status
    assert reply.text.startswith(reason)
    await assert_serving(running)


async def test_plain_http_and_silent_clients_are_dropped(running: Running) -> None:
    with trio.fail_after(5):
        plain = await trio.open_tcp_stream("127.0.0.1", running.port)
        await plain.send_all(http("GET", "/healthz"))
        assert await until_closed(plain) == b""  # no answer: the server closed it
        # from before the connect: the server may accept (and start its timer) before this task resumes
        started = trio.current_time()
        silent = await trio.open_tcp_stream("127.0.0.1", running.port)
        assert await until_closed(silent) == b""
        assert trio.current_time() - started >= LIMITS.handshake_timeout  # closed by the handshake timeout
    await assert_serving(running)


async def wrong_protocol(running: Running) -> None:
    """A client that offers only TLS 1.0 and 1.1 (the server takes 1.2 or newer)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # that is the point
        context.minimum_version, context.maximum_version = ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", running.port, ssl_context=context)
    with pytest.raises(trio.BrokenResourceError):
        await stream.do_handshake()
    await trio.aclose_forcefully(stream)


async def untrusted_certificate(running: Running, other_ca: Path) -> None:
    """A client whose CA did not sign the serving certificate (a wrong caBundle). The standard
    library's blocking client, as it sends its alert before it gives up (as Go's does); Trio's
    SSLStream drops the alert, and the server would only see the connection close."""

    def connect() -> None:
        context = running.client_context(other_ca)
        with (
            socket.create_connection(("127.0.0.1", running.port), timeout=5) as raw,
            pytest.raises(ssl.SSLCertVerificationError),
        ):
            context.wrap_socket(raw, server_hostname="127.0.0.1")

    await trio.to_thread.run_sync(connect)


async def plain_http(running: Running) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", running.port)
    await stream.send_all(http("GET", "/healthz"))
    assert await until_closed(stream) == b""


@pytest.mark.parametrize(
    ("client", "cause"),
    [
        ("wrong protocol", "the client offers no TLS version this server accepts (TLS 1.2+) "),
        ("untrusted certificate", "the client does not trust the serving certificate's CA "),
        ("plain http", "plain HTTP sent to the HTTPS port (HTTP_REQUEST)"),
    ],
)
async def test_a_failed_handshake_is_logged_with_its_cause(
    running: Running, other_certs: SelfSigned, caplog: pytest.LogCaptureFixture, client: str, cause: str
) -> None:
    caplog.set_level(logging.INFO, logger="vgpud.webhook.server")
    with trio.fail_after(5):
        if client == "wrong protocol":
            await wrong_protocol(running)
        elif client == "untrusted certificate":
            await untrusted_certificate(running, other_certs.ca)
        else:
            await plain_http(running)
        while not caplog.records:  # noqa: ASYNC110 - the server's task logs it
            await trio.sleep(0.01)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("TLS handshake with 127.0.0.1:")
    assert f" failed: {cause}" in record.getMessage()
    await assert_serving(running)


async def test_an_idle_connection_is_closed_quietly(running: Running) -> None:
    stream = await running.connect()
    with trio.fail_after(5):
        await stream.send_all(http("GET", "/healthz"))
        assert (await read_reply(stream)).status == 200
        assert await stream.receive_some(100) == b""  # after idle_timeout, no answer, just the close


# --------------------------------------------------------------------------------------------------
# Drain (SIGTERM): the API server must lose no review while it learns that this replica is going

#: idle connections outlive every test here: only drain() can close one in time
DRAINING = dataclasses.replace(LIMITS, idle_timeout=60.0)


async def until(condition: Callable[[], bool]) -> None:
    """Wait for another task to make `condition` true; callers bound the wait."""
    while not condition():  # noqa: ASYNC110 - the server's tasks change it
        await trio.sleep(0.01)


async def test_drain_closes_idle_connections_and_answers_a_begun_request(live_certs: SelfSigned) -> None:
    """Go's Shutdown: a kept-alive connection between requests is closed at once (its client dials
    anew), while a request already begun on another gets its whole answer, with `Connection: close`."""
    async with serving(live_certs, DRAINING) as running:
        idle, busy = await running.connect(), await running.connect()
        with trio.fail_after(5):
            for stream in (idle, busy):
                await stream.send_all(http("POST", "/validate", VALID))
                assert (await read_reply(stream)).headers.get("connection") is None  # kept alive
            await until(lambda: running.server.idle_connections == 2)
            request = http("POST", "/validate", VALID)
            await busy.send_all(request[:-10])  # begun: the body's last bytes still to come
            await until(lambda: running.server.idle_connections == 1)
            running.server.drain()
            assert running.server.draining
            assert await until_closed(idle) == b""
            await busy.send_all(request[-10:])
            reply = await read_reply(busy)
            assert await until_closed(busy) == b""
        assert (reply.status, reply.headers["connection"]) == (200, "close")
        assert json.loads(reply.body)["response"] == {"uid": "the-uid", "allowed": True}
        for stream in (idle, busy):
            await trio.aclose_forcefully(stream)


async def test_a_new_connection_while_draining_gets_one_answer(live_certs: SelfSigned) -> None:
    """The API server may still dial this replica for a moment: that request is answered, and the
    connection closed after it rather than pooled."""
    async with serving(live_certs, DRAINING) as running:
        running.server.drain()
        running.server.drain()  # idempotent
        stream = await running.connect()
        with trio.fail_after(5):
            await stream.send_all(http("POST", "/validate?timeout=10s", VALID))
            reply = await read_reply(stream)
            assert await until_closed(stream) == b""
        await trio.aclose_forcefully(stream)
        assert (reply.status, reply.headers["connection"]) == (200, "close")
        assert json.loads(reply.body)["response"] == {"uid": "the-uid", "allowed": True}


async def test_a_connection_going_idle_while_draining_is_closed(live_certs: SelfSigned) -> None:
    """drain() while an answer decided before it is being written: the connection is kept alive by
    that answer, and closes as it goes idle instead of waiting for its next request."""
    stalls = Stalls(seconds=0)
    async with serving(live_certs, DRAINING, stalls) as running:
        stalls.then = running.server.drain
        stream = await running.connect()
        with trio.fail_after(5):
            await stream.send_all(http("GET", "/healthz"))  # the handshake is over on both sides
            assert (await read_reply(stream)).status == 200
            await until(lambda: running.server.idle_connections == 1)  # its write has returned
            stalls.armed = True
            await stream.send_all(http("POST", "/validate", VALID))
            reply = await read_reply(stream)
            assert await until_closed(stream) == b""
        await trio.aclose_forcefully(stream)
        assert running.server.draining
        assert (reply.status, reply.headers.get("connection")) == (200, None)


async def test_health_fails_while_draining(running: Running) -> None:
    """Readiness fails while draining (the probe's connection closed after it too); metrics go on."""
    assert (await ask(running, http("GET", "/healthz"))).text == "ok\n"
    assert not running.server.draining
    running.server.drain()
    reply = await ask(running, http("GET", "/healthz"))
    assert (reply.status, reply.text, reply.headers["connection"]) == (503, "draining\n", "close")
    metrics = await ask(running, http("GET", "/metrics"))  # still scraped meanwhile
    assert metrics.status == 200


async def test_connections_over_the_limit_are_refused(running: Running) -> None:
    held = [await running.connect() for _ in range(LIMITS.max_connections)]
    with trio.fail_after(5):
        await trio.testing.wait_all_tasks_blocked()
        raw = await trio.open_tcp_stream("127.0.0.1", running.port)
        started = trio.current_time()
        assert await until_closed(raw) == b""
        assert trio.current_time() - started < LIMITS.handshake_timeout  # refused, not timed out
    for stream in held:
        await trio.aclose_forcefully(stream)
    await assert_serving(running)


async def until_closed(stream: trio.abc.Stream) -> bytes:
    """What the peer sent until it closed the connection (EOF or reset); callers bound the wait."""
    received = b""
    try:
        while data := await stream.receive_some(65536):
            received += data
    except trio.BrokenResourceError:
        pass
    return received


# --------------------------------------------------------------------------------------------------
# Certificate reload


def _replace(source: SelfSigned, target: SelfSigned) -> None:
    """As a Secret volume update does: new files renamed over the old ones."""
    for src, dst in ((source.key, target.key), (source.cert, target.cert)):
        staged = dst.with_suffix(".new")
        shutil.copyfile(src, staged)
        os.replace(staged, dst)


async def test_a_replaced_certificate_is_served_without_restart(
    running: Running, live_certs: SelfSigned, other_certs: SelfSigned
) -> None:
    await assert_serving(running)
    kept = await running.connect()  # established under the old certificate
    _replace(other_certs, live_certs)
    assert await trio.to_thread.run_sync(running.tls.reload_if_changed)
    assert running.tls.loads == 2
    with pytest.raises(trio.BrokenResourceError):
        await running.connect()  # the old CA no longer verifies the server
    fresh = await running.connect(other_certs.ca)
    await fresh.send_all(http("GET", "/healthz"))
    assert (await read_reply(fresh)).status == 200
    await kept.send_all(http("GET", "/healthz"))  # an open connection keeps its session
    assert (await read_reply(kept)).status == 200
    for stream in (fresh, kept):
        await stream.aclose()


async def test_a_half_written_pair_keeps_the_previous_certificate(
    running: Running, live_certs: SelfSigned, other_certs: SelfSigned
) -> None:
    staged = live_certs.cert.with_suffix(".new")
    shutil.copyfile(other_certs.cert, staged)
    os.replace(staged, live_certs.cert)  # the new certificate, the old key: no match
    assert not await trio.to_thread.run_sync(running.tls.reload_if_changed)
    assert not await trio.to_thread.run_sync(running.tls.reload_if_changed)  # not retried until it changes
    assert "vgpud_webhook_tls_reload_failures_total 1.0" in running.metrics.exposition()[0].decode()
    await assert_serving(running)  # still the old pair
    staged = live_certs.key.with_suffix(".new")
    shutil.copyfile(other_certs.key, staged)
    os.replace(staged, live_certs.key)  # now the key follows
    assert await trio.to_thread.run_sync(running.tls.reload_if_changed)
    fresh = await running.connect(other_certs.ca)
    await fresh.aclose()


async def test_the_watcher_polls_the_files(
    running: Running, live_certs: SelfSigned, other_certs: SelfSigned
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(running.tls.watch, 0.05)
        _replace(other_certs, live_certs)
        with trio.fail_after(5):
            while running.tls.loads < 2:  # noqa: ASYNC110 - another task's poll of the files
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    fresh = await running.connect(other_certs.ca)
    await fresh.aclose()


def test_a_key_that_does_not_match_is_a_clear_error(certs: SelfSigned, other_certs: SelfSigned) -> None:
    tls = ReloadingTls(certs.cert, other_certs.key)
    with pytest.raises(TlsError, match=r"cannot load certificate .*tls\.crt with key .*tls\.key"):
        tls.load()
    with pytest.raises(RuntimeError, match="has not succeeded"):
        _ = tls.context


def test_self_signed_files_are_reused_and_name_the_hosts(certs: SelfSigned, tmp_path: Path) -> None:
    again = ensure_self_signed(certs.ca.parent, ["other-host"])
    assert again == certs  # reused: a restart keeps the CA the webhook configuration trusts
    made = ensure_self_signed(tmp_path / "new", ["localhost", "127.0.0.1", "vgpud-webhook.kube-system.svc"])
    assert sorted(p.name for p in made.ca.parent.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert made.key.stat().st_mode & 0o777 == 0o600
    san = subprocess.run(
        ["openssl", "x509", "-in", str(made.cert), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "DNS:localhost, IP Address:127.0.0.1, DNS:vgpud-webhook.kube-system.svc" in san
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", str(made.ca), str(made.cert)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verified.returncode == 0, verified.stderr
    assert base64.b64decode(made.ca_bundle()) == made.ca.read_bytes()


async def test_a_request_that_stops_in_its_headers_times_out_with_408(running: Running) -> None:
    stream = await running.connect()
    with trio.fail_after(5):
        await stream.send_all(b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        reply = await read_reply(stream)
    await trio.aclose_forcefully(stream)
    assert (reply.status, reply.headers["connection"]) == (408, "close")
    await assert_serving(running)


async def test_expect_100_continue_is_answered(running: Running) -> None:
    stream = await running.connect()
    with trio.fail_after(5):
        headers = f"Content-Length: {len(VALID)}\r\nExpect: 100-continue\r\n"
        await stream.send_all(f"POST /validate HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
        interim = await read_reply(stream)
        await stream.send_all(VALID)
        final = await read_reply(stream)
    await stream.aclose()
    assert (interim.status, final.status) == (100, 200)


class CrowdedLookup(FakeLookup):
    """A namespace "crowded" whose pod list is large; `listed` is set when the webhook has it (the
    rules over it start right after)."""

    def __init__(self, crowd: list[dict[str, Any]]) -> None:
        crowded = dict(GPU, metadata=dict(GPU["metadata"], namespace="crowded"))
        super().__init__({"gpu-claim": GPU, "crowded-claim": crowded}, pods=crowd)
        self.listed = trio.Event()

    async def list_pods(self, namespace: str) -> list[dict[str, Any]]:
        pods = await super().list_pods(namespace)
        if namespace == "crowded":
            self.listed.set()
        return pods


def crowd(pods: int, containers: int) -> list[dict[str, Any]]:
    """Running pods of namespace "crowded", each with `containers` containers using none of its claims."""
    return [
        o.pod(
            f"p{k}",
            f"00000000-0000-4000-8000-{k:012d}",
            containers=[o.container(f"c{j}") for j in range(containers)],
            namespace="crowded",
        )
        for k in range(pods)
    ]


async def test_a_small_review_is_answered_while_a_large_one_is_decided(live_certs: SelfSigned) -> None:
    """A 2,000 + 2,000 pod in a namespace of 100,000 containers: its body is decoded and its rules run
    in worker threads, so a small review sent while they run is answered first, and promptly."""
    init = [o.container(f"i{k}", o.ref("gpu")) for k in range(2000)]
    apps = [o.container(f"a{k}", o.ref("gpu")) for k in range(2000)]
    large = o.pod("large", o.POD2_UID, containers=apps, init=init, claims={"gpu": "crowded-claim"})
    large["metadata"]["namespace"] = "crowded"
    body = json.dumps(review(large, uid="large")).encode()
    lookup = CrowdedLookup(crowd(2000, 50))
    limits = dataclasses.replace(LIMITS, max_body=len(body), request_timeout=30.0, write_timeout=30.0)
    answered: dict[str, float] = {}

    async def send(stream: trio.abc.Stream, raw: bytes, name: str) -> Reply:
        await stream.send_all(raw)
        reply = await read_reply(stream)
        answered[name] = trio.current_time()
        return reply

    async with serving(live_certs, limits, lookup=lookup) as running:
        large_stream, small_stream = await running.connect(), await running.connect()
        replies: dict[str, Reply] = {}

        async def large_review() -> None:
            replies["large"] = await send(large_stream, http("POST", "/validate", body), "large")

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(large_review)
                await lookup.listed.wait()
                sent = trio.current_time()
                small = await send(small_stream, http("POST", "/validate", VALID), "small")
                assert "large" not in answered, "the small review waited for the large one"
        await large_stream.aclose()
        await small_stream.aclose()
    assert json.loads(small.body)["response"] == {"uid": "the-uid", "allowed": True}
    denied = json.loads(replies["large"].body)["response"]
    assert (denied["allowed"], denied["status"]["code"]) == (False, 403)
    assert denied["status"]["message"].endswith("; and 3994 more")  # 1,999 apps and 2,000 inits too many
    assert running.admitter.cpu.offloaded == 3  # the large body decoded, its claims read, its rules
    assert answered["small"] - sent < 1.0, f"the small review took {answered['small'] - sent:.3f}s"
    assert answered["large"] > answered["small"]


def test_the_registered_reviews_are_exported_at_zero_before_the_first() -> None:
    """The first denial or error must be a rise that increase() sees, not a series born at 1."""
    metrics = WebhookMetrics()
    text = metrics.exposition()[0].decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    for kind, operation in WEBHOOK_PRESET_REVIEWS:
        for result in WEBHOOK_PRESET_RESULTS:
            labels = (("kind", kind), ("operation", operation), ("result", result))
            assert samples[("vgpud_webhook_reviews_total", labels)] == 0
        assert samples[("vgpud_webhook_review_duration_seconds_count", (("kind", kind),))] == 0
    metrics.review("pods", "CREATE", "denied", 0.002)
    assert 'vgpud_webhook_reviews_total{kind="pods",operation="CREATE",result="denied"} 1.0' in (
        metrics.exposition()[0].decode()
    )
