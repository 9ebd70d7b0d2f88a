"""hypercorn's internals that vgpud.compat.hypercorn drives: each test fails if one moves or changes
shape; the last serves real connections through them."""

from __future__ import annotations

import inspect
import logging

import trio
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import wrap_app

from vgpud.compat.hypercorn import ConnectionServer, config
from vgpud.observe.asgi import TEXT_TYPE, Receive, Scope, Send, respond


def _parameters(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def test_tcp_server_serves_one_stream_when_awaited() -> None:
    assert _parameters(TCPServer.__init__) == ["self", "app", "config", "context", "state", "stream"]
    assert hasattr(TCPServer, "__await__")


def test_worker_context_and_its_terminated_event() -> None:
    assert _parameters(WorkerContext.__init__) == ["self", "max_requests"]
    context = WorkerContext(None)
    assert inspect.iscoroutinefunction(context.terminated.set)


def test_wrap_app() -> None:
    assert _parameters(wrap_app) == ["app", "wsgi_max_body_size", "mode"]


async def _hello(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "http":
        await respond(send, 200, b"hello\n", TEXT_TYPE)


async def test_a_connection_is_served_and_closed_when_idle_at_termination() -> None:
    server = ConnectionServer(_hello, config(logging.getLogger("test.hypercorn")))
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with listener, trio.open_nursery() as nursery:
        served = trio.Event()

        async def accept_one() -> None:
            stream = await listener.accept()
            await server.serve(stream)  # a SocketStream has the `socket` hypercorn reads
            served.set()

        nursery.start_soon(accept_one)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await client.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        with trio.fail_after(10):
            while b"hello\n" not in reply:
                reply += await client.receive_some()
        assert reply.startswith(b"HTTP/1.1 200")
        await server.close_idle()  # the keep-alive connection closes now
        with trio.fail_after(10):
            await served.wait()
            while await client.receive_some():
                pass
        await client.aclose()
