"""Fuzz target: the webhook over real HTTPS: the in-process `WebhookServer` on 127.0.0.1 with a
self-signed certificate, fed the webhook target's bodies by a few keep-alive clients.

Contract per input: a POST /validate gets exactly what `parse_review` says of its body (400 with
"bad AdmissionReview: <reason>", or 200 with an AdmissionReview that echoes the request's uid), never a
500; a mangled HTTP request (about 1 in 100: its request bytes mutated) gets an error status or a
closed connection; the server logs no failed connection ("connection failed; the server goes on" is
an exception it did not expect), and after everything it still answers a valid review (one more input).
"""

from __future__ import annotations

import json
import logging
import random
import ssl
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import h11
import trio

from tests.fuzz import target_webhook
from tests.fuzz.driver import ERROR, ContractBroken, Hang, Tally, kind_of, mutate
from vgpud.recorder import Recorder
from vgpud.webhook.admit import Admitter
from vgpud.webhook.metrics import WebhookMetrics
from vgpud.webhook.review import BadReview, parse_review
from vgpud.webhook.server import Limits, WebhookServer
from vgpud.webhook.tls import ReloadingTls, ensure_self_signed

NAME = "webhook_https"
CONCURRENCY = 4
PER_INPUT_S = 10.0
RAW_SHARE = 0.01
#: short timeouts: a mangled request that stops mid-way (or is cut to nothing, an idle connection)
#: costs its client this long
LIMITS = Limits(max_body=1 << 20, request_timeout=0.3, linger=0.1, handshake_timeout=5.0, idle_timeout=1.0)
#: statuses a mangled request may get
RAW_STATUSES = frozenset({200, 400, 404, 405, 408, 431})


class _FailedConnections(logging.Handler):
    """Counts the server's "connection failed" log records: each is an exception it did not expect."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))


@dataclass
class _Client:
    port: int
    context: ssl.SSLContext
    stream: trio.SSLStream[trio.SocketStream] | None = None
    conn: h11.Connection | None = None

    async def _open(self) -> tuple[trio.SSLStream[trio.SocketStream], h11.Connection]:
        if self.stream is None or self.conn is None or self.conn.our_state is not h11.IDLE:
            await self.close()
            self.stream = await trio.open_ssl_over_tcp_stream(
                "127.0.0.1", self.port, ssl_context=self.context, https_compatible=True
            )
            self.conn = h11.Connection(h11.CLIENT)
        return self.stream, self.conn

    async def close(self) -> None:
        if self.stream is not None:
            await trio.aclose_forcefully(self.stream)
        self.stream = self.conn = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        """POST /validate on the kept-alive connection (a new one when the server closed it)."""
        for attempt in (0, 1):
            stream, conn = await self._open()
            head = h11.Request(
                method="POST",
                target="/validate?timeout=10s",
                headers=[
                    ("host", "127.0.0.1"),
                    ("content-type", "application/json"),
                    ("content-length", str(len(body))),
                ],
            )
            try:
                await stream.send_all(
                    conn.send(head) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
                )
                status, answer = await _read(stream, conn)
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError, EOFError):
                await self.close()  # the server closed the kept-alive connection first: once more
                if attempt:
                    raise
                continue
            if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                conn.start_next_cycle()
            else:
                await self.close()
            return status, answer
        raise AssertionError("unreachable")

    async def raw(self, data: bytes) -> int | None:
        """Mangled request bytes on a fresh connection: the status of the answer, None when closed."""
        await self.close()
        stream = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1", self.port, ssl_context=self.context, https_compatible=True
        )
        try:
            await stream.send_all(data)
            buffer = b""
            while b"\r\n" not in buffer:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return None
                buffer += chunk
            return int(buffer.split(b" ", 2)[1])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None
        finally:
            await trio.aclose_forcefully(stream)


async def _read(stream: trio.SSLStream[trio.SocketStream], conn: h11.Connection) -> tuple[int, bytes]:
    status, body = 0, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            if not data:
                raise EOFError("the server closed the connection before answering")
            conn.receive_data(data)
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return status, body


def _raw_request(body: bytes) -> bytes:
    head = f"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    return head + body


def expect(body: bytes, status: int, answer: bytes) -> str:
    """Check one answer against what `parse_review` says of the body; the outcome kind."""
    try:
        request = parse_review(body)
    except BadReview as err:
        if status != 400 or answer.decode() != f"bad AdmissionReview: {err.reason}\n":
            raise ContractBroken(f"expected 400 for {err.reason!r}, got {status}: {answer[:200]!r}") from None
        return kind_of(err, err.reason)
    if status != 200:
        raise ContractBroken(f"expected 200 for a well-formed review, got {status}: {answer[:200]!r}")
    response = json.loads(answer)["response"]
    if response["uid"] != request.uid:
        raise ContractBroken(f"the answer's uid {response['uid']!r} is not the request's {request.uid!r}")
    code = response.get("status", {}).get("code", 200)
    if code == 500:
        raise ContractBroken(f"decide failed inside: {response['status']['message']}")
    return f"{request.resource_path} {request.operation}: {code}"


@dataclass
class _Session:
    """One run: the server's side (admitter, failure log) and the tally the clients fill."""

    admitter: Admitter
    failed: _FailedConnections
    tally: Tally

    async def check(self, client: _Client, index: int, raw: bool, data: bytes) -> None:
        """Send one input, check its answer under the time bound, tally the outcome or the crash."""
        self.admitter._lookup.calls.clear()  # type: ignore[attr-defined]
        logged = len(self.failed.records)
        started = time.perf_counter()
        try:
            with trio.fail_after(PER_INPUT_S):
                if raw:
                    status = await client.raw(data)
                    if status is not None and status not in RAW_STATUSES:
                        raise ContractBroken(f"a mangled request got {status}")
                    kind = f"raw {status}" if status in (None, 200) else f"{ERROR}raw {status}"
                else:
                    kind = expect(data, *await client.post(data))
            if len(self.failed.records) > logged:
                raise ContractBroken(f"the server logged: {self.failed.records[-1][:500]}")
            if time.perf_counter() - started > PER_INPUT_S:
                raise Hang(f"the answer took {time.perf_counter() - started:.1f} s")
        except trio.TooSlowError:
            self.tally.crashed(
                index, data, Hang(f"no answer within {PER_INPUT_S:g} s"), "FUZZ_RAW=1" if raw else ""
            )
            await client.close()
        except Exception as err:
            self.tally.crashed(index, data, err, "FUZZ_RAW=1" if raw else "")
            await client.close()
        else:
            self.tally.kinds[kind] += 1


