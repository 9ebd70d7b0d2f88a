"""A grpclib codec that refuses malformed protobuf instead of letting betterproto2 half-parse it.

grpclib's default `ProtoCodec` decodes with `message_type.FromString`, which for betterproto2 classes
accepts truncated or mistyped bytes silently (see `vgpud.wire`). `StrictProtoCodec` checks the bytes
first and answers a malformed request with INVALID_ARGUMENT; the server keeps serving.
Use it for betterproto2 message types: `Server(handlers, codec=StrictProtoCodec())`.
"""

from __future__ import annotations

import betterproto2
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError

from vgpud.wire import MalformedMessage, parse_strict


class StrictProtoCodec(ProtoCodec):
    """`ProtoCodec` whose decode runs `vgpud.wire.check_message` before parsing."""

    def decode(self, data: bytes, message_type: type[betterproto2.Message]) -> betterproto2.Message:
        try:
            return parse_strict(data, message_type)
        except MalformedMessage as e:
            raise GRPCError(Status.INVALID_ARGUMENT, f"malformed {message_type.__name__}: {e}") from None
