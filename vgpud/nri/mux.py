"""NRI's connection multiplexer, sans-IO: frames in, per-connection byte chunks out; messages in, frames out.

One socket carries several logical connections (nri-protocol.md §2). A mux frame is an 8-byte header
(u32 big-endian ConnID, u32 big-endian payload length) and the payload. Frame boundaries mean nothing to
the ttrpc layer above: each logical connection is a byte stream, so the decoder hands payload bytes on as
they arrive (no frame is buffered whole) and the caller feeds them to that connection's ttrpc decoder.

Sending is where care is needed (§0 trap 1): the Go side reads each logical connection through a
4096-byte bufio.Reader, and its mux `conn.Read` fails with ENOMEM when one frame is larger than the
buffer it is asked to fill. A frame that starts a ttrpc message lands in that 4096-byte buffer; only the
rest of the message, read with a buffer the size of the message, may be larger. Hence `encode`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from vgpud.nri.ttrpc import HEADER as TTRPC_HEADER
from vgpud.nri.ttrpc import MAX_MESSAGE as TTRPC_MAX_MESSAGE

PLUGIN_CONN = 1
"""The runtime calls our Plugin service here; we are the ttrpc server."""
RUNTIME_CONN = 2
"""We call the runtime's Runtime service here; we are the ttrpc client."""

MUX_HEADER = 8
GO_READ_BUFFER = 4096
"""Size of the bufio.Reader the Go ttrpc channel reads each logical connection through."""
MAX_FRAME = 16 * 1024 * 1024
"""Sanity cap on an incoming frame. Go never sends more than one ttrpc message (<= 4 MiB + 10) per frame,
so a larger length means the byte stream is not mux framing (or is out of step): give up on it."""
MAX_MESSAGE = TTRPC_HEADER + TTRPC_MAX_MESSAGE
"""The largest ttrpc message, header included; Go's mux refuses to write a larger frame (EMSGSIZE)."""

_HEADER = struct.Struct(">II")
_MAX_CONN_ID = 0xFFFFFFFF


class MuxError(Exception):
    """The mux framing is lost; the connection must be closed."""


class MuxDecoder:
    """Splits the socket's byte stream into (conn_id, payload chunk) pieces, in arrival order.

    Chunks of consecutive frames for the same connection are joined. Frames for connections not in
    `conn_ids` (ConnID 0 is reserved and never one) are skipped as they stream by and counted in
    `dropped_frames`, as the Go mux does; they never disturb the other connections.
    """

    def __init__(self, conn_ids: Iterable[int] = (PLUGIN_CONN, RUNTIME_CONN), *, max_frame: int = MAX_FRAME):
        self.conn_ids = frozenset(conn_ids) - {0}
        self.max_frame = max_frame
        self.dropped_frames = 0
        self._header = bytearray()
        self._conn = 0  # connection of the frame being read; 0 while it is being dropped
        self._remaining = 0  # payload bytes of that frame still to come; 0: reading a header
        self._error: MuxError | None = None

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Decode `data`; raise `MuxError` (now and on every later call) once a frame length is absurd.

        Chunks decoded earlier in the same call are lost with the error: the connection is closing.
        """
        if self._error is not None:
            raise self._error
        pieces: list[tuple[int, list[bytes]]] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._remaining:
                take = min(self._remaining, end - pos)
                if self._conn:
                    chunk = data[pos : pos + take]
                    if pieces and pieces[-1][0] == self._conn:
                        pieces[-1][1].append(chunk)
                    else:
                        pieces.append((self._conn, [chunk]))
                pos += take
                self._remaining -= take
                continue
            take = min(MUX_HEADER - len(self._header), end - pos)
            self._header += data[pos : pos + take]
            pos += take
            if len(self._header) < MUX_HEADER:
                break
            conn_id, length = _HEADER.unpack(self._header)
            self._header.clear()
            if length > self.max_frame:
                self._error = MuxError(
                    f"mux frame for connection {conn_id} claims {length} bytes (more than {self.max_frame})"
                )
                raise self._error
            self._conn = conn_id if conn_id in self.conn_ids else 0
            self.dropped_frames += not self._conn
            self._remaining = length
        return [(conn_id, b"".join(chunks)) for conn_id, chunks in pieces]


def encode(conn_id: int, message: bytes) -> list[bytes]:
    """The mux frames (header included) that carry one whole ttrpc message to a Go peer.

    Up to 4096 bytes: one frame. Longer: the first 4096 bytes, then the rest in a second frame (trap 1).
    Never bytes of two messages in one frame, never more than two frames (the Go side queues at most 256
    frames per connection). The frames may be written back to back in one send.
    """
    if not 0 < conn_id <= _MAX_CONN_ID:
        raise ValueError(f"mux connection id {conn_id} is outside 1..{_MAX_CONN_ID}")
    if not message or len(message) > MAX_MESSAGE:
        raise ValueError(f"a ttrpc message has 1..{MAX_MESSAGE} bytes, not {len(message)}")
    if len(message) <= GO_READ_BUFFER:
        return [_HEADER.pack(conn_id, len(message)) + message]
    head, rest = message[:GO_READ_BUFFER], message[GO_READ_BUFFER:]
    return [_HEADER.pack(conn_id, len(head)) + head, _HEADER.pack(conn_id, len(rest)) + rest]