async def _fuzz(n: int, seed: int, concurrency: int, tally: Tally, given: tuple[bool, bytes] | None) -> None:
    generate = target_webhook.target(seed).generate
    rng = random.Random(seed)
    metrics = WebhookMetrics()
    inputs = iter(range(n))
    with tempfile.TemporaryDirectory(prefix="vgpud-fuzz-") as tmp:
        certs = ensure_self_signed(Path(tmp), ("127.0.0.1",))
        tls = ReloadingTls(certs.cert, certs.key, metrics)
        tls.load()
        session = _Session(
            Admitter(target_webhook.lookup(), target_webhook.POLICY, recorder=Recorder()),
            _FailedConnections(),
            tally,
        )
        server = WebhookServer(session.admitter, lambda: tls.context, metrics, limits=LIMITS)
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        context = ssl.create_default_context(cafile=str(certs.ca))

        async def worker() -> None:
            client = _Client(listeners[0].socket.getsockname()[1], context)
            for index in inputs:
                if given is None:  # no await from here to the send: input #i is the same in every run
                    raw = rng.random() < RAW_SHARE
                    body = generate(rng)
                    await session.check(client, index, raw, mutate(rng, _raw_request(body)) if raw else body)
                else:
                    await session.check(client, index, *given)
            await client.close()

        logger = logging.getLogger("vgpud.webhook.server")
        logger.addHandler(session.failed)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(lambda task_status: server.serve(listeners, task_status.started))
                async with trio.open_nursery() as clients:
                    for _ in range(concurrency):
                        clients.start_soon(worker)
                # still serving: a valid review after everything
                await session.check(
                    _Client(listeners[0].socket.getsockname()[1], context),
                    n,
                    False,
                    json.dumps(target_webhook.seed_reviews()[0]).encode(),
                )
                nursery.cancel_scope.cancel()
        finally:
            logger.removeHandler(session.failed)
            for listener in listeners:
                await listener.aclose()


def run(
    n: int, seed: int, concurrency: int = CONCURRENCY, *, given: tuple[bool, bytes] | None = None
) -> Tally:
    """`n` generated requests from `seed` over HTTPS, `concurrency` connections at a time; `given`:
    instead, one input (raw request bytes or a body) from a crash report."""
    tally = Tally(NAME, seed)
    started = time.perf_counter()
    if given is not None:
        n, concurrency = 1, 1
    trio.run(_fuzz, n, seed, concurrency, tally, given)
    tally.inputs = n + 1  # the closing valid review
    tally.seconds = time.perf_counter() - started
    return tally
