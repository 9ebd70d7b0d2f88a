"""grpclib's internals that vgpud.compat.grpclib reaches: each test fails if one moves or changes
shape (the registry's tests serve real grpcio calls through them, tests/unit/registry)."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace

import pytest
from grpclib.const import Cardinality
from grpclib.encoding.proto import ProtoCodec
from grpclib.protocol import Buffer, Peer
from grpclib.protocol import Stream as H2Stream
from grpclib.server import Server
from grpclib.server import Stream as ServerStream

from vgpud.compat.grpclib import TruncatedData, listening_sockets, peer_socket, recv_data, stop_accepting


def _server_stream(data: bytes, *, ended: bool) -> ServerStream:
    """A server Stream over an HTTP/2 stream that has received `data` (grpclib's own Buffer and
    `recv_data`, without a connection)."""
    buffer = Buffer(ack_callback=lambda size: None)
    buffer.add(data, len(data))
    if ended:
        buffer.eof()
    h2 = SimpleNamespace(buffer=buffer, connection=SimpleNamespace(get_peer=lambda: None))
    h2.recv_data = lambda size: H2Stream.recv_data(h2, size)  # type: ignore[arg-type]
    return ServerStream(
        h2,
        "/pkg.Svc/Method",
        Cardinality.UNARY_UNARY,
        bytes,
        bytes,
        codec=ProtoCodec(),
        status_details_codec=None,
        dispatch=None,  # type: ignore[arg-type]
    )


def test_the_h2_stream_reads_exact_sizes_and_an_early_end_is_truncated() -> None:
    assert list(inspect.signature(H2Stream.recv_data).parameters) == ["self", "size"]

    async def reads() -> None:
        stream = _server_stream(b"\x00\x00\x00\x00\x03abc", ended=True)
        assert await recv_data(stream, 5) == b"\x00\x00\x00\x00\x03"
        assert await recv_data(stream, 3) == b"abc"
        assert await recv_data(stream, 5) == b""  # ended with nothing left
        with pytest.raises(TruncatedData):
            await recv_data(_server_stream(b"\x00\x00\x00\x00\x09abc", ended=True), 14)

    asyncio.run(reads())


def test_a_servers_listener_gives_its_sockets_and_stops_accepting_without_closing_connections() -> None:
    async def check() -> None:
        server = Server([])
        assert listening_sockets(server) == []
        await server.start(host="127.0.0.1", port=0)
        (sock,) = listening_sockets(server)
        port = sock.getsockname()[1]
        assert port > 0
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        stop_accepting(server)
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        assert not writer.is_closing()  # the connection already open stays
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(check())


def test_a_peer_wraps_its_connections_transport() -> None:
    """`Stream.peer` is a `Peer(transport)` (grpclib.protocol), kept as `_transport`."""
    assert list(inspect.signature(Peer.__init__).parameters) == ["self", "transport"]

    async def check() -> None:
        accepted: asyncio.Future[asyncio.Transport] = asyncio.get_running_loop().create_future()

        class Protocol(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted.set_result(transport)  # type: ignore[arg-type]

        server = await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        transport = await accepted
        stream = SimpleNamespace(peer=Peer(transport))
        sock = peer_socket(stream)
        assert sock is not None and sock.getpeername() == writer.get_extra_info("sockname")
        assert peer_socket(SimpleNamespace(peer=None)) is None
        writer.close()
        transport.close()
        server.close()
        await server.wait_closed()

    asyncio.run(check())
