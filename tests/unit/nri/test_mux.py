"""vgpud.nri.mux: the frame-size rule toward Go, demultiplexing, and fuzzing the whole receive path."""

from __future__ import annotations

import errno
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.nri.test_ttrpc import error_of, oversized_frame, request_frame, response_frame, split
from vgpud.nri.mux import (
    GO_READ_BUFFER,
    MAX_FRAME,
    MUX_HEADER,
    PLUGIN_CONN,
    RUNTIME_CONN,
    MuxDecoder,
    MuxError,
    encode,
)
from vgpud.nri.ttrpc import (
    HEADER,
    MAX_MESSAGE,
    ClientConnection,
    Code,
    IncomingRequest,
    ServerConnection,
)

FUZZ = settings(max_examples=150, deadline=None)


def frame(conn_id: int, payload: bytes) -> bytes:
    """One mux frame, however big (what a peer may send us; `encode` is the rule for what we send)."""
    return conn_id.to_bytes(4, "big") + len(payload).to_bytes(4, "big") + payload


def payloads(frames: list[bytes]) -> list[bytes]:
    for f in frames:
        assert int.from_bytes(f[4:8], "big") == len(f) - MUX_HEADER
    return [f[MUX_HEADER:] for f in frames]


class GoConnReader:
    """Go's ttrpc channel reading one NRI mux connection: `bufio.NewReader(conn)` (4096 bytes) over the
    mux's `conn.Read`, which hands over one whole frame per call and fails with ENOMEM when the frame is
    larger than the buffer it is given (nri pkg/net/multiplex, bufio.Reader.Read; cap(p) == len(p))."""

    def __init__(self, frames: list[bytes]) -> None:
        self.queue = deque(payloads(frames))
        self.buffered = b""

    def _conn_read(self, size: int) -> bytes:
        message = self.queue.popleft()
        if len(message) > size:
            raise OSError(errno.ENOMEM, "cannot allocate memory")
        return message

    def _read(self, size: int) -> bytes:
        if not self.buffered:
            if size >= GO_READ_BUFFER:  # a large read into an empty buffer goes straight to the caller
                return self._conn_read(size)
            self.buffered = self._conn_read(GO_READ_BUFFER)
        out, self.buffered = self.buffered[:size], self.buffered[size:]
        return out

    def _read_full(self, size: int) -> bytes:
        out = b""
        while len(out) < size:
            out += self._read(size - len(out))
        return out

    def recv(self) -> bytes:
        """One ttrpc message, header included, as channel.recv reads it."""
        header = self._read_full(HEADER)
        return header + self._read_full(int.from_bytes(header[:4], "big"))


SIZES = [10, 11, GO_READ_BUFFER, GO_READ_BUFFER + 1, 2 * GO_READ_BUFFER, 100 * 1024, HEADER + MAX_MESSAGE]


