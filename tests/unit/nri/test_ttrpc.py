"""vgpud.nri.ttrpc: framing, the server and client halves, and Go ttrpc's answers to protocol errors."""

from __future__ import annotations

import itertools
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpud._pb import ttrpc as pb
from vgpud._pb.google.rpc import Status
from vgpud.nri.ttrpc import (
    HEADER,
    MAX_MESSAGE,
    MAX_STATUS_MESSAGE,
    ClientConnection,
    Code,
    Frame,
    FrameDecoder,
    IncomingRequest,
    MessageType,
    OversizedFrame,
    Reply,
    ServerConnection,
    TtrpcError,
    encode_frame,
    success_response,
)

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
FUZZ = settings(max_examples=150, deadline=None)


def request_frame(
    stream_id: int, method: str = "Configure", payload: bytes = b"\x08\x01", flags: int = 0
) -> bytes:
    request = pb.Request(service=PLUGIN, method=method, payload=payload, timeout_nano=2_000_000_000)
    return encode_frame(stream_id, MessageType.REQUEST, bytes(request), flags)


def response_frame(stream_id: int, payload: bytes = b"", code: int = 0, message: str = "") -> bytes:
    status = Status(code=code, message=message) if code or message else None
    return encode_frame(stream_id, MessageType.RESPONSE, bytes(pb.Response(status=status, payload=payload)))


def oversized_frame(stream_id: int, type: int = MessageType.REQUEST) -> bytes:
    return _header(MAX_MESSAGE + 1, stream_id, type) + b"\xab" * (MAX_MESSAGE + 1)


