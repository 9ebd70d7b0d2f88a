"""ttrpc, sans-IO: bytes of one logical connection in, frames and calls out; calls in, bytes out.

A frame is a 10-byte header (u32 big-endian payload length, u32 big-endian stream id, u8 type, u8 flags)
and the payload (nri-protocol.md §1). NRI makes unary calls only: a Request frame carrying a
`ttrpc.Request` message, answered by one Response frame carrying a `ttrpc.Response` on the same stream.

Protocol errors are handled the way containerd/ttrpc's Go server (v1.2, `server.go`) handles them, with
its status texts, so the runtime logs what it would log talking to a Go plugin; the connection is never
closed for them:

* a frame over 4 MiB: the body is skipped as it streams by (never buffered), the stream gets
  RESOURCE_EXHAUSTED, whatever its id or type;
* an even stream id (0 included), any frame type: INVALID_ARGUMENT;
* a Request whose id is not above the last one: INVALID_ARGUMENT (the last id stays);
* a Request whose protobuf is malformed: INVALID_ARGUMENT (its id counts as used);
* a Data frame: INVALID_ARGUMENT "no longer active" (no stream of ours accepts data; Go answers so,
  then trips over the missing stream), or ignored when it names a request still being handled, so that
  stream gets one answer;
* Response frames and unknown types with odd ids: ignored, for forward compatibility.

One choice differs from Go: a Request flagged remote-open (a client-streaming call, more Data to come)
gets UNIMPLEMENTED; Go's server would run a unary method on the first message alone. Remote-closed
(0x1, a server-streaming call) is accepted as unary: nothing more comes from the client.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import betterproto2

from vgpud._pb import ttrpc as pb
from vgpud._pb.google.rpc import Status
from vgpud.wire import MalformedMessage, parse_strict

MAX_MESSAGE = 4 * 1024 * 1024
"""Largest frame payload either side accepts (Go's `messageLengthMax`)."""
HEADER = 10
MAX_STATUS_MESSAGE = 16 * 1024
"""Status messages are cut to this many characters, so an error reply always fits in a frame."""

FLAG_REMOTE_CLOSED = 0x1
FLAG_REMOTE_OPEN = 0x2
FLAG_NO_DATA = 0x4

_HEADER = struct.Struct(">IIBB")
_MAX_STREAM_ID = 0xFFFFFFFF


class MessageType(IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


class Code(IntEnum):
    """google.rpc.Code, as carried in `Response.status.code`."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


_CODES = frozenset(Code)
_TYPE_NAMES = {t: t.name.lower() for t in MessageType}  # Go's messageType.String()


class TtrpcError(Exception):
    """A call's error status (received, or refused before sending)."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Frame:
    stream_id: int
    type: int  # a MessageType, or an unknown value a newer peer may send
    flags: int
    payload: bytes


@dataclass(frozen=True)
class OversizedFrame:
    """A frame whose payload was over `MAX_MESSAGE`; it was skipped, the connection is still in step."""

    stream_id: int
    type: int
    length: int


def encode_frame(stream_id: int, type: MessageType, payload: bytes, flags: int = 0) -> bytes:
    """Header + payload; a payload over `MAX_MESSAGE` raises RESOURCE_EXHAUSTED, as Go's sender does."""
    if len(payload) > MAX_MESSAGE:
        raise _oversized(len(payload))
    return _HEADER.pack(len(payload), stream_id, type, flags) + payload


class FrameDecoder:
    """Frames of one logical connection (one per mux ConnID). Any input is valid: it never raises."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._skip = 0  # bytes of an oversized payload still to be skipped
        self._skipped: OversizedFrame | None = None  # reported once its payload has gone by

    def feed(self, data: bytes) -> list[Frame | OversizedFrame]:
        out: list[Frame | OversizedFrame] = []
        if self._skip:
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            data = data[skipped:]
            if self._skip:
                return out
            assert self._skipped is not None
            out.append(self._skipped)
        buffer = self._buffer
        buffer += data
        while len(buffer) >= HEADER:
            length, stream_id, type_, flags = _HEADER.unpack_from(buffer)
            if length > MAX_MESSAGE:  # Go discards the body, then reports the stream
                skipped = min(length, len(buffer) - HEADER)
                del buffer[: HEADER + skipped]
                oversized = OversizedFrame(stream_id, type_, length)
                if skipped < length:
                    self._skip, self._skipped = length - skipped, oversized
                    break
                out.append(oversized)
                continue
            if len(buffer) < HEADER + length:
                break
            out.append(Frame(stream_id, type_, flags, bytes(buffer[HEADER : HEADER + length])))
            del buffer[: HEADER + length]
        return out


@dataclass(frozen=True)
class IncomingRequest:
    stream_id: int
    service: str  # full proto service name, e.g. "nri.pkg.api.v1alpha1.Plugin"
    method: str  # bare method name, e.g. "Configure"
    payload: bytes
    timeout_nano: int  # the caller's remaining deadline; 0: none
    metadata: dict[str, str]  # a key sent more than once keeps its last value (NRI sends none)


class ServerConnection:
    """The server half (NRI: conn 1, the runtime calls our Plugin service).

    `receive` yields the requests to handle and, in order with them, the bytes of error replies the
    connection answers by itself; every request it yields must get exactly one `respond` or `fail`.
    """

    def __init__(self) -> None:
        self._frames = FrameDecoder()
        self._last_stream_id = 0
        self._in_flight: set[int] = set()
        self.ignored_frames = 0

    @property
    def in_flight(self) -> frozenset[int]:
        """Streams of requests handed out and not answered yet."""
        return frozenset(self._in_flight)

    def receive(self, data: bytes) -> list[IncomingRequest | bytes]:
        out: list[IncomingRequest | bytes] = []
        for frame in self._frames.feed(data):
            item = self._accept(frame)
            if item is not None:
                out.append(item)
        return out

    def respond(self, stream_id: int, payload: bytes) -> bytes:
        """The success reply; one that would not fit in a frame becomes a RESOURCE_EXHAUSTED reply."""
        self._finish(stream_id)
        try:
            return encode_frame(stream_id, MessageType.RESPONSE, success_response(payload))
        except TtrpcError as err:
            return _error_response(stream_id, err.code, err.message)

    def fail(self, stream_id: int, code: Code, message: str) -> bytes:
        """The error reply: Response{status{code, message}}, no payload."""
        if code == Code.OK:
            raise ValueError("an error reply needs a code other than OK")
        self._finish(stream_id)
        return _error_response(stream_id, code, message)

    def _finish(self, stream_id: int) -> None:
        if stream_id not in self._in_flight:
            raise ValueError(f"stream {stream_id} has no request waiting for an answer")
        self._in_flight.remove(stream_id)

    def _accept(self, frame: Frame | OversizedFrame) -> IncomingRequest | bytes | None:
        """A request to hand out, an error reply to send, or None; Go's server checks in this order."""
        sid = frame.stream_id
        if isinstance(frame, OversizedFrame):
            err = _oversized(frame.length)
            return _error_response(sid, err.code, err.message)
        if sid % 2 == 0:
            return _error_response(
                sid, Code.INVALID_ARGUMENT, "StreamID must be odd for client initiated streams"
            )
        if frame.type == MessageType.DATA:
            if sid in self._in_flight:
                self.ignored_frames += 1
                return None
            return _error_response(sid, Code.INVALID_ARGUMENT, "StreamID is no longer active")
        if frame.type != MessageType.REQUEST:
            self.ignored_frames += 1
            return None
        if sid <= self._last_stream_id:
            return _error_response(
                sid, Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment"
            )
        self._last_stream_id = sid
        try:
            request = parse_strict(frame.payload, pb.Request)
        except MalformedMessage as err:
            return _error_response(sid, Code.INVALID_ARGUMENT, f"unmarshal request error: {err}")
        if frame.flags & FLAG_REMOTE_OPEN:
            return _error_response(
                sid, Code.UNIMPLEMENTED, f"method {request.method}: client streaming is not supported"
            )
        self._in_flight.add(sid)
        metadata = {kv.key: kv.value for kv in request.metadata}
        return IncomingRequest(
            sid, request.service, request.method, request.payload, request.timeout_nano, metadata
        )


@dataclass(frozen=True)
class Reply:
    """The outcome of one call: `payload` on success, else `error`."""

    stream_id: int
    payload: bytes | None
    error: TtrpcError | None


class ClientConnection:
    """The client half (NRI: conn 2, we call the runtime's Runtime service).

    Stream ids are odd and increasing from 1, per connection. Frames for streams with no call waiting
    (never started, answered, or abandoned) are dropped and counted in `dropped_frames`, as Go's client
    does ("received message on inactive stream").
    """

    def __init__(self) -> None:
        self._frames = FrameDecoder()
        self._next_stream_id = 1
        self._pending: set[int] = set()
        self.dropped_frames = 0

    @property
    def pending(self) -> frozenset[int]:
        """Streams of calls sent and not answered yet."""
        return frozenset(self._pending)

    def request(
        self,
        service: str,
        method: str,
        payload: bytes,
        *,
        timeout_nano: int = 0,
        metadata: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """Start a unary call: its stream id and the bytes to send. A request too big for a frame raises
        RESOURCE_EXHAUSTED without using up a stream id."""
        if self._next_stream_id > _MAX_STREAM_ID:
            raise TtrpcError(Code.RESOURCE_EXHAUSTED, "stream ids exhausted; open a new connection")
        request = pb.Request(
            service=service,
            method=method,
            payload=payload,
            timeout_nano=timeout_nano,
            metadata=[pb.KeyValue(key=k, value=v) for k, v in (metadata or {}).items()],
        )
        stream_id = self._next_stream_id
        data = encode_frame(stream_id, MessageType.REQUEST, bytes(request))
        self._next_stream_id += 2
        self._pending.add(stream_id)
        return stream_id, data

    def abandon(self, stream_id: int) -> None:
        """Stop waiting for a call (its caller gave up): a late answer is dropped like a stray one."""
        self._pending.discard(stream_id)

    def receive(self, data: bytes) -> list[Reply]:
        out = []
        for frame in self._frames.feed(data):
            if frame.stream_id not in self._pending:
                self.dropped_frames += 1
                continue
            self._pending.remove(frame.stream_id)
            out.append(_reply(frame))
        return out


def _reply(frame: Frame | OversizedFrame) -> Reply:
    """A waiting call's outcome from the frame on its stream (the first frame ends a unary call in Go)."""
    sid = frame.stream_id
    if isinstance(frame, OversizedFrame):
        return Reply(sid, None, _oversized(frame.length))
    if frame.type != MessageType.RESPONSE:
        name = _TYPE_NAMES.get(frame.type, "unknown")
        return Reply(
            sid, None, TtrpcError(Code.UNKNOWN, f'unexpected "{name}" message received: protocol error')
        )
    try:
        response = parse_strict(frame.payload, pb.Response)
    except MalformedMessage as err:
        return Reply(sid, None, TtrpcError(Code.UNKNOWN, f"unmarshal response error: {err}"))
    status = response.status
    if status is None or status.code == Code.OK:
        return Reply(sid, response.payload, None)
    code = Code(status.code) if status.code in _CODES else Code.UNKNOWN
    return Reply(sid, None, TtrpcError(code, status.message))


def _oversized(length: int) -> TtrpcError:
    return TtrpcError(
        Code.RESOURCE_EXHAUSTED, f"message length {length} exceed maximum message size of {MAX_MESSAGE}"
    )


#: `Response.payload`'s tag: field 2, length-delimited
_PAYLOAD_TAG = b"\x12"


def success_response(payload: bytes) -> bytes:
    """`bytes(pb.Response(payload=payload))`, written directly: a success reply is one bytes field,
    and betterproto2 took about a tenth of CreateContainer's Python time to encode it."""
    if not payload:
        return b""  # proto3 leaves an empty field out
    size, length = len(payload), bytearray()
    while size > 0x7F:
        length.append(size & 0x7F | 0x80)
        size >>= 7
    length.append(size)
    return _PAYLOAD_TAG + length + payload


def _response(stream_id: int, response: betterproto2.Message) -> bytes:
    return encode_frame(stream_id, MessageType.RESPONSE, bytes(response))


def _error_response(stream_id: int, code: Code, message: str) -> bytes:
    status = Status(code=int(code), message=message[:MAX_STATUS_MESSAGE])
    return _response(stream_id, pb.Response(status=status))