def message(size: int, seed: int = 0) -> bytes:
    """A well-formed ttrpc message of `size` bytes (the layout is what the Go reader needs)."""
    body = bytes((seed + i) % 251 for i in range(min(size - HEADER, 4096))) * ((size - HEADER) // 4096 + 1)
    return (size - HEADER).to_bytes(4, "big") + b"\x00\x00\x00\x01\x02\x00" + body[: size - HEADER]


@pytest.mark.parametrize(
    ("size", "frame_sizes"),
    [
        (10, [10]),
        (4096, [4096]),
        (4097, [4096, 1]),
        (100 * 1024, [4096, 100 * 1024 - 4096]),
        (HEADER + MAX_MESSAGE, [4096, HEADER + MAX_MESSAGE - 4096]),
    ],
)
def test_encode_obeys_the_4096_rule(size: int, frame_sizes: list[int]) -> None:
    data = message(size)
    frames = encode(RUNTIME_CONN, data)
    assert [len(p) for p in payloads(frames)] == frame_sizes
    assert all(f[:4] == b"\x00\x00\x00\x02" for f in frames)
    assert b"".join(payloads(frames)) == data


def test_encode_exact_bytes() -> None:
    assert encode(PLUGIN_CONN, b"0123456789") == [b"\x00\x00\x00\x01\x00\x00\x00\x0a0123456789"]


@pytest.mark.parametrize(
    ("conn_id", "data"),
    [(0, b"x" * 10), (1 << 32, b"x" * 10), (1, b""), (1, bytes(HEADER + MAX_MESSAGE + 1))],
)
def test_encode_refuses_what_is_not_one_message_on_one_connection(conn_id: int, data: bytes) -> None:
    with pytest.raises(ValueError):
        encode(conn_id, data)


def test_go_reader_model_reads_what_encode_sends_and_rejects_one_big_frame() -> None:
    """The model of the Go side reads every size back, several messages in a row; a message over 4096
    bytes sent as one frame fails there with ENOMEM, which is the trap `encode` avoids."""
    messages = [message(size, seed) for seed, size in enumerate(SIZES)]
    reader = GoConnReader([f for m in messages for f in encode(PLUGIN_CONN, m)])
    assert [reader.recv() for _ in messages] == messages
    assert GoConnReader([frame(1, message(4096))]).recv() == message(4096)
    with pytest.raises(OSError) as err:
        GoConnReader([frame(1, message(4097))]).recv()
    assert err.value.errno == errno.ENOMEM


def test_decoder_byte_by_byte_and_in_one_feed() -> None:
    wire = frame(1, b"abc") + frame(2, b"") + frame(2, b"defg") + frame(1, b"h") + frame(1, b"ij")
    assert MuxDecoder().feed(wire) == [(1, b"abc"), (2, b"defg"), (1, b"hij")]
    decoder = MuxDecoder()
    out = [piece for i in range(len(wire)) for piece in decoder.feed(wire[i : i + 1])]
    assert out == [
        (conn_id, bytes([byte]))
        for conn_id, byte in zip([1, 1, 1, 2, 2, 2, 2, 1, 1, 1], b"abcdefghij", strict=True)
    ]


def test_decoder_drops_unknown_connections() -> None:
    decoder = MuxDecoder()
    wire = (
        frame(0, b"reserved") + frame(1, b"a") + frame(7, b"x" * 9000) + frame(2, b"b") + frame(1 << 31, b"")
    )
    assert decoder.feed(wire) == [(1, b"a"), (2, b"b")]
    assert decoder.dropped_frames == 3
    assert MuxDecoder(conn_ids=[7]).feed(wire) == [(7, b"x" * 9000)]


def test_decoder_gives_up_on_absurd_lengths() -> None:
    decoder = MuxDecoder()
    assert decoder.feed(frame(1, b"ok") + b"\x00\x00\x00\x01") == [(1, b"ok")]
    with pytest.raises(MuxError, match="claims 16777217 bytes"):
        decoder.feed((MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(MuxError):  # framing stays lost
        decoder.feed(frame(1, b"ok"))
    big = frame(9, bytes(MAX_FRAME))
    assert MuxDecoder().feed(big) == []  # the cap itself is fine


class Session:
    """The receive path of the NRI session: mux, then conn 1's server and conn 2's client."""

    def __init__(self) -> None:
        self.mux, self.server, self.client = MuxDecoder(), ServerConnection(), ClientConnection()
        self.requests: list[IncomingRequest] = []
        self.answers: list[bytes] = []
        self.replies: list[tuple[int, bytes | None]] = []

    def feed(self, data: bytes) -> None:
        for conn_id, chunk in self.mux.feed(data):
            if conn_id == PLUGIN_CONN:
                for item in self.server.receive(chunk):
                    if isinstance(item, bytes):
                        self.answers.append(item)
                    else:
                        self.requests.append(item)
            else:
                self.replies += [(r.stream_id, r.payload) for r in self.client.receive(chunk)]


@FUZZ
@given(st.data())
def test_interleaved_connections_never_desynchronise(data: st.DataObject) -> None:
    """Requests on conn 1 and responses on conn 2, cut into arbitrary mux frames, frames of the two
    interleaved with garbage frames for conn 7 and fed in arbitrary pieces: everything comes out intact."""
    session = Session()
    n = data.draw(st.integers(1, 6))
    sizes = data.draw(st.lists(st.sampled_from([0, 1, 300, 5000]), min_size=n, max_size=n))
    for _ in range(n):
        session.client.request("nri.pkg.api.v1alpha1.Runtime", "UpdateContainers", b"")
    streams = {
        PLUGIN_CONN: b"".join(request_frame(2 * i + 1, f"M{i}", bytes(size)) for i, size in enumerate(sizes)),
        RUNTIME_CONN: b"".join(response_frame(2 * i + 1, bytes([i]) * size) for i, size in enumerate(sizes)),
    }
    queues = {}
    for conn_id, stream in streams.items():
        cuts = data.draw(st.lists(st.integers(1, max(1, len(stream) - 1)), max_size=8))
        queues[conn_id] = deque(frame(conn_id, piece) for piece in split(stream, cuts))
    garbage = data.draw(st.lists(st.binary(max_size=64), max_size=6))
    queues[7] = deque(frame(7, g) for g in garbage)
    wire = b""
    while any(queues.values()):
        conn_id = data.draw(st.sampled_from([c for c, q in queues.items() if q]))
        wire += queues[conn_id].popleft()
    for piece in split(wire, data.draw(st.lists(st.integers(1, len(wire)), max_size=20))):
        session.feed(piece)
    assert [(r.stream_id, r.method, len(r.payload)) for r in session.requests] == [
        (2 * i + 1, f"M{i}", size) for i, size in enumerate(sizes)
    ]
    assert session.replies == [(2 * i + 1, bytes([i]) * size) for i, size in enumerate(sizes)]
    assert session.answers == [] and session.mux.dropped_frames == len(garbage)


@FUZZ
@given(st.binary(max_size=600), st.lists(st.integers(1, 600), max_size=10))
def test_arbitrary_bytes_raise_nothing_but_mux_error(garbage: bytes, cuts: list[int]) -> None:
    session = Session()
    for _ in range(3):
        session.client.request("nri.pkg.api.v1alpha1.Runtime", "X", b"")
    try:
        for piece in split(garbage, cuts):
            session.feed(piece)
    except MuxError:
        pass
    for answer in session.answers:
        assert error_of(answer)[1] != Code.OK


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=48)), max_size=8), st.integers(1, 64))
def test_frames_for_other_connections_never_disturb_conn_1(junk: list[tuple[int, bytes]], step: int) -> None:
    """Any frames for ConnIDs other than 1 and 2, interleaved with valid requests, fed in fixed steps."""
    session = Session()
    wire = b""
    for i, (conn_id, payload) in enumerate(junk):
        wire += frame(conn_id if conn_id not in (PLUGIN_CONN, RUNTIME_CONN) else 7, payload)
        wire += b"".join(encode(PLUGIN_CONN, request_frame(2 * i + 1, f"M{i}")))
    for i in range(0, len(wire), step):
        session.feed(wire[i : i + step])
    assert [(r.stream_id, r.method) for r in session.requests] == [
        (2 * i + 1, f"M{i}") for i in range(len(junk))
    ]
    assert session.mux.dropped_frames == len(junk) and session.answers == []


def test_oversized_request_through_the_mux_then_a_valid_one() -> None:
    """A Go-sized mux frame holding an over-4-MiB ttrpc message: that stream gets RESOURCE_EXHAUSTED,
    the next request and conn 2 are unaffected."""
    session = Session()
    session.client.request("nri.pkg.api.v1alpha1.Runtime", "X", b"")
    big = oversized_frame(5)
    wire = (
        frame(PLUGIN_CONN, big[:4096])
        + frame(RUNTIME_CONN, response_frame(1, b"r"))
        + frame(PLUGIN_CONN, big[4096:])
    )
    wire += b"".join(encode(PLUGIN_CONN, request_frame(7)))
    for i in range(0, len(wire), 1 << 16):
        session.feed(wire[i : i + (1 << 16)])
    (answer,) = session.answers
    assert error_of(answer)[:2] == (5, Code.RESOURCE_EXHAUSTED)
    assert [r.stream_id for r in session.requests] == [7]
    assert session.replies == [(1, b"r")]