def _header(length: int, stream_id: int, type: int, flags: int = 0) -> bytes:
    return length.to_bytes(4, "big") + stream_id.to_bytes(4, "big") + bytes([type, flags])


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given offsets (those past its end are ignored)."""
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def only_response(data: bytes) -> tuple[int, pb.Response]:
    """The stream id and message of the one Response frame `data` must be."""
    (frame,) = FrameDecoder().feed(data)
    assert isinstance(frame, Frame)
    assert (frame.type, frame.flags) == (MessageType.RESPONSE, 0)
    return frame.stream_id, pb.Response.parse(frame.payload)


def error_of(data: bytes) -> tuple[int, Code, str]:
    stream_id, response = only_response(data)
    assert response.status is not None and response.payload == b""
    return stream_id, Code(response.status.code), response.status.message


# --- framing


def test_encode_frame_exact_bytes() -> None:
    frame = encode_frame(0x01020304, MessageType.RESPONSE, b"abc", flags=0x05)
    assert frame == b"\x00\x00\x00\x03" + b"\x01\x02\x03\x04" + b"\x02" + b"\x05" + b"abc"
    assert encode_frame(1, MessageType.REQUEST, b"") == b"\x00\x00\x00\x00\x00\x00\x00\x01\x01\x00"


def test_encode_frame_refuses_what_go_refuses() -> None:
    assert len(encode_frame(1, MessageType.DATA, bytes(MAX_MESSAGE))) == HEADER + MAX_MESSAGE
    with pytest.raises(TtrpcError) as err:
        encode_frame(1, MessageType.DATA, bytes(MAX_MESSAGE + 1))
    assert err.value.code == Code.RESOURCE_EXHAUSTED
    assert err.value.message == "message length 4194305 exceed maximum message size of 4194304"


FRAMES = [
    Frame(1, MessageType.REQUEST, 0, b"hello"),
    Frame(3, MessageType.REQUEST, 0, b""),
    Frame(2, MessageType.RESPONSE, 0, bytes(range(256)) * 20),
    Frame(0xFFFFFFFF, 0xEE, 0xFF, b"\x00"),  # unknown types and flags pass through; the layers above judge
]
WIRE = b"".join(encode_frame(f.stream_id, f.type, f.payload, f.flags) for f in FRAMES)


def test_decoder_many_frames_in_one_feed() -> None:
    assert FrameDecoder().feed(WIRE) == FRAMES


def test_decoder_byte_by_byte() -> None:
    decoder = FrameDecoder()
    out = [frame for i in range(len(WIRE)) for frame in decoder.feed(WIRE[i : i + 1])]
    assert out == FRAMES


OVERSIZED = _header(MAX_MESSAGE + 1, 5, MessageType.REQUEST, flags=0x7) + b"\xab" * (MAX_MESSAGE + 1)


@pytest.mark.parametrize("cut", [0, 3, 10, 11, 5000, len(OVERSIZED) - 1, len(OVERSIZED), len(OVERSIZED) + 3])
def test_oversized_frame_is_skipped_and_the_next_one_decoded(cut: int) -> None:
    decoder, wire = FrameDecoder(), OVERSIZED + request_frame(7)
    assert decoder.feed(wire[:cut]) + decoder.feed(wire[cut:]) == [
        OversizedFrame(5, MessageType.REQUEST, MAX_MESSAGE + 1),
        FrameDecoder().feed(request_frame(7))[0],
    ]


def test_oversized_body_is_not_buffered() -> None:
    """A 1 GiB claim is skipped chunk by chunk in constant memory, then reported once."""
    decoder = FrameDecoder()
    length, chunk = 1 << 30, b"\xab" * (1 << 20)
    assert decoder.feed(_header(length, 9, MessageType.REQUEST)) == []
    tracemalloc.start()
    try:
        for _ in range(length // len(chunk) - 1):
            assert decoder.feed(chunk) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    tail = chunk + request_frame(11)
    assert decoder.feed(tail) == [OversizedFrame(9, 1, length), FrameDecoder().feed(request_frame(11))[0]]


@FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=12))
def test_decoder_result_does_not_depend_on_chunking(data: bytes, cuts: list[int]) -> None:
    """Any bytes decode without error, and the same way however they are split."""
    whole = FrameDecoder().feed(data)
    decoder = FrameDecoder()
    assert [f for piece in split(data, cuts) for f in decoder.feed(piece)] == whole


# --- server


def test_server_hands_out_requests_and_encodes_answers() -> None:
    server = ServerConnection()
    request = pb.Request(
        service=PLUGIN,
        method="CreateContainer",
        payload=b"\x0a\x00",
        timeout_nano=2_000_000_000,
        metadata=[
            pb.KeyValue(key="a", value="1"),
            pb.KeyValue(key="b", value="2"),
            pb.KeyValue(key="a", value="3"),
        ],
    )
    wire = encode_frame(1, MessageType.REQUEST, bytes(request)) + request_frame(3, "Synchronize")
    first, second = server.receive(wire)
    assert first == IncomingRequest(
        1, PLUGIN, "CreateContainer", b"\x0a\x00", 2_000_000_000, {"a": "3", "b": "2"}
    )
    assert isinstance(second, IncomingRequest) and (second.stream_id, second.method) == (3, "Synchronize")
    assert server.in_flight == {1, 3}

    assert server.respond(1, b"\x12\x00") == encode_frame(1, MessageType.RESPONSE, b"\x12\x02\x12\x00")
    assert error_of(server.fail(3, Code.UNIMPLEMENTED, "method Synchronize")) == (
        3,
        Code.UNIMPLEMENTED,
        "method Synchronize",
    )
    assert server.in_flight == set()


def test_server_success_reply_omits_the_status() -> None:
    server = ServerConnection()
    server.receive(request_frame(1))
    assert only_response(server.respond(1, b"")) == (1, pb.Response())


def test_server_answers_each_request_once() -> None:
    server = ServerConnection()
    server.receive(request_frame(1))
    server.respond(1, b"")
    with pytest.raises(ValueError, match="stream 1 has no request"):
        server.fail(1, Code.INTERNAL, "again")
    with pytest.raises(ValueError, match="stream 3 has no request"):
        server.respond(3, b"")
    server.receive(request_frame(5))
    with pytest.raises(ValueError, match="other than OK"):
        server.fail(5, Code.OK, "")
    assert server.in_flight == {5}


def test_server_turns_a_reply_too_big_for_a_frame_into_resource_exhausted() -> None:
    server = ServerConnection()
    server.receive(request_frame(1))
    sid, code, message = error_of(server.respond(1, bytes(MAX_MESSAGE)))
    assert (sid, code) == (1, Code.RESOURCE_EXHAUSTED)
    assert message.startswith("message length 4194309 exceed maximum message size")


def test_server_cuts_long_status_messages() -> None:
    server = ServerConnection()
    server.receive(request_frame(1))
    assert error_of(server.fail(1, Code.UNKNOWN, "é" * MAX_MESSAGE))[2] == "é" * MAX_STATUS_MESSAGE


ODD = "StreamID must be odd for client initiated streams"
REUSED = "StreamID cannot be re-used and must increment"
INACTIVE = "StreamID is no longer active"


@pytest.mark.parametrize(
    ("wire", "answer"),
    [
        pytest.param(request_frame(2), (2, Code.INVALID_ARGUMENT, ODD), id="even-id"),
        pytest.param(request_frame(0), (0, Code.INVALID_ARGUMENT, ODD), id="id-0"),
        pytest.param(response_frame(4), (4, Code.INVALID_ARGUMENT, ODD), id="even-id-any-type"),
        pytest.param(request_frame(3), (3, Code.INVALID_ARGUMENT, REUSED), id="reused-id"),
        pytest.param(request_frame(1), (1, Code.INVALID_ARGUMENT, REUSED), id="lower-id"),
        pytest.param(
            encode_frame(9, MessageType.DATA, b"x"), (9, Code.INVALID_ARGUMENT, INACTIVE), id="data"
        ),
        pytest.param(
            request_frame(5, "Stream", flags=0x2),
            (5, Code.UNIMPLEMENTED, "method Stream: client streaming is not supported"),
            id="remote-open",
        ),
    ],
)
def test_server_answers_protocol_errors_like_go(wire: bytes, answer: tuple[int, Code, str]) -> None:
    server = ServerConnection()
    (request,) = server.receive(request_frame(3))
    assert isinstance(request, IncomingRequest)
    (reply,) = server.receive(wire)
    assert isinstance(reply, bytes) and error_of(reply) == answer
    assert server.in_flight == {3}  # the request being handled is untouched


def test_server_refuses_malformed_request_and_counts_its_id() -> None:
    server = ServerConnection()
    truncated = encode_frame(5, MessageType.REQUEST, b"\x0a\x05ab")  # service: 5 bytes promised, 2 sent
    (reply,) = server.receive(truncated)
    assert isinstance(reply, bytes)
    sid, code, message = error_of(reply)
    assert (sid, code) == (5, Code.INVALID_ARGUMENT)
    assert message.startswith("unmarshal request error: Request.service")
    (again,) = server.receive(request_frame(5))
    assert isinstance(again, bytes) and error_of(again)[2] == REUSED


def test_server_answers_oversized_request_and_stays_in_step() -> None:
    server = ServerConnection()
    # the next frame is decoded; an oversized request does not use up its id (as in Go)
    answer, request = server.receive(oversized_frame(7) + request_frame(7))
    assert isinstance(answer, bytes)
    assert error_of(answer) == (
        7,
        Code.RESOURCE_EXHAUSTED,
        "message length 4194305 exceed maximum message size of 4194304",
    )
    assert isinstance(request, IncomingRequest) and request.stream_id == 7


def test_server_ignores_what_go_ignores() -> None:
    server = ServerConnection()
    server.receive(request_frame(1))
    ignored = (
        response_frame(3)  # a response sent to a server
        + encode_frame(5, 0x7F, b"future")  # an unknown type
        + encode_frame(1, MessageType.DATA, b"x")  # data for a request being handled: one answer only
    )
    assert server.receive(ignored) == []
    assert server.ignored_frames == 3
    (request,) = server.receive(request_frame(3, flags=0x1))  # remote-closed: a unary call all the same
    assert isinstance(request, IncomingRequest) and request.stream_id == 3


JUNK = st.one_of(
    st.builds(  # frames with even ids, any type: each gets INVALID_ARGUMENT
        lambda sid, type_, payload: encode_frame(sid * 2, type_, payload),
        st.integers(0, 2**31 - 1),
        st.integers(0, 255),
        st.binary(max_size=40),
    ),
    st.builds(  # responses and unknown types with odd ids: ignored
        lambda sid, type_, payload: encode_frame(sid * 2 + 1, type_, payload),
        st.integers(0, 2**31 - 1),
        st.sampled_from([2, 4, 200]),
        st.binary(max_size=40),
    ),
)


@FUZZ
@given(st.lists(JUNK, max_size=8), st.binary(max_size=300))
def test_server_fuzz_junk_frames_leave_requests_intact(junk: list[bytes], garbage: bytes) -> None:
    """Junk frames between valid requests: the requests come out intact and in order, each even-id frame
    gets its INVALID_ARGUMENT in place; then arbitrary bytes never raise and only ever get error replies."""
    server = ServerConnection()
    wire, expected = b"", []
    for i, frame in enumerate(junk):
        sid = int.from_bytes(frame[4:8], "big")
        wire += frame + request_frame(2 * i + 1, f"M{i}")
        expected += [(sid, Code.INVALID_ARGUMENT)] if sid % 2 == 0 else []
        expected.append((2 * i + 1, f"M{i}"))
    out = server.receive(wire)
    assert [
        (r.stream_id, r.method) if isinstance(r, IncomingRequest) else error_of(r)[:2] for r in out
    ] == expected
    for item in server.receive(garbage):
        if isinstance(item, IncomingRequest):
            assert item.stream_id % 2 == 1 and item.stream_id > 2 * len(junk)
        else:
            assert error_of(item)[1] != Code.OK


# --- client


def test_client_numbers_streams_and_encodes_requests() -> None:
    client = ClientConnection()
    ids = []
    for method in ("RegisterPlugin", "UpdateContainers", "UpdateContainers"):
        sid, data = client.request(
            "nri.pkg.api.v1alpha1.Runtime", method, b"\x0a\x01x", timeout_nano=5, metadata={"k": "v"}
        )
        ids.append(sid)
        (frame,) = FrameDecoder().feed(data)
        assert isinstance(frame, Frame) and (frame.stream_id, frame.type, frame.flags) == (sid, 1, 0)
        request = pb.Request.parse(frame.payload)
        assert (request.service, request.method, request.payload) == (
            "nri.pkg.api.v1alpha1.Runtime",
            method,
            b"\x0a\x01x",
        )
        assert request.timeout_nano == 5 and [(kv.key, kv.value) for kv in request.metadata] == [("k", "v")]
    assert ids == [1, 3, 5] and client.pending == {1, 3, 5}


def test_client_refuses_a_request_too_big_without_using_an_id() -> None:
    client = ClientConnection()
    with pytest.raises(TtrpcError) as err:
        client.request(PLUGIN, "X", bytes(MAX_MESSAGE))
    assert err.value.code == Code.RESOURCE_EXHAUSTED
    assert client.request(PLUGIN, "X", b"")[0] == 1


def test_client_replies() -> None:
    client = ClientConnection()
    for _ in range(7):
        client.request(PLUGIN, "X", b"")
    wire = (
        response_frame(1, b"ok")
        + response_frame(3, b"ignored", Code.INVALID_ARGUMENT, "invalid plugin index")
        + response_frame(5, b"also ok", Code.OK, "")
        + response_frame(7, b"", 99, "from the future")
        + encode_frame(9, MessageType.RESPONSE, b"\x12\x09short")
        + encode_frame(11, MessageType.DATA, b"")
    )
    replies = client.receive(wire)
    assert [(r.stream_id, r.payload) for r in replies] == [(1, b"ok"), (3, None), (5, b"also ok")] + [
        (sid, None) for sid in (7, 9, 11)
    ]
    errors = [(r.error.code, r.error.message) for r in replies if r.error is not None]
    assert errors[:2] == [(Code.INVALID_ARGUMENT, "invalid plugin index"), (Code.UNKNOWN, "from the future")]
    assert errors[2][0] == Code.UNKNOWN and errors[2][1].startswith(
        "unmarshal response error: Response.payload"
    )
    assert errors[3] == (Code.UNKNOWN, 'unexpected "data" message received: protocol error')
    assert str(replies[1].error) == "INVALID_ARGUMENT: invalid plugin index"
    assert client.pending == {13}


def test_client_drops_frames_for_streams_nobody_waits_for() -> None:
    client = ClientConnection()
    client.request(PLUGIN, "X", b"")
    client.request(PLUGIN, "X", b"")
    client.abandon(1)
    stray = response_frame(1) + response_frame(2) + response_frame(5) + encode_frame(7, MessageType.DATA, b"")
    assert client.receive(stray + response_frame(3, b"late")) == [Reply(3, b"late", None)]
    assert client.dropped_frames == 4
    assert client.receive(response_frame(3)) == [] and client.dropped_frames == 5  # answered once only


def test_client_oversized_reply_fails_that_call_only() -> None:
    client = ClientConnection()
    client.request(PLUGIN, "X", b"")
    client.request(PLUGIN, "X", b"")
    first, second = client.receive(oversized_frame(1, MessageType.RESPONSE) + response_frame(3, b"fine"))
    assert first.error is not None and first.error.code == Code.RESOURCE_EXHAUSTED
    assert second == Reply(3, b"fine", None)


def test_client_and_server_talk() -> None:
    client, server = ClientConnection(), ServerConnection()
    sid, data = client.request(PLUGIN, "Configure", b"\x12\x02ok", timeout_nano=7, metadata={"a": "b"})
    (request,) = server.receive(data)
    assert request == IncomingRequest(sid, PLUGIN, "Configure", b"\x12\x02ok", 7, {"a": "b"})
    assert client.receive(server.respond(sid, b"\x10\x01")) == [Reply(sid, b"\x10\x01", None)]
    sid, data = client.request(PLUGIN, "Nope", b"")
    (request,) = server.receive(data)
    assert isinstance(request, IncomingRequest)
    (reply,) = client.receive(server.fail(sid, Code.UNIMPLEMENTED, "method Nope"))
    assert reply.error is not None and (reply.error.code, reply.error.message) == (
        Code.UNIMPLEMENTED,
        "method Nope",
    )


@FUZZ
@given(st.binary(max_size=400), st.integers(0, 5))
def test_client_fuzz_never_raises(garbage: bytes, calls: int) -> None:
    client = ClientConnection()
    for _ in range(calls):
        client.request(PLUGIN, "X", b"")
    replies = client.receive(garbage)
    assert all((r.payload is None) != (r.error is None) for r in replies)
    assert len({r.stream_id for r in replies}) == len(replies)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16383, 16384, 300_000])
def test_a_success_reply_is_encoded_as_betterproto2_would(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert success_response(payload) == bytes(pb.Response(payload=payload))
